"""Seals: what vouches for a cache entry does not live only beside the data it vouches for.

A cache entry records its files' SHA-256; anyone who rewrites the data can rewrite that record too. A seal is an
HMAC-SHA256 of the record under a key kept outside every cache folder: ``$DRIFTSCOPE_SEAL_KEY`` (a file), else
``$XDG_CONFIG_HOME/driftscope/seal.key``, else ``~/.config/driftscope/seal.key``, made once with 32 random bytes
and mode 0600. An entry whose seal does not hold was not written by driftscope under this key: it is refused
(and captured again). Machines that share a cache (batch workers) share the key file, e.g. through the variable.
Where no key can be kept (a read-only home), a key of this process alone is used: nothing another process
stored verifies, which costs reuse, never a wrong answer.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any

KEY_ENV = "DRIFTSCOPE_SEAL_KEY"
_process_key: bytes | None = None
_keys: dict[Path, bytes] = {}


def key_path() -> Path:
    """The key file: ``$DRIFTSCOPE_SEAL_KEY``, else ``driftscope/seal.key`` in the user's configuration folder."""
    given = os.environ.get(KEY_ENV, "").strip()
    if given:
        return Path(given).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME", "").strip()
    return (Path(config) if config else Path.home() / ".config") / "driftscope" / "seal.key"


def _read_or_make(path: Path) -> bytes:
    """The key in ``path``, made there first when there is none (created whole: written aside, then linked in)."""
    try:
        return bytes.fromhex(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32) + "\n")
        try:
            os.link(tmp, path)  # fails when another process made the key first: theirs is kept
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)
    return bytes.fromhex(path.read_text().strip())


def key() -> bytes:
    """The sealing key (see the module's docstring for where it lives)."""
    global _process_key
    path = key_path()
    if path in _keys:
        return _keys[path]
    try:
        value = _read_or_make(path)
        if len(value) < 16:
            raise ValueError("too short")
    except (OSError, ValueError):
        if _process_key is None:
            _process_key = secrets.token_bytes(32)
        return _process_key
    _keys[path] = value
    return value


def _canonical(payload: Any) -> bytes:
    return json.dumps(payload, sort_keys=True, default=str, separators=(",", ":")).encode()


def seal(payload: Any) -> str:
    """The seal of ``payload`` (any JSON-able value): an HMAC-SHA256 under :func:`key`, in hex."""
    return hmac.new(key(), _canonical(payload), hashlib.sha256).hexdigest()


def holds(payload: Any, value: object) -> bool:
    """Whether ``value`` is the seal of ``payload``."""
    return isinstance(value, str) and hmac.compare_digest(seal(payload), value)
