"""Every stage of a checkpoint as an engine author needs it to write a TapSet (``driftscope stages``).

Per stage, in execution order: its id, axes, shape for the given images, the dtype driftscope expects,
token order and token unit, the active rows, whether it is compared as integers, and what it means.
Shapes come from the config and the processor's grids; without images the token axes stay symbolic.
"""

from __future__ import annotations

import json

import numpy as np

from .families.qwen2_5_vl import vision_config
from .geometry.windows import cu_seqlens, window_layout
from .inputs import VisionInputs
from .stages import StagePlan

COLUMNS = ("stage", "axes", "shape", "dtype", "token_order", "token_unit", "active_rows", "integer", "description")


def axis_sizes(config: dict, inputs: VisionInputs | None = None) -> dict[str, int | str]:
    """The size of every axis name the stage plan uses (token axes by name when ``inputs`` is None)."""
    vision = vision_config(config)
    hidden, heads = int(vision.get("hidden_size", 1280)), int(vision.get("num_heads", 16))
    merge = int(vision.get("spatial_merge_size", 2))
    patch, temporal = int(vision.get("patch_size", 14)), int(vision.get("temporal_patch_size", 2))
    sizes: dict[str, int | str] = {
        "hidden": hidden,
        "heads": heads,
        "head_dim": hidden // heads,
        "intermediate": int(vision.get("intermediate_size", 3420)),
        "merged_hidden": hidden * merge * merge,
        "out_hidden": int(vision.get("out_hidden_size", 2048)),
        "channels": int(vision.get("in_channels", vision.get("in_chans", 3))) * temporal * patch * patch,
        "thw": 3,
    }
    for name in ("patches", "merged_tokens", "images", "windows+1", "images+1"):
        sizes[name] = name
    if inputs is not None:
        grid = np.asarray(inputs.grid_thw, dtype=np.int64)
        patches = int(grid.prod(axis=1).sum())
        layout = window_layout(grid, merge, int(vision.get("window_size", 112)), patch)
        sizes.update(
            {
                "patches": patches,
                "merged_tokens": patches // (merge * merge),
                "images": len(grid),
                "windows+1": len(layout.cu_window_seqlens),
                "images+1": len(cu_seqlens(grid)),
            }
        )
    return sizes


def stage_rows(plan: StagePlan, config: dict, inputs: VisionInputs | None = None) -> list[dict]:
    """One record per stage of ``plan``, in execution order."""
    sizes = axis_sizes(config, inputs)
    rows = []
    for stage in plan:
        tokens = sizes["merged_tokens" if stage.token_unit == "merged" else "patches"]
        shape = [tokens if axis == "tokens" else sizes.get(axis, axis) for axis in stage.axes]
        has_tokens = stage.token_order != "none"
        rows.append(
            {
                "stage": stage.id,
                "axes": list(stage.axes),
                "shape": shape,
                "dtype": "I64" if stage.integer else "F32",
                "token_order": stage.token_order,
                "token_unit": stage.token_unit,
                "active_rows": [[0, shape[0]]] if has_tokens else None,
                "integer": stage.integer,
                "description": stage.description,
            }
        )
    return rows


def _cell(key: str, value) -> str:
    if value is None:
        return "-"
    if key == "axes":
        return ", ".join(value)
    if key == "shape":
        return "[" + ", ".join(str(size) for size in value) + "]"
    if key == "active_rows":
        return ", ".join(f"{start}:{stop}" for start, stop in value)
    if key == "integer":
        return "yes" if value else "no"
    if key == "stage":
        return f"`{value}`"
    return str(value)


def format_table(rows: list[dict]) -> str:
    """The records as a Markdown table (what ``driftscope stages`` prints and docs/tapfile.md embeds)."""
    lines = ["| # | " + " | ".join(COLUMNS) + " |", "|---|" + "---|" * len(COLUMNS)]
    for position, row in enumerate(rows):
        lines.append(f"| {position} | " + " | ".join(_cell(key, row[key]) for key in COLUMNS) + " |")
    return "\n".join(lines)


def format_json(rows: list[dict], inputs: VisionInputs | None) -> str:
    header = None if inputs is None else {"grid_thw": inputs.grid_thw.tolist(), "inputs_digest": inputs.digest}
    return json.dumps({"inputs": header, "stages": rows}, indent=1)


def describe_inputs(config: dict, inputs: VisionInputs | None) -> str:
    """One line above the table: which grids the shapes are for, and the inputs digest to declare."""
    if inputs is None:
        unit = int(vision_config(config).get("spatial_merge_size", 2)) ** 2
        return f"shapes for any images: patches = sum of t*h*w over the grids, merged_tokens = patches / {unit}"
    return (
        f"shapes for grid_thw {inputs.grid_thw.tolist()} ({int(inputs.pixel_values.shape[0])} patches); "
        f"inputs_digest {inputs.digest}"
    )


def list_stages(checkpoint_path: str, images: list[str], as_json: bool = False, write_to: str | None = None) -> str:
    """``driftscope stages``: the text it prints (and, with ``write_to``, the engine's inputs written there)."""
    from .checkpoint import open_checkpoint
    from .engine_inputs import write_inputs
    from .errors import ParameterError
    from .families import stage_plan
    from .inputs import prepare_inputs
    from .stages import StageSelection

    checkpoint = open_checkpoint(checkpoint_path)
    plan = stage_plan(checkpoint.family, checkpoint.config).select(StageSelection.everything())
    inputs = prepare_inputs(checkpoint, images) if images else None
    if write_to:
        if inputs is None:
            raise ParameterError("--write-inputs needs --images", "name the images the engine will run on")
        write_inputs(write_to, inputs)
    rows = stage_rows(plan, checkpoint.config, inputs)
    if as_json:
        return format_json(rows, inputs)
    return describe_inputs(checkpoint.config, inputs) + "\n\n" + format_table(rows)
