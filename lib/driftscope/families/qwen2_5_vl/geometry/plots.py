"""Qwen2.5-VL's geometry figures (notebook 03): windows over the image, the permutation, a wrong un-reorder, masks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patheffects import withStroke

from ...figures import draw_attention_mask
from .masks import audit_masks, bucket_masks
from .packing import pack_images
from .resize import ResizeSpec, smart_resize
from .windows import reverse_by_argsort, reverse_by_rank_scatter, window_layout

WINDOW_PX = 112


def _resized(image_path: str | Path, spec: ResizeSpec) -> tuple[np.ndarray, tuple[int, int, int]]:
    from PIL import Image

    with Image.open(image_path) as image:
        rgb = image.convert("RGB")
        height, width = smart_resize(rgb.height, rgb.width, spec)
        array = np.asarray(rgb.resize((width, height), Image.Resampling.BICUBIC))
    return array, (1, height // spec.patch_size, width // spec.patch_size)


def _merged_grid(grid: tuple[int, int, int], spec: ResizeSpec) -> tuple[int, int]:
    return grid[1] // spec.merge_size, grid[2] // spec.merge_size


def windows_over_image(image_path: str | Path, spec: ResizeSpec = ResizeSpec()) -> Figure:
    """The resized image with each attention window outlined and numbered in window order."""
    image, grid = _resized(image_path, spec)
    gh, gw = _merged_grid(grid, spec)
    layout = window_layout([grid], spec.merge_size, WINDOW_PX, spec.patch_size)
    cell = spec.patch_size * spec.merge_size
    owner = np.empty(gh * gw, dtype=int)
    bounds = layout.cu_window_seqlens // (spec.merge_size**2)
    for number, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        owner[layout.window_index[start:stop]] = number
    figure = Figure(figsize=(5, 5 * image.shape[0] / image.shape[1] + 0.4), layout="constrained")
    axis = figure.subplots()
    axis.imshow(image)
    axis.imshow(
        owner.reshape(gh, gw) % 2,
        cmap="gray",
        alpha=0.15,
        extent=(0, image.shape[1], image.shape[0], 0),
        interpolation="nearest",
    )
    for number in range(len(bounds) - 1):
        cells = np.argwhere(owner.reshape(gh, gw) == number)
        (y0, x0), (y1, x1) = cells.min(0), cells.max(0) + 1
        axis.add_patch(_rect(x0 * cell, y0 * cell, (x1 - x0) * cell, (y1 - y0) * cell))
        axis.text(
            (x0 + x1) * cell / 2,
            (y0 + y1) * cell / 2,
            str(number),
            color="white",
            ha="center",
            va="center",
            fontsize=9,
            fontweight="bold",
            path_effects=[withStroke(linewidth=2.5, foreground="black")],  # legible on light and dark cells
        )
    axis.set_title(
        f"{Path(image_path).name}: {image.shape[0]}x{image.shape[1]}, grid {list(grid)}, "
        f"{len(bounds) - 1} windows ({sum(layout.partial_windows)} padded)",
        fontsize=9,
    )
    axis.set_axis_off()
    return figure


def _rect(x, y, w, h):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), w, h, fill=False, edgecolor="yellow", linewidth=1.5)


def permutation_picture(image_path: str | Path, spec: ResizeSpec = ResizeSpec()) -> Figure:
    """Left: each merged token's window-order position at its raster place. Right: the permutation matrix."""
    _, grid = _resized(image_path, spec)
    gh, gw = _merged_grid(grid, spec)
    index = window_layout([grid], spec.merge_size, WINDOW_PX, spec.patch_size).window_index
    rank = reverse_by_argsort(index)  # rank[raster] = window-order position
    figure = Figure(figsize=(10, 4.2), layout="constrained")
    left, right = figure.subplots(1, 2)
    shown = left.imshow(rank.reshape(gh, gw), cmap="viridis", interpolation="nearest")
    figure.colorbar(shown, ax=left, label="window-order position")
    left.set_title("window-order position of each merged token (raster layout)", fontsize=9)
    matrix = np.zeros((len(index), len(index)))
    matrix[np.arange(len(index)), index] = 1
    right.imshow(matrix, cmap="Greys", interpolation="nearest")
    right.set_xlabel("raster token")
    right.set_ylabel("window-order position")
    right.set_title("permutation matrix", fontsize=9)
    return figure


def misplaced_over_image(image_path: str | Path, spec: ResizeSpec = ResizeSpec()) -> Figure:
    """Tokens a ``reverse[orig] = rank`` un-reorder puts in the wrong place, marked red on the image."""
    image, grid = _resized(image_path, spec)
    gh, gw = _merged_grid(grid, spec)
    index = window_layout([grid], spec.merge_size, WINDOW_PX, spec.patch_size).window_index
    figure = Figure(figsize=(10, 4.6), layout="constrained")
    axes = figure.subplots(1, 2)
    tokens = np.arange(len(index))
    for axis, (name, reverse) in zip(
        axes,
        (("argsort (correct)", reverse_by_argsort(index)), ("reverse[orig] = rank", reverse_by_rank_scatter(index))),
        strict=True,
    ):
        wrong = (tokens[index][reverse] != tokens).reshape(gh, gw)
        axis.imshow(image)
        overlay = np.zeros((gh, gw, 4))
        overlay[wrong] = (1.0, 0.0, 0.0, 0.55)
        axis.imshow(overlay, extent=(0, image.shape[1], image.shape[0], 0), interpolation="nearest")
        axis.set_title(f"{name}: {int(wrong.sum())}/{len(index)} merged tokens misplaced", fontsize=9)
        axis.set_axis_off()
    return figure


def mask_pictures(grids: list[tuple[int, int, int]], rows: int, spec: ResizeSpec = ResizeSpec()) -> Figure:
    """Full and window attention masks of a packed bucket (the one mask convention), image bounds marked red."""
    bucket = pack_images(grids, rows, spec.merge_size, WINDOW_PX, spec.patch_size)
    full, window = bucket_masks(bucket)
    figure = Figure(figsize=(11, 5), layout="constrained")
    for axis, (name, mask) in zip(
        figure.subplots(1, 2), (("full attention", full), ("window attention", window)), strict=True
    ):
        draw_attention_mask(
            axis, mask, f"{name}: {bucket.active} active rows, {bucket.rows - bucket.active} padding (red: images)"
        )
        for bound in bucket.cu_seqlens[1:]:
            axis.axhline(bound - 0.5, color="red", linewidth=0.6)
            axis.axvline(bound - 0.5, color="red", linewidth=0.6)
    return figure


def mask_audit_frame(grids: list[tuple[int, int, int]], rows: int, spec: ResizeSpec = ResizeSpec()):
    import pandas as pd

    bucket = pack_images(grids, rows, spec.merge_size, WINDOW_PX, spec.patch_size)
    full, window = bucket_masks(bucket)
    return pd.DataFrame(audit_masks(full, window, bucket).rows())
