"""M-RoPE position ids for a prompt with images: text runs count up by one, an image's merged
tokens take (t, h, w) positions offset by the running position, and the next text starts after
the image's largest spatial extent."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

import numpy as np

from ...errors import InputError


def mrope_positions(
    token_types: Sequence[int], image_grids: Sequence[Sequence[int]], spatial_merge_size: int = 2
) -> tuple[np.ndarray, int]:
    """``token_types``: 0 for text, 1 for an image token, per prompt position; grids in patches.

    Returns ``(positions [3, len], rope_delta)`` where ``rope_delta = max position + 1 - len``.
    """
    grids = iter([tuple(int(v) for v in grid) for grid in image_grids])
    parts, current = [], 0
    for kind, run in groupby(token_types):
        length = len(list(run))
        if kind == 0:
            parts.append(np.broadcast_to(np.arange(length) + current, (3, length)))
            current += length
            continue
        try:
            t, h, w = next(grids)
        except StopIteration:
            raise InputError("the prompt has more image-token runs than images", "pass one grid per image") from None
        gh, gw = h // spatial_merge_size, w // spatial_merge_size
        if t * gh * gw != length:
            raise InputError(
                f"an image-token run of {length} tokens does not match grid {[t, h, w]} ({t * gh * gw} merged tokens)",
                "make the prompt's image tokens match the grids",
            )
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(gh), np.arange(gw), indexing="ij")
        parts.append(np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + current)
        current += max(h, w) // spatial_merge_size
    positions = np.concatenate(parts, axis=1) if parts else np.zeros((3, 0), dtype=np.int64)
    delta = int(positions.max()) + 1 - positions.shape[1] if positions.size else 0
    return positions.astype(np.int64), delta
