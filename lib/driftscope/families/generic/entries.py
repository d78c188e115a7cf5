"""What both generic engines read from a plan: each stage's entry (the module on each side, layouts, whether it
is the module's input or output, the decoder's batch and last-position rules), and the value a stage keeps."""

from __future__ import annotations

from typing import Any

import numpy as np

from driftscope.taps.stages import StagePlan

from .layout import Layout


class StopForward(Exception):  # noqa: N818 - a signal, not an error
    """Raised from a tap once every wanted stage is written: the rest of the forward is not needed."""


def entries(plan: StagePlan) -> dict[str, dict]:
    """Stage id -> its entry, for the stages the generic family planned."""
    return dict((plan.meta.get("generic") or {}).get("stages") or {})


def stage_value(array: np.ndarray, entry: dict) -> np.ndarray:
    """What a stage keeps of a module's array (in the reference's layout): the decoder's single prompt without
    its batch axis, and only the last position where the stage says so."""
    if entry.get("text") and array.ndim >= 2:
        array = array[0]
    if entry.get("last") and array.ndim >= 2:
        array = array[-1]
    return np.ascontiguousarray(array)


def to_reference(array: np.ndarray, entry: dict, key: str = "layout") -> np.ndarray:
    """An MLX array put in the reference's layout with the entry's ``key`` layout (as stored when none); a module's
    output times the entry's ``scale`` where transformers' module applies one inside that mlx-vlm's applies after."""
    declared = entry.get(key)
    array = Layout.from_dict(declared).apply(array) if declared else array
    if key == "layout" and entry.get("scale"):
        array = array * np.asarray(entry["scale"], dtype=array.dtype)
    return array


def by_module(plan: StagePlan, wanted, side: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Module path on ``side`` ("torch" or "mlx") -> the wanted stages it writes from its output, and those it
    writes from its input."""
    outputs: dict[str, list[str]] = {}
    inputs: dict[str, list[str]] = {}
    for stage_id, entry in entries(plan).items():
        path = entry.get(side)
        if path is None or not wanted(stage_id):
            continue
        (inputs if entry.get("capture") == "input" else outputs).setdefault(path, []).append(stage_id)
    return outputs, inputs


def with_rank(array: Any, rank: int, expand) -> Any:
    """``array`` with leading axes of size 1 added (``expand(array)``) until it has ``rank`` axes."""
    while len(array.shape) < rank:
        array = expand(array)
    return array


#: the prefix of the stages holding the prompt a capture ran on (the generic family runs the whole model always)
PROMPT = "inputs.prompt."


def put_prompt(inputs: Any, sink: Any) -> None:
    """The prompt's per-token arrays as ``inputs.prompt.<name>`` data stages (what a replay rebuilds the call
    from)."""
    text = inputs.text
    sink.put(f"{PROMPT}input_ids", np.asarray(text.input_ids))
    for name, values in text.token_arrays.items():
        sink.put(f"{PROMPT}{name}", np.asarray(values))
