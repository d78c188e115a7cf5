"""What the generic views, ``driftscope geometry`` and ``driftscope stages`` ask of Qwen3-VL (the view hooks),
and the family's sentences on the pages (``PROSE``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from driftscope.core.markup import listed, text
from driftscope.errors import InputError
from driftscope.inputs.image_size import parse_size
from driftscope.inputs.images import image_size, same_pixels

from ..base import GeometryClaim, Section
from ..figures import draw_attention_mask
from ..qwen_shared.layout import token_layout  # noqa: F401 (a view hook of this family)
from ..qwen_shared.processor import stated_settings
from ..qwen_shared.tower import tower_axis_sizes
from .geometry import audit_bucket, axis_taps, grid_side, lands_on_table_rows, pack_bucket
from .plan import vision_config

# What the generic views, the geometry notebook, ``driftscope geometry`` and ``driftscope stages`` ask of
# Qwen3-VL: where token rows sit, what to draw over an input, the resize and position-table interpolation of
# given image sizes, and a packed bucket with its mask audit.

#: What released Qwen3-VL checkpoints say, used when no checkpoint is given.
DEFAULTS = {"min_pixels": 65536, "max_pixels": 16777216, "patch_size": 16, "merge_size": 2, "table": 48}
#: Qwen3-VL's tower sizes where a config is silent.
RELEASED_SIZES = {"hidden_size": 1152, "patch_size": 16, "intermediate_size": 4304, "out_hidden_size": 3584}


def input_overlay(inputs: dict, image: int) -> tuple[int | None, str]:
    """(merged-token side in resized pixels, caption) of one input image of a report's ``inputs``."""
    processor = inputs.get("processor", {})
    step = int(processor.get("patch_size", 16)) * int(processor.get("merge_size", 2))
    height, width = inputs["resized"][image]
    loaded = inputs.get("image_sizes", [[height, width]])[image]
    origin = "" if list(loaded) == [height, width] else f" (from {loaded[0]}x{loaded[1]})"
    table = inputs.get("position_table", "")
    return step, f"{height}x{width}{origin}, grid {inputs['grid_thw'][image]}, position table {table}"


def _settings(checkpoint: str | Path | None) -> dict:
    """The resize bounds and patching of the checkpoint's processor files (Qwen3-VL's where they are silent)."""
    stated = stated_settings(checkpoint) if checkpoint is not None else {}
    settings = {key: int(stated.get(key, value)) for key, value in DEFAULTS.items() if key != "table"}
    config = Path(checkpoint) / "config.json" if checkpoint is not None else None
    table = DEFAULTS["table"]
    if config is not None and config.exists():
        table = grid_side(int(vision_config(json.loads(config.read_text())).get("num_position_embeddings", 2304)))
    source = str(Path(checkpoint) / "preprocessor_config.json") if stated else "Qwen3-VL defaults"
    return {**settings, "table": table, "source": source}


def _grid(height: int, width: int, settings: dict) -> tuple[int, int, int]:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    factor = settings["patch_size"] * settings["merge_size"]
    try:
        h, w = smart_resize(height, width, factor, settings["min_pixels"], settings["max_pixels"])
    except ValueError as err:
        raise InputError(f"image size {height}x{width} cannot be resized: {err}", "use a less extreme aspect") from err
    return 1, h // settings["patch_size"], w // settings["patch_size"]


def image_rows(sizes: list[str], settings: dict) -> list[dict]:
    """Per image size: the resize, the grid, tokens, and how its patches sample the position table."""
    rows = []
    for size in sizes:
        height, width = parse_size(size)
        grid = _grid(height, width, settings)
        patch = settings["patch_size"]
        rows.append(
            {
                "image": f"{height}x{width}",
                "resized": f"{grid[1] * patch}x{grid[2] * patch}",
                "upscaled_by_min_pixels": height * width < settings["min_pixels"],
                "grid_thw": list(grid),
                "patches": grid[1] * grid[2],
                "merged_tokens": grid[1] * grid[2] // settings["merge_size"] ** 2,
                "position_table": f"{settings['table']}x{settings['table']}",
                "lands_on_table_rows": lands_on_table_rows([grid], settings["table"]),
            }
        )
    return rows


def bucket_summary(sizes: list[str], rows: int | None, settings: dict) -> dict:
    """The images packed into one bucket of ``rows`` patch rows, and its mask audit."""
    grids = [_grid(*parse_size(size), settings) for size in sizes]
    bucket = pack_bucket(grids, settings["table"], rows, settings["merge_size"])
    starts = bucket.cu_seqlens.tolist()
    return {
        "rows": bucket.rows,
        "requested_rows": rows,
        "active": bucket.active,
        "padding": bucket.rows - bucket.active,
        "media": [{"image": size, "rows": [starts[i], starts[i + 1]]} for i, size in enumerate(sizes)],
        "audit": audit_bucket(bucket),
    }


def geometry_report(
    sizes: list[str], bucket: int | None, checkpoint: str | Path | None, as_json: bool, **options
) -> str:
    """``driftscope geometry``: per image the resize, grid and position-table sampling; with a bucket, the
    packing and the mask audit (``options`` such as a window size do not apply: there are no windows)."""
    settings = _settings(checkpoint)
    images = image_rows(sizes, settings)
    packed = bucket_summary(sizes, bucket, settings) if bucket is not None else None
    if as_json:
        return json.dumps({"processor": settings, "images": images, "bucket": packed}, indent=2)
    lines = [
        f"processor settings: {settings['source']} (pixels {settings['min_pixels']}..{settings['max_pixels']}, "
        f"patch {settings['patch_size']}, merge {settings['merge_size']}); position table "
        f"{settings['table']}x{settings['table']}, bilinear, align_corners"
    ]
    for row in images:
        upscaled = " (upscaled by min_pixels)" if row["upscaled_by_min_pixels"] else ""
        exact = "on table rows: nearest == bilinear" if row["lands_on_table_rows"] else "between table rows"
        lines.append(
            f"  {row['image']} -> {row['resized']}{upscaled}: grid {row['grid_thw']}, {row['patches']} patches, "
            f"{row['merged_tokens']} tokens; patches {exact}"
        )
    if packed is not None:
        lines.append(
            f"bucket: {packed['rows']} rows, {packed['active']} active, {packed['padding']} padding; "
            + ", ".join(f"{m['image']} rows {m['rows'][0]}:{m['rows'][1]}" for m in packed["media"])
        )
        lines.append("mask audit (all must be 0): " + ", ".join(f"{k} {v}" for k, v in packed["audit"].items()))
    return "\n".join(lines)


def _table_figure(grid: tuple[int, int, int], table: int, title: str):
    """Where each patch of the grid samples the table: its align-corners position among the table rows."""
    from matplotlib.figure import Figure

    _, h, w = grid
    rows = np.arange(h, dtype=np.float32) * np.float32(table - 1) / np.float32(max(h - 1, 1))
    cols = np.arange(w, dtype=np.float32) * np.float32(table - 1) / np.float32(max(w - 1, 1))
    figure = Figure(figsize=(5.2, 5.2), layout="constrained")
    axis = figure.subplots()
    for line in range(table):
        axis.axhline(line, color="#dddddd", linewidth=0.5)
        axis.axvline(line, color="#dddddd", linewidth=0.5)
    yy, xx = np.meshgrid(rows, cols, indexing="ij")
    on_row = np.isclose(yy, np.round(yy)) & np.isclose(xx, np.round(xx))
    axis.scatter(xx[~on_row], yy[~on_row], s=6, color="#1f77b4", label="between table rows (blended)")
    axis.scatter(xx[on_row], yy[on_row], s=6, color="#d62728", label="on a table row")
    axis.set_xlim(-0.5, table - 0.5)
    axis.set_ylim(table - 0.5, -0.5)
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=7, loc="lower right")
    return figure


def _axis_frame(size: int, table: int):
    import pandas as pd

    taps, weights = axis_taps(np.arange(size), size, table)
    source = np.arange(size, dtype=np.float32) * np.float32(table - 1) / np.float32(max(size - 1, 1))
    return pd.DataFrame(
        {
            "patch index": np.arange(size),
            "table position": source,
            "taps": [list(map(int, t)) for t in taps],
            "weights": [[round(float(v), 6) for v in w] for w in weights],
        }
    )


def _mask_figure(grids: list[tuple[int, int, int]], rows: int, settings: dict):
    from matplotlib.figure import Figure

    bucket = pack_bucket(grids, settings["table"], rows, settings["merge_size"])
    figure = Figure(figsize=(5.6, 4.6), layout="constrained")
    axis = figure.subplots()
    draw_attention_mask(
        axis,
        bucket.segments[:, None] == bucket.segments[None, :],
        f"attention mask of a {bucket.rows}-row bucket ({bucket.active} active rows)",
    )
    return figure


def _size(path: str | Path) -> str:
    height, width = image_size(path)
    return f"{height}x{width}"


def geometry_claims(image_paths: list[Path], checkpoint: str | Path | None = None) -> list[GeometryClaim]:
    """Could these images (their grids under the checkpoint's resize) reveal a nearest-neighbour position table,
    the wrong resize bounds, the wrong resampler, or a mask leaking across packed images?"""
    from .mutations import QWEN2_BOUNDS

    settings = _settings(checkpoint)
    sizes = [_size(path) for path in image_paths]
    rows = image_rows(sizes, settings)
    grids = [tuple(row["grid_thw"]) for row in rows]
    table = settings["table"]
    qwen2 = {**settings, "min_pixels": QWEN2_BOUNDS["shortest_edge"], "max_pixels": QWEN2_BOUNDS["longest_edge"]}
    moved = [size for size, grid in zip(sizes, grids, strict=True) if _grid(*parse_size(size), qwen2) != grid]
    resized = [row["image"] for row in rows if row["image"] != row["resized"]]
    shown = ", ".join(f"{row['image']} -> {row['resized']}" for row in rows)
    on_rows = lands_on_table_rows(grids, table)
    leaks = len(grids) > 1 and not same_pixels(image_paths)
    grid_words = listed([list(g) for g in grids], " x ")
    return [
        GeometryClaim(
            "nearest-neighbour resampling of the position table (instead of bilinear, align_corners)",
            not on_rows,
            f"every patch of grids {grid_words} lands on a row of the {table}x{table} table, so "
            "nearest and bilinear read the same rows (use a size whose grid side - 1 does not divide "
            f"{table - 1})"
            if on_rows
            else f"patches of grids {grid_words} fall between rows of the {table}x{table} table",
            ("nearest_position_interpolation",),
        ),
        GeometryClaim(
            "the wrong resize bounds (Qwen2-VL's defaults instead of the checkpoint's)",
            bool(moved),
            f"{', '.join(moved)} resize differently under them ({shown})"
            if moved
            else f"{shown}: the same under both bounds (use an image below 256x256 pixels)",
            ("qwen2_resize_bounds",),
        ),
        GeometryClaim(
            "the wrong resampler (bilinear instead of bicubic)",
            bool(resized),
            f"{', '.join(resized)} resized ({shown})"
            if resized
            else f"no image is resized ({shown}): the resampler is never used (use a size that is not a "
            f"multiple of {settings['patch_size'] * settings['merge_size']})",
            ("bilinear_resampling",),
        ),
        GeometryClaim(
            "an attention mask leaking across packed images",
            leaks,
            f"{len(grids)} different images packed (the mask audit below packs these grids)"
            if leaks
            else "one image: there is nothing to leak across (pack two different images)"
            if len(grids) < 2
            else "the packed images are identical: attending across copies changes nothing",
        ),
    ]


def geometry_sections(
    image_paths: list[Path],
    checkpoint: str | Path | None = None,
    bucket_images: list[str] | None = None,
    bucket_rows: int | None = None,
    **options,
) -> list[Section]:
    """Notebook 03: the resize, where the first image's patches sample the learned position table, and a packed
    bucket (``bucket_images`` sizes, default the images' own) with its attention mask and audit."""
    import pandas as pd

    image_path = image_paths[0]
    settings = _settings(checkpoint)
    row = image_rows([_size(image_path)], settings)[0]
    grid = tuple(row["grid_thw"])
    sizes = list(bucket_images) if bucket_images else [_size(path) for path in image_paths]
    grids = [_grid(*parse_size(size), settings) for size in sizes]
    needed = sum(t * h * w for t, h, w in grids)
    rows = bucket_rows if bucket_rows is not None and bucket_rows >= needed else needed + (-needed % 64 or 64)
    packed = bucket_summary(sizes, rows, settings)
    grown = (
        ""
        if bucket_rows is None or rows == bucket_rows
        else f" ({bucket_rows} rows cannot hold them under this processor: grown to {rows})"
    )
    named = ", ".join(bucket_images) if bucket_images else ", ".join(Path(path).name for path in image_paths)
    verdict = (
        "every patch lands on a table row, so a nearest-neighbour resampling would be INVISIBLE here"
        if row["lands_on_table_rows"]
        else "patches fall between table rows, so a wrong resampling shows"
    )
    return [
        Section(
            "Resize and grid",
            "Qwen3-VL resizes every image to a multiple of 32 pixels with at least min_pixels: a small image is "
            "upscaled (224x224 becomes 256x256), so the resampler and the bounds are part of the evidence.",
            (
                f"**{text(Path(image_path).name)}**: {row['image']} -> {row['resized']}"
                + (" (upscaled by min_pixels)" if row["upscaled_by_min_pixels"] else "")
                + f", grid {' x '.join(map(str, grid))}, {row['merged_tokens']} tokens. "
                + f"Settings: {text(settings['source'])}.",
            ),
        ),
        Section(
            "Position-table interpolation",
            f"The learned {settings['table']}x{settings['table']} position table is resampled bilinearly "
            f"(align_corners) to the grid: {verdict}.",
            (
                _table_figure(grid, settings["table"], f"grid {grid[1]}x{grid[2]} on the position table"),
                _axis_frame(grid[1], settings["table"]),
            ),
        ),
        Section(
            "A packed bucket and its mask audit",
            f"{text(named)} ({', '.join(sizes)}) packed into {rows} patch rows{grown}. Every count must be zero: "
            "no attention across images, between real rows and padding, padded rows that see anything but "
            "themselves, or blocked entries inside one image.",
            (_mask_figure(grids, rows, settings), pd.DataFrame([packed["audit"]])),
        ),
    ]


def axis_sizes(config: dict, inputs=None) -> dict[str, int | str]:
    """The size of every axis name the stage plan uses, for ``driftscope stages`` (token axes by name when
    ``inputs`` is None); ``tokens:patch`` and ``tokens:merged`` are the ``tokens`` axis in each unit."""
    sizes = tower_axis_sizes(vision_config(config), RELEASED_SIZES, inputs)
    sizes["frames+1"] = "frames+1"
    if inputs is not None:
        sizes["frames+1"] = int(np.asarray(inputs["grid_thw"], dtype=np.int64)[:, 0].sum()) + 1
    sizes["tokens:patch"], sizes["tokens:merged"] = sizes["patches"], sizes["merged_tokens"]
    return sizes


def shapes_note(config: dict) -> str:
    """How the token axes follow from the images, for ``driftscope stages`` without images."""
    unit = int(vision_config(config).get("spatial_merge_size", 2)) ** 2
    return (
        f"patches = sum of t*h*w over the grids, merged_tokens = patches / {unit}; "
        "the DeepStack branches and the main merger have merged_tokens rows"
    )


# Qwen3-VL's sentences on the generic notebook pages (``Family.text``).

PROSE = {
    "inputs": (
        "Drawn over each resized image: its merged-token grid (2x2 patches per token). The tower attends over the "
        "whole image at once; its learned position table is interpolated to this grid."
    ),
    "mutations": (
        "a DeepStack branch dropped or two branches swapped, nearest-neighbour position-table interpolation, "
        "Qwen2-era resize bounds"
    ),
    "answer": (
        "the M-RoPE positions (temporal, height and width ids), the DeepStack additions at the image slots of "
        "the first decoder layers"
    ),
}
