"""An image size as a user writes it (``448x672``, height x width)."""

from __future__ import annotations

import re

from driftscope.errors import InputError


def parse_size(text: str) -> tuple[int, int]:
    """``"448x672"`` -> (448, 672) as (height, width): an image size as the geometry CLI takes it."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match:
        raise InputError(f"image size {text!r} is not HxW", "write sizes like 448x448 or 448x672 (height x width)")
    return int(match.group(1)), int(match.group(2))
