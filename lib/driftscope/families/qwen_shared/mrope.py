"""M-RoPE position ids for a prompt with images and videos: text runs count up by one, a vision run's merged
tokens take (t, h, w) positions offset by the running position (its temporal positions stepped by the run's
time interval: 1 for an image, ``tokens_per_second * second_per_grid_t`` for a Qwen2.5-VL video), and the next
text starts after the run's largest spatial extent (transformers 5.24's ``get_rope_index``)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

import numpy as np

from ...errors import InputError


def mrope_positions(
    token_types: Sequence[int],
    image_grids: Sequence[Sequence[int]],
    spatial_merge_size: int = 2,
    time_intervals: Sequence[float] | None = None,
) -> tuple[np.ndarray, int]:
    """``token_types``: 0 for text, 1 for an image token, 2 for a video token, per prompt position; one grid (in
    patches) per vision run, in prompt order, and optionally its temporal step (default 1).

    Returns ``(positions [3, len], rope_delta)`` where ``rope_delta = max position + 1 - len``.
    """
    grids = [tuple(int(v) for v in grid) for grid in image_grids]
    steps = iter(list(time_intervals) if time_intervals is not None else [1] * len(grids))
    grids = iter(grids)
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
        times = np.trunc(np.arange(t) * float(next(steps, 1))).astype(np.int64)  # torch's .long() of the product
        tt, hh, ww = np.meshgrid(times, np.arange(gh), np.arange(gw), indexing="ij")
        parts.append(np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + current)
        current += max(h, w) // spatial_merge_size
    positions = np.concatenate(parts, axis=1) if parts else np.zeros((3, 0), dtype=np.int64)
    delta = int(positions.max()) + 1 - positions.shape[1] if positions.size else 0
    return positions.astype(np.int64), delta


def prompt_positions(text, grid_thw, spatial_merge_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(vision slots [seq] mask, positions [3, seq], rope_delta) of a Qwen prompt: the grids and time steps its
    prompt builder recorded (``TextInputs.position_grids``), else the images' grids."""
    grids = text.position_grids if text.position_grids is not None else np.asarray(grid_thw).tolist()
    types = np.asarray(text.mm_token_type_ids)
    positions, delta = mrope_positions(types.tolist(), grids, spatial_merge_size, text.time_intervals)
    return np.asarray(text.vision_slots), positions, delta
