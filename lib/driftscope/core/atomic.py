"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Files are created with the permissions of the umask (0644 under umask 022), as ``open`` would: the
temporary file is made with mode 0666 and the kernel applies the umask (``mkstemp`` would give 0600).
A run killed mid-write leaves ``.<name>.<run id>-<random>.tmp`` (``core.names.temporary_path``), which the next run
into the directory removes (only its own).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from driftscope.core.names import temporary_path
from driftscope.errors import output_error


def _create_temporary(path: Path) -> tuple[int, Path]:
    """A new file next to ``path``, opened for writing, with the umask's permissions."""
    while True:
        tmp = temporary_path(path)
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and ``os.replace``."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = _create_temporary(path)
    except OSError as err:
        raise output_error(err, path) from err
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise output_error(err, path) from err
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: Path, data: Any) -> Path:
    """``data`` as indented JSON, written atomically (NaN and infinities become null)."""
    return write_text_atomic(path, json.dumps(_finite(data), indent=1, sort_keys=False) + "\n")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def place_file_atomic(source: Path, path: Path) -> Path:
    """``path`` becomes ``source``'s bytes at once: a hard link when both are on one filesystem (no copy),
    else a copy, made under a temporary name in ``path``'s folder and renamed into place."""
    import shutil

    source, path = Path(source), Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = temporary_path(path)
        if not tmp.exists():
            break
    try:
        try:
            os.link(source, tmp)
        except OSError:  # another filesystem, or one without hard links
            shutil.copyfile(source, tmp)
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise output_error(err, path) from err
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
