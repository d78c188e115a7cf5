"""What both generic engines read from a plan: each stage's entry (the module on each side, layouts, whether it
is the module's input or output, the decoder's batch and last-position rules), and the value a stage keeps."""

from __future__ import annotations

from typing import Any

import numpy as np

from driftscope.taps.module_taps import Port, argument, output
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


def module_ports(plan: StagePlan, wanted, side: str, form) -> list[tuple[str, Port]]:
    """Each wanted stage's port on ``side`` ("torch" or "mlx"): the module's input (where the entry captures its
    input) or its output (transformers: at the item the module's first stage names; MLX: at each stage's own), its
    array put in the reference's form by ``form(array, entry, key)`` (``key``: "input_back" or "layout")."""
    ports: list[tuple[str, Port]] = []
    first_item: dict[str, Any] = {}
    for stage_id, entry in entries(plan).items():
        path = entry.get(side)
        if path is None or not wanted(stage_id):
            continue
        if entry.get("capture") == "input":
            ports.append((stage_id, argument(path, lambda a, e=entry: form(a, e, "input_back"))))
            continue
        item = entry.get(f"{side}_item") if side == "mlx" else first_item.setdefault(path, entry.get("torch_item"))
        ports.append((stage_id, output(path, lambda a, e=entry: form(a, e, "layout"), _item(item))))
    return ports


def _item(item: Any) -> tuple | None:
    return None if item is None else tuple(item)


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
