"""What the generic views, the geometry notebook and the geometry CLI ask of Molmo2: the view hooks, the family's
sentences on the pages (``PROSE``), and notebook 03's crop and pooling figures (matplotlib is imported only when a
figure is drawn)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from driftscope.core.markup import listed, text
from driftscope.taps.tapset import TapSet

from ...errors import InputError
from ...inputs.images import image_size
from ..base import GeometryClaim, ImageTokens, Section
from .config import read_facts
from .geometry import CropSpec, crop_layout, summary

if TYPE_CHECKING:
    from matplotlib.figure import Figure
from .geometry import crop_boxes

# What the generic views, the geometry notebook and the geometry CLI ask of Molmo2.

#: The hub's defaults when no checkpoint is named: 27 declared layers, vit_layers [-3, -9].
HUB_DEFAULTS = {"vit_config": {"num_hidden_layers": 27}, "adapter_config": {"vit_layers": [-3, -9]}}


def _images(reference: TapSet) -> list[tuple[int, int, int, tuple[int, int, int, int]]]:
    """Per image: (first crop, crops, first token, grid) from the reference's inputs."""
    crops = np.asarray(reference["inputs.num_crops"]).reshape(-1).tolist()
    grids = np.asarray(reference["inputs.grids"]).reshape(-1, 4).tolist()
    out, crop, token = [], 0, 0
    for count, grid in zip(crops, grids, strict=True):
        out.append((crop, int(count), token, tuple(int(v) for v in grid)))
        crop, token = crop + int(count), token + grid[0] * grid[1] + grid[2] * grid[3]
    return out


def _canvas_cells(pooling: np.ndarray, grid, first_crop: int, crops: int, patches: int) -> np.ndarray:
    """Canvas (row, col) of every patch of an image's high-resolution crops, from where its pooling indices put
    the crop's kept patches (a crop's dropped margins land on the neighbour's patches there)."""
    high_rows, high_cols = grid[2], grid[3]
    side = int(round(patches**0.5))
    windows = pooling.reshape(high_rows, high_cols, 2, 2).transpose(0, 2, 1, 3).reshape(2 * high_rows, 2 * high_cols)
    local = np.stack(np.meshgrid(np.arange(side), np.arange(side), indexing="ij"), -1).reshape(-1, 2)
    cells = []
    for crop in range(first_crop + 1, first_crop + crops):
        y, x = np.argwhere(windows // patches == crop)[0]
        ly, lx = divmod(int(windows[y, x] % patches), side)
        cells.append(local + (y - ly, x - lx))
    return np.concatenate(cells)


def token_layout(reference: TapSet, unit: str | None, plan_meta: dict) -> list[ImageTokens]:
    """Per image, where its high-resolution rows sit: pooled tokens (``merged``) row-major on the high-resolution
    token grid; patch rows (``patch``, crop after crop) on the resized canvas. The low-resolution crop and its
    tokens (the whole image at 378 px) come first in each image and are left out of the map."""
    if unit not in ("patch", "merged") or "inputs.grids" not in reference:
        return []
    patches = int(reference.shape("inputs.pixel_values")[1])
    pooling = np.asarray(reference["inputs.pooling"])
    layout = []
    for first_crop, crops, first_token, grid in _images(reference):
        low, high = grid[0] * grid[1], grid[2] * grid[3]
        if unit == "merged":
            cells = np.stack(np.meshgrid(np.arange(grid[2]), np.arange(grid[3]), indexing="ij"), -1).reshape(-1, 2)
            layout.append(ImageTokens(first_token + low, first_token + low + high, (grid[2], grid[3]), cells))
            continue
        tokens = pooling[first_token + low : first_token + low + high]
        cells = _canvas_cells(tokens, grid, first_crop, crops, patches)
        shape = (int(cells[:, 0].max()) + 1, int(cells[:, 1].max()) + 1)
        layout.append(ImageTokens((first_crop + 1) * patches, (first_crop + crops) * patches, shape, cells))
    return layout


def input_overlay(inputs: dict, image: int) -> tuple[int | None, str]:
    """No grid over the image (the crops overlap); the caption says how it was cut."""
    height, width = inputs["resized"][image]
    rows, cols = inputs["tiling"][image]
    return None, (
        f"canvas {height}x{width}, {rows}x{cols} crops + the low-res crop, {inputs['image_tokens'][image]} tokens "
        f"({inputs['padded_tokens'][image]} padded)"
    )


def layer_facts(checkpoint: str | Path | None) -> dict:
    """The checkpoint's ViT layer facts (the hub's defaults without a checkpoint)."""
    config = HUB_DEFAULTS
    if checkpoint is not None and (Path(checkpoint) / "config.json").exists():
        config = json.loads((Path(checkpoint) / "config.json").read_text())
    facts = read_facts(config)
    return {
        "source": str(checkpoint) if checkpoint is not None else "the hub's defaults (no checkpoint)",
        "layout": facts.layout,
        "declared_depth": facts.vit.declared_depth,
        "configured_layers": list(facts.adapter.configured_layers),
        "selected_layers": list(facts.selected_layers),
        "execution_depth": facts.execution_depth,
    }


def geometry_report(
    sizes: list[str], bucket: int | None, checkpoint: str | Path | None, as_json: bool, window_size: int | None = None
) -> str:
    """``driftscope geometry``: per image size the crops, tokens and partially padded pooling windows; the
    selected ViT layers as resolved against the declared depth, and how many layers run."""
    from driftscope.inputs.image_size import parse_size

    if bucket is not None or window_size is not None:
        raise InputError(
            "Molmo2 has no attention windows and packs no buckets (--bucket / --window-size do not apply)",
            "drop --bucket and --window-size for a Molmo2 checkpoint",
        )
    spec = CropSpec.from_checkpoint(checkpoint)
    images = [summary(*parse_size(size), spec) for size in sizes]
    layers = layer_facts(checkpoint)
    if as_json:
        return json.dumps({"processor": vars(spec), "layers": layers, "images": images}, indent=2)
    columns = ["image", "tiling", "crops", "canvas", "low_res_tokens", "high_res_tokens", "tokens"]
    columns += ["padded_low_res", "padded_high_res"]
    table = [columns] + [[str(row[c]) for c in columns] for row in images]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)) for line in table]
    return "\n".join(
        [
            f"crops of {spec.crop_size} px, margins {listed(spec.margins)} patches, at most {spec.max_crops} crops; "
            f"pooling {spec.pooling[0]}x{spec.pooling[1]} (padded windows: tokens with fewer valid patches)",
            f"ViT layers ({layers['source']}, {layers['layout']} layout): declared {layers['declared_depth']}, "
            f"configured {listed(layers['configured_layers'])} -> selected {listed(layers['selected_layers'])} "
            f"(resolved against the declared depth); {layers['execution_depth']} layers run",
            "",
            *lines,
        ]
    )


def geometry_claims(image_paths: list[Path], checkpoint: str | Path | None = None) -> list[GeometryClaim]:
    """Could these images (their crops and pooling windows under the checkpoint's processor) reveal a pooler
    that mishandles padded slots, or a wrong crop order?"""
    spec = CropSpec.from_checkpoint(checkpoint)
    layouts = [crop_layout(*image_size(path), spec) for path in image_paths]
    slots = spec.pooling[0] * spec.pooling[1]
    padded = [int((layout.valid_counts < slots).sum()) for layout in layouts]
    tilings = listed([list(layout.tiling) for layout in layouts], " x ")
    several = [layout.tiling != (1, 1) for layout in layouts]
    return [
        GeometryClaim(
            "a pooler that mishandles padded slots (averaging all slots, or reading -1 as patch 0)",
            any(padded),
            f"{sum(padded)} pooled tokens{'' if len(padded) == 1 else ' (per image: ' + listed(padded, ', ') + ')'} "
            f"pool fewer than {slots} patches"
            if any(padded)
            else "every pooled token has all its patches: there are no padded slots (use a size whose token grid "
            "has an odd side)",
            ("pool_mean_over_all_slots", "padding_index_clamped"),
        ),
        GeometryClaim(
            "a wrong crop order (crops not in the order the pooling indices assume)",
            any(several),
            f"tilings {tilings}: the crops differ, so a reordered crop feeds other pixels to its tokens"
            if any(several)
            else f"tilings {tilings}: one high-resolution crop per image, which is the low-resolution crop pixel "
            f"for pixel (both the image resized to {spec.crop_size} px), so reordering the crops changes no token "
            "(add an image that takes several crops, e.g. 448x672)",
            ("crops_reversed",),
        ),
    ]


def geometry_sections(image_paths: list[Path], checkpoint: str | Path | None = None, **options) -> list[Section]:
    """Notebook 03: each image's crops and pooled tokens, the first image's crops and pooling windows drawn,
    the selected layers."""

    spec = CropSpec.from_checkpoint(checkpoint)
    image_path = image_paths[0]
    headlines = []
    for path in image_paths:
        facts = summary(*image_size(path), spec)
        tiling = listed(facts["tiling"], " x ")
        headlines.append(
            f"**{text(Path(path).name)}** ({facts['image']}): {facts['crops']} crops (tiling {tiling} on a "
            f"{facts['canvas']} canvas, plus the whole image at {spec.crop_size} px), {facts['tokens']} pooled "
            f"tokens ({facts['low_res_tokens']} low-res, {facts['high_res_tokens']} high-res); partially padded "
            f"windows: {facts['padded_low_res']} low-res, {facts['padded_high_res']} high-res."
        )
    layers = layer_facts(checkpoint)
    return [
        Section(
            "Crops and pooled tokens",
            "Molmo2 reads an image as one low-resolution crop (the whole image) and overlapping high-resolution "
            "crops; every canvas patch is read from exactly one crop, the interior margins are dropped.",
            ("\n\n".join(headlines), crop_table(image_path, spec)),
        ),
        Section("Crops over the image (kept part dashed)", "", (crops_over_image(image_path, spec),)),
        Section(
            "Pooling windows",
            "Each token pools a 2x2 window of patches; a grid with an odd side is padded with -1, so its last row "
            "and column pool fewer patches. The query divides by the valid count and the attention masks padding: "
            "a port that divides by 4 or reads patch 0 in a padded slot differs exactly on these tokens.",
            (pooling_windows(image_path, spec),),
        ),
        Section(
            "Selected ViT layers",
            "Negative vit_layers count from the depth the config declares, not from the layers the checkpoint keeps; "
            "only the prefix up to the deepest selected layer runs.",
            (
                f"{layers['layout']} layout ({layers['source']}): declared depth {layers['declared_depth']}, "
                f"configured {listed(layers['configured_layers'])} -> "
                f"selected **{listed(layers['selected_layers'])}**, "
                f"**{layers['execution_depth']}** layers run.",
            ),
        ),
    ]


def axis_sizes(config: dict, inputs=None) -> dict[str, int | str]:
    """The size of every axis name the stage plan uses, for ``driftscope stages`` (token axes by name when
    ``inputs`` is None); ``tokens`` is pooled tokens in both units."""
    facts = read_facts(config)
    vit, adapter = facts.vit, facts.adapter
    sizes: dict[str, int | str] = {
        "patches": vit.position_grid**2,
        "positions": vit.num_positions,
        "pixels": vit.patch_dim,
        "hidden": vit.hidden_size,
        "heads": vit.num_heads,
        "head_dim": vit.head_dim,
        "mlp": vit.intermediate_size,
        "pool_dim": vit.hidden_size * len(facts.selected_layers),
        "adapter_hidden": adapter.hidden_size,
        "projector_hidden": adapter.intermediate_size,
        "text_hidden": adapter.text_hidden_size,
        "slots": 4,
        "grid": 4,
    }
    for name in ("crops", "tokens", "images"):
        sizes[name] = name
    if inputs is not None:
        sizes.update(
            crops=int(inputs["pixel_values"].shape[0]),
            tokens=int(inputs["pooling"].shape[0]),
            slots=int(inputs["pooling"].shape[1]),
            images=int(len(inputs["num_crops"])),
        )
    sizes["tokens:patch"] = sizes["tokens:merged"] = sizes["tokens"]
    return sizes


def shapes_note(config: dict) -> str:
    """How the image axes follow from the images, for ``driftscope stages`` without images."""
    return "crops = 1 + rows x cols per image (378-px crops), tokens = pooled 2x2 windows of the crops"


# Molmo2's sentences on the generic notebook pages (``Family.text``).

PROSE = {
    "inputs": (
        "Each image is cut into a low-resolution crop of the whole image and overlapping high-resolution crops; "
        "the attention pooler gathers their patches into tokens by index. One high-resolution crop means a wrong "
        "crop order cannot be seen on this image."
    ),
    "mutations": (
        "ViT layers resolved against the layers that run instead of the declared depth, the exact GELU in the "
        "ViT, a causal mask over the image tokens, padded pooling slots clamped to patch 0"
    ),
    "answer": (
        "the image tokens' attention mask (bidirectional among an image's tokens, causal elsewhere) and the "
        "1-D rotary positions"
    ),
}


# Molmo2's geometry figures and tables (notebook 03): the crops over the image, the pooling windows.

COLOURS = ("#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def _canvas(image_path: str | Path, spec: CropSpec):
    from PIL import Image

    with Image.open(image_path) as image:
        rgb = image.convert("RGB")
        layout = crop_layout(rgb.height, rgb.width, spec)
        array = np.asarray(rgb.resize((layout.resized[1], layout.resized[0]), Image.Resampling.BILINEAR))
    return array, layout


def crop_table(image_path: str | Path, spec: CropSpec = CropSpec()):
    """One row per crop: where it reads the canvas, the part no neighbour reads, its first patch row."""
    import pandas as pd

    _, layout = _canvas(image_path, spec)
    patches = spec.patches_per_crop
    rows = [
        {
            "crop": 0,
            "kind": "low-res (whole image)",
            "box (x0, y0, x1, y1)": "-",
            "kept": "-",
            "patch rows": f"0:{patches}",
        }
    ]
    for entry in crop_boxes(layout, spec):
        crop = entry["crop"]
        rows.append(
            {
                "crop": crop,
                "kind": "high-res",
                "box (x0, y0, x1, y1)": f"({listed(entry['box'])})",
                "kept": f"({listed(entry['kept'])})",
                "patch rows": f"{crop * patches}:{(crop + 1) * patches}",
            }
        )
    return pd.DataFrame(rows)


def crops_over_image(image_path: str | Path, spec: CropSpec = CropSpec()) -> Figure:
    """The resized canvas with each high-resolution crop outlined (solid) and the part it keeps (dashed)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    canvas, layout = _canvas(image_path, spec)
    figure = Figure(figsize=(5.5, 5.5 * canvas.shape[0] / canvas.shape[1] + 0.4), layout="constrained")
    axis = figure.subplots()
    axis.imshow(canvas)
    for entry in crop_boxes(layout, spec):
        colour = COLOURS[(entry["crop"] - 1) % len(COLOURS)]
        x0, y0, x1, y1 = entry["box"]
        axis.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor=colour, linewidth=2))
        x0, y0, x1, y1 = entry["kept"]
        axis.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor=colour, linestyle="--"))
        axis.text(x0 + 6, y0 + 18, f"crop {entry['crop']}", color=colour, fontsize=9, weight="bold")
    axis.set_title(f"canvas {layout.resized[0]}x{layout.resized[1]}, tiling {list(layout.tiling)}", fontsize=9)
    axis.set_axis_off()
    return figure


def pooling_windows(image_path: str | Path, spec: CropSpec = CropSpec()) -> Figure:
    """Valid patches per pooled token on the low- and high-resolution token grids (fewer than 4: padded)."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    _, layout = _canvas(image_path, spec)
    low_rows, low_cols, high_rows, high_cols = layout.grid
    counts = layout.valid_counts
    low = counts[: low_rows * low_cols].reshape(low_rows, low_cols)
    high = counts[low_rows * low_cols :].reshape(high_rows, high_cols)
    figure = Figure(figsize=(10, 4.4), layout="constrained")
    axes = figure.subplots(1, 2)
    slots = spec.pooling[0] * spec.pooling[1]
    colours = matplotlib.colormaps["viridis"].resampled(slots + 1)  # one colour per whole count of patches
    for axis, grid, name in ((axes[0], low, "low-res"), (axes[1], high, "high-res")):
        shown = axis.imshow(grid, cmap=colours, vmin=-0.5, vmax=slots + 0.5, interpolation="nearest")
        padded = int((grid < slots).sum())
        axis.set_title(f"{name}: {grid.shape[0]}x{grid.shape[1]} tokens, {padded} padded", fontsize=9)
        axis.set_xlabel("token column")
        axis.set_ylabel("token row")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.yaxis.set_major_locator(MaxNLocator(integer=True))
    figure.colorbar(shown, ax=axes.tolist(), label="valid patches", ticks=range(slots + 1))  # whole patches only
    return figure
