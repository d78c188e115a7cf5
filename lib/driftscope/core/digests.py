"""Content digests of files and directories (a checkpoint, a tap file), remembered by their ``stat``.

Hashing a multi-GiB checkpoint on every run would cost seconds, so :func:`tree_digest` keeps each file's
SHA-256 in a memo (this process's, and a small JSON file) keyed by the file's resolved path, device, inode, size,
modification time and status-change time (``st_ctime``): a file that changes (or is replaced) is hashed again,
one that does not is not. The modification time alone is not enough: ``cp -p``, ``touch -r`` and reproducible
archives restore it after rewriting the bytes, but no user call sets the status-change time, which every write,
rename or ``utime`` moves. Each memo entry is sealed (``core.seal``), so a memo file rewritten to vouch for other
bytes is ignored. The memo is a cache only (written atomically; concurrent writers may drop each other's
entries, which costs a re-hash, never a wrong digest).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from driftscope.core.atomic import write_json_atomic
from driftscope.core.seal import holds, seal

CHUNK = 1 << 22
#: this process's memo: stat key -> SHA-256 (a file hashed once per process even without a memo file)
_known: dict[str, str] = {}


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes (read in 4 MiB chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        while count := handle.readinto(buffer):
            digest.update(view[:count])
    return digest.hexdigest()


#: a file whose status changed less than this long before it was hashed is not remembered: timestamps are
#: coarse (a kernel tick), so a rewrite within the same tick would leave its stat key unchanged ("racy git")
RACY_NS = 2_000_000_000


def _stat_key(path: Path) -> tuple[str, int]:
    """(the file's stat key, its status-change time in ns)."""
    info = path.stat()
    key = f"{path.resolve()}|{info.st_dev}|{info.st_ino}|{info.st_size}|{info.st_mtime_ns}|{info.st_ctime_ns}"
    return key, info.st_ctime_ns


def _load_memo(memo: Path | None) -> dict:
    if memo is None:
        return {}
    try:
        loaded = json.loads(Path(memo).read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _sealed(memo: dict, key: str) -> str | None:
    """The memo file's SHA-256 for a stat key, when its seal holds."""
    entry = memo.get(key)
    if isinstance(entry, dict) and isinstance(entry.get("sha256"), str):
        if holds([key, entry["sha256"]], entry.get("seal")):
            return entry["sha256"]
    return None


def content_sha256(path: Path, memo: dict | None = None) -> str:
    """A file's SHA-256, hashed once per content: remembered by its stat key in this process and in ``memo`` (a
    loaded memo file, which gains the entry), unless the file changed too recently to be told apart by it."""
    path = Path(path)
    key, changed = _stat_key(path)
    value = _known.get(key) or (None if memo is None else _sealed(memo, key))
    if value is None:
        value = file_sha256(path)
        if time.time_ns() - changed < RACY_NS:
            return value
    _known[key] = value
    if memo is not None and _sealed(memo, key) != value:
        memo[key] = {"sha256": value, "seal": seal([key, value])}
    return value


def tree_digest(root: Path, memo: Path | None = None) -> str:
    """One digest of every regular file under ``root`` (its relative name and bytes; links followed), or of
    ``root`` itself when it is a file. ``memo``: the JSON file remembering each file's hash by its ``stat``."""
    root = Path(root)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    known = _load_memo(memo)
    before = dict(known)
    total = hashlib.sha256()
    for path in files:
        value = content_sha256(path, known)
        name = path.name if path == root else path.relative_to(root).as_posix()
        total.update(f"{name}\0{value}\n".encode())
    if memo is not None and known != before:
        try:
            write_json_atomic(Path(memo), known)
        except Exception:  # noqa: BLE001 - a memo that cannot be written costs a re-hash next time, nothing else
            pass
    return total.hexdigest()


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name the same file (one inode)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
