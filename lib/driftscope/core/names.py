"""Run names and runtime labels are labels, not paths: the one mapping from them to file and directory names.

A name keeps ``A-Z a-z 0-9 . _ -``; ``:`` becomes ``-`` (``mlx:f16`` -> ``mlx-f16``). Any other character
(``/``, ``..``, ``#``, ``?``, ``%``, spaces, ...) becomes ``-`` too, leading dots and dashes are dropped, and
then a short digest of the original name is appended, so two different names never share a directory and
nothing can point outside the output root. Links to these directories are URL-encoded all the same.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from urllib.parse import quote

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_LENGTH = 80
#: the run id of the investigation this context writes for (None: no run's): its partial files carry it
_RUN_ID: ContextVar[str | None] = ContextVar("driftscope_run_id", default=None)


def safe_name(name: str) -> str:
    """``name`` as one safe file or directory name (the same name always maps to the same result)."""
    text = str(name)
    plain = text.replace(":", "-")
    cleaned = _UNSAFE.sub("-", plain).lstrip(".-")[:MAX_LENGTH]
    if cleaned == plain and cleaned:
        return cleaned
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{cleaned.rstrip('.-') or 'run'}-{digest}"


def url_path(*parts: str) -> str:
    """A relative link to ``parts`` (directory and file names), each URL-encoded."""
    return "/".join(quote(part, safe="") for part in parts)


def new_run_id() -> str:
    """A fresh run id (16 hex digits): the name every partial file of one investigation carries."""
    return secrets.token_hex(8)


@contextmanager
def writing_for(run_id: str) -> Iterator[None]:
    """Partial files written in this context (a TapSet's tensors before their rename, the atomic writer's
    temporaries) carry ``run_id`` in their names, so the next run into the directory removes exactly those."""
    token = _RUN_ID.set(run_id)
    try:
        yield
    finally:
        _RUN_ID.reset(token)


def current_run_id() -> str | None:
    """The run id this context writes for (None: none)."""
    return _RUN_ID.get()


def partial_path(path: Path) -> Path:
    """Where a file is written before it takes ``path``'s name: ``<name>.<run id>.partial``."""
    run_id = _RUN_ID.get()
    return path.with_name(f"{path.name}.{run_id}.partial" if run_id else f"{path.name}.partial")


def temporary_path(path: Path) -> Path:
    """A fresh temporary name next to ``path``: ``.<name>.<run id>-<random>.tmp``."""
    run_id = _RUN_ID.get()
    return path.with_name(f".{path.name}.{run_id + '-' if run_id else ''}{secrets.token_hex(4)}.tmp")


def remove_partial_files(out: Path, run_id: str | None) -> list[Path]:
    """Delete the partial files the run ``run_id`` (one that was killed) left under ``out``, and nothing else: only
    names that carry its id, as :func:`partial_path` and :func:`temporary_path` make them (a file of the user's, or
    of another run, is never matched by a pattern). Returns what was removed."""
    if not run_id or not re.fullmatch(r"[0-9a-f]{16}", run_id):
        return []
    own = re.compile(rf"(.+\.{run_id}\.partial(\.old)?|\..+\.{run_id}-[0-9a-f]{{8}}\.tmp)")
    removed = []
    for folder, _, files in os.walk(out, followlinks=False):
        for name in files:
            path = Path(folder) / name
            if own.fullmatch(name) and path.is_file() and not path.is_symlink():
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed
