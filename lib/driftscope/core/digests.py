"""Content digests of files and directories (a checkpoint, a tap file), remembered by their ``stat``.

Hashing a multi-GiB checkpoint on every run would cost seconds, so :func:`tree_digest` keeps each file's
SHA-256 in a small JSON memo keyed by the file's resolved path, size, modification time and inode: a file
that changes (or is replaced) is hashed again, one that does not is not. The memo is a cache only (written
atomically; concurrent writers may drop each other's entries, which costs a re-hash, never a wrong digest).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from driftscope.core.atomic import write_json_atomic

CHUNK = 1 << 22


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes (read in 4 MiB chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        while count := handle.readinto(buffer):
            digest.update(view[:count])
    return digest.hexdigest()


def _stat_key(path: Path) -> str:
    info = path.stat()
    return f"{path.resolve()}|{info.st_size}|{info.st_mtime_ns}|{info.st_ino}"


def tree_digest(root: Path, memo: Path | None = None) -> str:
    """One digest of every regular file under ``root`` (its relative name and bytes; links followed), or of
    ``root`` itself when it is a file. ``memo``: the JSON file remembering each file's hash by its ``stat``."""
    root = Path(root)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    known: dict[str, str] = {}
    if memo is not None:
        try:
            loaded = json.loads(Path(memo).read_text())
            known = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            known = {}
    total, changed = hashlib.sha256(), False
    for path in files:
        key = _stat_key(path)
        value = known.get(key)
        if not isinstance(value, str):
            value = known[key] = file_sha256(path)
            changed = True
        name = path.name if path == root else path.relative_to(root).as_posix()
        total.update(f"{name}\0{value}\n".encode())
    if memo is not None and changed:
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
