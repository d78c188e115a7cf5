"""Run names and runtime labels are labels, not paths: the one mapping from them to file and directory names.

A name keeps ``A-Z a-z 0-9 . _ -``; ``:`` becomes ``-`` (``mlx:f16`` -> ``mlx-f16``). Any other character
(``/``, ``..``, ``#``, ``?``, ``%``, spaces, ...) becomes ``-`` too, leading dots and dashes are dropped, and
then a short digest of the original name is appended, so two different names never share a directory and
nothing can point outside the output root. Links to these directories are URL-encoded all the same.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from urllib.parse import quote

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_LENGTH = 80
#: What a run killed mid-write leaves: a TapSet's tensors before their rename, and the atomic writer's temporaries.
PARTIAL_PATTERNS = ("*.partial", "*.partial.old", ".*.tmp")


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


def remove_partial_files(out: Path) -> list[Path]:
    """Delete the partial files a killed run left under ``out``; returns what was removed."""
    removed = []
    for pattern in PARTIAL_PATTERNS:
        for path in Path(out).rglob(pattern):
            if path.is_file():
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed
