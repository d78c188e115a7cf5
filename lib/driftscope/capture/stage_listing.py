"""Every stage of a checkpoint as an engine author needs it to write a TapSet (``driftscope stages``).

Per stage, in execution order: its id, axes, shape for the given images, the dtype driftscope expects,
token order and token unit, the active rows, whether it is compared as integers, and what it means.
Shapes come from the config and the processor's grids; without images the token axes stay symbolic.
"""

from __future__ import annotations

import json

import numpy as np

from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.stages import StagePlan

COLUMNS = ("stage", "axes", "shape", "dtype", "token_order", "token_unit", "active_rows", "integer", "description")


def stage_rows(plan: StagePlan, sizes: dict[str, int | str]) -> list[dict]:
    """One record per stage of ``plan``, in execution order (``sizes``: the family's axis sizes)."""
    rows = []
    for stage in plan:
        tokens = sizes.get(f"tokens:{stage.token_unit or 'patch'}", "tokens")
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


def _arrays(inputs: ModelInputs) -> dict[str, dict]:
    return {name: {"shape": list(a.shape), "dtype": str(a.dtype)} for name, a in inputs.arrays.items()}


def format_json(rows: list[dict], inputs: ModelInputs | None) -> str:
    header = None
    if inputs is not None:
        values = {name: a.tolist() for name, a in inputs.arrays.items() if np.issubdtype(a.dtype, np.integer)}
        header = {"arrays": _arrays(inputs), **values, "inputs_digest": inputs.digest}
    return json.dumps({"inputs": header, "stages": rows}, indent=1)


def describe_inputs(note: str, inputs: ModelInputs | None) -> str:
    """One line above the table: which inputs the shapes are for, and the inputs digest to declare."""
    if inputs is None:
        return f"shapes for any images: {note}"
    arrays = ", ".join(f"{name} {info['dtype']} {info['shape']}" for name, info in _arrays(inputs).items())
    return f"shapes for {inputs.headline} (inputs in digest order: {arrays}); inputs_digest {inputs.digest}"


def list_stages(
    checkpoint_path: str,
    images: list[str],
    as_json: bool = False,
    write_to: str | None = None,
    videos: list[str] = (),
) -> str:
    """``driftscope stages``: the text it prints (and, with ``write_to``, the engine's inputs written there);
    ``videos`` are packed after the images, as in a run."""
    from driftscope.errors import ParameterError
    from driftscope.families import get_family
    from driftscope.families.checkpoints import open_checkpoint, prepare_inputs
    from driftscope.inputs.engine_inputs import write_inputs
    from driftscope.taps.stages import StageSelection

    checkpoint = open_checkpoint(checkpoint_path)
    family = get_family(checkpoint.family)
    plan = family.plan_for(checkpoint).select(StageSelection.everything())
    inputs = prepare_inputs(checkpoint, images, videos) if images or videos else None
    if write_to:
        if inputs is None:
            raise ParameterError(
                "--write-inputs needs --images or --videos", "name the images (or videos) the engine will run on"
            )
        write_inputs(write_to, inputs)
    hooks = family.view_hooks()
    rows = stage_rows(plan, hooks.axis_sizes(checkpoint.config, inputs))
    if as_json:
        return format_json(rows, inputs)
    return describe_inputs(hooks.shapes_note(checkpoint.config), inputs) + "\n\n" + format_table(rows)
