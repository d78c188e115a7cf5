"""A checkpoint directory written atomically: staged next to its place, then renamed into it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: files of a source checkpoint that travel with a rewritten copy (tokenizer, processor, templates)
SIDE_FILES = ("*.json", "*.jinja", "*.txt", "*.model")
NOT_COPIED = ("config.json", "model.safetensors.index.json", "driftscope_fixture.json", "driftscope_quant.json")


@contextmanager
def staged_directory(out_dir: str | Path, copy_from: str | Path | None = None, replace: bool = True) -> Iterator[Path]:
    """Yield an empty staging directory (with ``copy_from``'s side files); it replaces ``out_dir`` on success.

    With ``replace=False`` a directory another process put at ``out_dir`` meanwhile is kept and the staged
    one dropped (a cache entry: both hold the same)."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if copy_from is not None:
            for pattern in SIDE_FILES:
                for file in sorted(Path(copy_from).glob(pattern)):
                    if file.name not in NOT_COPIED:
                        shutil.copy2(file, tmp / file.name)
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if replace:
        shutil.rmtree(out_dir, ignore_errors=True)
    try:
        tmp.rename(out_dir)
    except OSError:
        if replace or not out_dir.exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
