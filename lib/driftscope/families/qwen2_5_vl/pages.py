"""What the generic views, the geometry notebook and the geometry CLI ask of Qwen2.5-VL: the view hooks,
the family's sentences on the pages (``PROSE``), and the geometry figures of notebook 03 (windows over the image,
the permutation, a wrong un-reorder, masks; matplotlib is imported only when a figure is drawn)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from driftscope.core.markup import text
from driftscope.inputs.image_size import parse_size
from driftscope.inputs.images import image_size, same_pixels

from ..base import GeometryClaim, Section
from ..figures import draw_attention_mask
from ..qwen_shared.layout import token_layout  # noqa: F401 (a view hook of this family)
from ..qwen_shared.tower import tower_axis_sizes
from .geometry import (
    audit_masks,
    audit_unreorder,
    bucket_masks,
    pack_images,
    reverse_by_argsort,
    reverse_by_rank_scatter,
    window_layout,
)
from .inputs import WINDOW_SIZE, ResizeSpec, bucket_summary, format_text, grid_for, image_rows, smart_resize

if TYPE_CHECKING:
    from matplotlib.figure import Figure


# What the generic views, the geometry notebook and the geometry CLI ask of Qwen2.5-VL.

#: Qwen2.5-VL's tower sizes where a config is silent (the released 3B's).
RELEASED_SIZES = {"hidden_size": 1280, "patch_size": 14, "intermediate_size": 3420, "out_hidden_size": 2048}


def input_overlay(inputs: dict, image: int) -> tuple[int | None, str]:
    """(attention window side in resized pixels, caption) of one input image of a report's ``inputs``."""
    window = int(inputs.get("window_px", 112))
    height, width = inputs["resized"][image]
    windows = -(-height // window) * -(-width // window)
    return window, f"{height}x{width}, grid {inputs['grid_thw'][image]}, {windows} window(s)"


def geometry_claims(image_paths: list[Path], checkpoint: str | Path | None = None) -> list[GeometryClaim]:
    """Could these images (their grids under the checkpoint's resize) reveal a wrong un-reorder, a wrong window
    permutation or schedule, or attention leaking across packed images?"""
    spec = ResizeSpec.from_checkpoint(checkpoint)
    grids = [grid_for(*image_size(path), spec) for path in image_paths]
    layout = window_layout(grids, spec.merge_size, WINDOW_SIZE, spec.patch_size)
    audit = audit_unreorder(grids, spec.merge_size, WINDOW_SIZE, spec.patch_size)
    windows = list(layout.windows_per_image)
    shown = ", ".join(f"{h * spec.patch_size}x{w * spec.patch_size}" for _, h, w in grids)
    involution = (
        f"the window permutation of {shown} is an involution: applying it twice restores the order, so "
        "`reverse[orig] = rank` misplaces no token (add e.g. a 336x336 image)"
    )
    leaks = len(grids) > 1 and not same_pixels(image_paths)
    leak = (
        "one image: there is nothing to leak across (pack two different images)"
        if len(grids) < 2
        else "the packed images are identical: attending across copies changes nothing"
        if same_pixels(image_paths)
        else f"{len(grids)} different images packed: a leak mixes their tokens"
    )
    return [
        GeometryClaim(
            "a wrong un-reorder (`reverse[orig] = rank` instead of argsort)",
            not audit.involution,
            involution
            if audit.involution
            else f"it misplaces {audit.misplaced_by_rank_scatter} of {audit.merged_tokens} merged tokens",
            ("rank_scatter_unreorder",),
        ),
        GeometryClaim(
            "a wrong window permutation (windows of consecutive raster tokens instead of 2-D tiles)",
            not audit.identity,
            f"windows per image {windows}: "
            + (
                "window order differs from raster order"
                if not audit.identity
                else "window order is raster order (one window across each image), so the permutation is the "
                "identity (use an image over 112 px wide)"
            ),
            ("identity_window_permutation",),
        ),
        GeometryClaim(
            "a wrong window schedule (full attention in the window blocks)",
            any(n > 1 for n in windows),
            f"windows per image {windows}: "
            + (
                "a window block sees less than the whole image"
                if any(n > 1 for n in windows)
                else "one window each, so a window is the whole image (use an image over 112 px on a side)"
            ),
            ("full_attention_everywhere",),
        ),
        GeometryClaim("attention leaking across packed images", leaks, leak, ("cross_image_leak",)),
    ]


def _bucket_rows(grids: list[tuple[int, int, int]], requested: int | None) -> int:
    """``requested`` patch rows when they hold the images, else enough for them plus a padded tail."""
    needed = sum(t * h * w for t, h, w in grids)
    if requested is not None and requested >= needed:
        return requested
    return needed + (-needed % 64 or 64)


def geometry_sections(
    image_paths: list[Path],
    checkpoint: str | Path | None = None,
    bucket_images: list[str] | None = None,
    bucket_rows: int | None = None,
) -> list[Section]:
    """Notebook 03: the windows over the first image, the permutation, what a wrong un-reorder misplaces, and
    the masks of a packed bucket (``bucket_images`` sizes, default the images' own) with their leak audit."""

    image_path = image_paths[0]
    spec = ResizeSpec.from_checkpoint(checkpoint)
    grid = grid_for(*image_size(image_path), spec)
    audit = audit_unreorder([grid], spec.merge_size)
    verdict = "an involution: a twice-applied un-reorder is INVISIBLE here" if audit.involution else "not an involution"
    headline = (
        f"**{text(Path(image_path).name)}**: grid {' x '.join(map(str, grid))}, {audit.merged_tokens} merged tokens, "
        f"{audit.windows} windows "
        f"({audit.partial_windows} padded); the permutation is {verdict}; `reverse[orig] = rank` misplaces "
        f"**{audit.misplaced_by_rank_scatter}** tokens. Resize settings: {text(spec.source)}."
    )
    if bucket_images:
        grids = [grid_for(*parse_size(size), spec) for size in bucket_images]
        packed = ", ".join(bucket_images)
    else:
        grids = [grid_for(*image_size(path), spec) for path in image_paths]
        packed = ", ".join(Path(path).name for path in image_paths)
    rows = _bucket_rows(grids, bucket_rows)
    return [
        Section(
            "Window geometry",
            "The vision tower attends inside 112x112-pixel windows, so every runtime permutes tokens into window "
            "order and must put them back. When the permutation is an involution (as for 448x448) a wrong "
            "un-reorder is invisible: choose a size where it is not.",
            (headline,),
        ),
        Section("Windows over the image (numbered in window order)", "", (windows_over_image(image_path, spec),)),
        Section("The window permutation", "", (permutation_picture(image_path, spec),)),
        Section(
            "What a wrong un-reorder misplaces",
            "This image's window permutation is an involution: `reverse[orig] = rank` gives the same order as the "
            "correct argsort and misplaces no token, so a twice-applied un-reorder cannot be seen here. Choose a "
            "size whose permutation is not an involution (e.g. 336x336) to test it."
            if audit.involution
            else "",
            () if audit.involution else (misplaced_over_image(image_path, spec),),
        ),
        Section(
            "Masks of a packed bucket and their audit",
            f"{text(packed)} packed into {rows} patch rows. Every count must be zero: no attention across images, "
            "between real rows and padding, padded rows that see anything but themselves, window entries across "
            "windows, or blocked entries inside one image.",
            (mask_pictures(grids, rows, spec), mask_audit_frame(grids, rows, spec)),
        ),
    ]


def geometry_report(
    sizes: list[str], bucket: int | None, checkpoint: str | Path | None, as_json: bool, window_size: int | None = None
) -> str:
    """``driftscope geometry``: per image the grid, windows, involution and misplaced tokens; with a bucket,
    the packing and the mask audit."""
    spec = ResizeSpec.from_checkpoint(checkpoint)
    window_size = window_size or WINDOW_SIZE
    images = image_rows(sizes, spec, window_size)
    packed = bucket_summary(sizes, bucket, spec, window_size) if bucket is not None else None
    if as_json:
        return json.dumps({"processor": spec.source, "images": images, "bucket": packed}, indent=2)
    return f"processor settings: {spec.source}\n" + format_text(images, packed)


def axis_sizes(config: dict, inputs=None) -> dict[str, int | str]:
    """The size of every axis name the stage plan uses, for ``driftscope stages`` (token axes by name when
    ``inputs`` is None); ``tokens:patch`` and ``tokens:merged`` are the ``tokens`` axis in each unit."""
    from .geometry import cu_seqlens, window_layout
    from .plan import vision_config

    vision = vision_config(config)
    sizes = tower_axis_sizes(vision, RELEASED_SIZES, inputs)
    sizes["windows+1"], sizes["images+1"] = "windows+1", "images+1"
    if inputs is not None:
        grid = np.asarray(inputs["grid_thw"], dtype=np.int64)
        merge, patch = int(vision.get("spatial_merge_size", 2)), int(vision.get("patch_size", 14))
        layout = window_layout(grid, merge, int(vision.get("window_size", 112)), patch)
        sizes["windows+1"], sizes["images+1"] = len(layout.cu_window_seqlens), len(cu_seqlens(grid))
    sizes["tokens:patch"], sizes["tokens:merged"] = sizes["patches"], sizes["merged_tokens"]
    return sizes


def shapes_note(config: dict) -> str:
    """How the token axes follow from the images, for ``driftscope stages`` without images."""
    from .plan import vision_config

    unit = int(vision_config(config).get("spatial_merge_size", 2)) ** 2
    return f"patches = sum of t*h*w over the grids, merged_tokens = patches / {unit}"


# Qwen2.5-VL's sentences on the generic notebook pages (``Family.text``).

PROSE = {
    "inputs": (
        "Drawn over each resized image: its attention windows (the tower attends within them except in its "
        "full-attention blocks). One window means a wrong window permutation cannot be seen on this image."
    ),
    "mutations": (
        "an identity window permutation, full attention where the model attends in windows, a twice-applied "
        "un-reorder, a cross-image mask leak"
    ),
    "answer": ("the M-RoPE positions (temporal, height and width ids, so the image slots carry their grid position)"),
}


# Qwen2.5-VL's geometry figures (notebook 03): windows over the image, the permutation, a wrong un-reorder, masks.

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
    from matplotlib.figure import Figure
    from matplotlib.patheffects import withStroke

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
    from matplotlib.figure import Figure

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
    from matplotlib.figure import Figure

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
    from matplotlib.figure import Figure

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
