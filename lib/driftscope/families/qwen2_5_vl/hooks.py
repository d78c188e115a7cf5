"""What the generic views, the geometry notebook and the geometry CLI ask of Qwen2.5-VL."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from driftscope.core.markup import text

from ...inputs.image_size import parse_size
from ...inputs.images import image_size, same_pixels
from ..base import GeometryClaim, Section
from ..qwen_shared.layout import token_layout  # noqa: F401 (a view hook of this family)
from ..qwen_shared.tower import tower_axis_sizes
from .geometry import ResizeSpec, audit_unreorder, grid_for, window_layout
from .geometry.summary import WINDOW_SIZE, bucket_summary, format_text, image_rows

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
    from .geometry.plots import (
        mask_audit_frame,
        mask_pictures,
        misplaced_over_image,
        permutation_picture,
        windows_over_image,
    )

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
    from .geometry.windows import cu_seqlens, window_layout
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
