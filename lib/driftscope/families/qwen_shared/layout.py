"""Where each image's token rows sit in the image, for the spatial error maps: the Qwen processors' order."""

from __future__ import annotations

import numpy as np

from driftscope.taps.tapset import TapSet

from ..base import ImageTokens
from .grids import position_ids


def token_layout(reference: TapSet, unit: str | None, plan_meta: dict) -> list[ImageTokens]:
    """Per image, where its rows sit: patch rows in processor (merge-block-major) order on the patch grid,
    merged rows in raster order on the merged grid (rows in raster order, i.e. after any window un-reorder)."""
    merge = int(plan_meta.get("spatial_merge_size", 2))
    grids = np.asarray(reference["inputs.grid_thw"]).reshape(-1, 3)
    layout, start = [], 0
    for t, h, w in (tuple(int(v) for v in grid) for grid in grids):
        if unit == "merged":
            shape = (h // merge, w // merge)
            cells = np.stack(np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij"), -1).reshape(-1, 2)
            count = t * shape[0] * shape[1]
        else:
            shape, cells, count = (h, w), position_ids([[1, h, w]], merge), t * h * w
        layout.append(ImageTokens(start, start + count, shape, cells))
        start += count
    return layout
