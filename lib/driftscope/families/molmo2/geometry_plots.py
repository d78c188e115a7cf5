"""Molmo2's geometry figures and tables (notebook 03): the crops over the image, the pooling windows."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from driftscope.core.markup import listed

from .geometry import CropSpec, crop_boxes, crop_layout

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
