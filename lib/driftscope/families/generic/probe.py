"""What one library's loaded model is, read from the model itself: its modules, the tensors each one owns (as
moments that a transposition, a reshape or a split leaves unchanged), and what one forward on a small input shows
(which modules run, in what order, the shape of what each takes and returns, and which module's output each one
reads). Two such probes, one per library, are what the generic family aligns (``align``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from driftscope.taps.outputs import leaves

#: moments of a tensor's values: count, sum, sum of squares, sum of cubes (float64); additive over tensors, so a
#: module's subtree is the sum of its parameters', and unchanged by any permutation of the elements
MOMENTS = 4


def moments(values: np.ndarray) -> np.ndarray:
    """The moments of ``values`` (float64 accumulation of the float32 values, in chunks)."""
    flat = np.asarray(values).reshape(-1)
    out = np.zeros(MOMENTS)
    out[0] = flat.size
    step = 1 << 22
    for start in range(0, flat.size, step):
        chunk = flat[start : start + step].astype(np.float64)
        square = chunk * chunk
        out[1] += chunk.sum()
        out[2] += square.sum()
        out[3] += (square * chunk).sum()
    return out


def same_moments(a: Iterable[float], b: Iterable[float], rtol: float = 1e-7) -> bool:
    """Whether two moment vectors describe the same values (summation order aside)."""
    a, b = np.asarray(list(a)), np.asarray(list(b))
    if a[0] != b[0] or a[0] == 0:
        return False
    scale = np.array([1.0, np.sqrt(b[2] * b[0]), b[2], np.sqrt(b[2] ** 3 * b[0])]) + 1e-30
    return bool(np.all(np.abs(a - b) <= rtol * scale))


@dataclass
class ModuleFacts:
    """One module of one library's model."""

    path: str  # dotted attribute path from the model's root ("" is the root)
    kind: str  # its class name
    own: list[float]  # moments of the tensors it holds itself (zeros: none)
    subtree: list[float]  # moments of every tensor under it
    order: int = -1  # when its first call started in the probe forward (-1: not called)
    done: int = -1  # when that call returned (starts and returns share one count)
    calls: int = 0
    in_shape: list[int] | None = None  # its main input's shape at the first call
    in_integer: bool = False  # whether that input holds integers (token ids, indices)
    out_shape: list[int] | None = None  # its output's shape (the first array of what it returns, or out_item's)
    out_item: list | None = None  # where its output sits in what it returns (``output_choice``), if not first
    first_shape: list[int] | None = None  # the shape of the first array it returns, where out_item names another
    out_scale: float | None = None  # the constant it multiplies its output by (a scaled embedding's embed_scale)
    input_from: str | None = None  # the module whose output its main input is (the same array)
    output_of: str | None = None  # a module under it whose output it returns as is (a wrapper)
    input_of: str | None = None  # a module under it that takes its input as is

    @property
    def called(self) -> bool:
        return self.calls > 0

    @property
    def has_weights(self) -> bool:
        return self.subtree[0] > 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SideProbe:
    """Every module of one library's model, by path."""

    side: str  # "transformers" or "mlx"
    modules: dict[str, ModuleFacts] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"side": self.side, "modules": [m.to_dict() for m in self.modules.values()], "notes": self.notes}

    @classmethod
    def from_dict(cls, data: dict) -> SideProbe:
        modules = {entry["path"]: ModuleFacts(**entry) for entry in data["modules"]}
        return cls(data["side"], modules, list(data.get("notes", [])))

    def children(self, path: str) -> list[ModuleFacts]:
        """The modules directly under ``path``, in registration order."""
        if not hasattr(self, "_children"):
            self._children: dict[str, list[ModuleFacts]] = {}
            for facts in self.modules.values():
                above = self.parent(facts.path)
                if above is not None:
                    self._children.setdefault(above, []).append(facts)
        return list(self._children.get(path, []))

    def parent(self, path: str) -> str | None:
        return parent_of(path, self.modules)


def parent_of(path: str, modules: dict) -> str | None:
    """The nearest module above ``path`` (lists of modules are not modules: ``layers.0``'s parent is the owner of
    ``layers``)."""
    if not path:
        return None
    parts = path.split(".")
    for cut in range(len(parts) - 1, -1, -1):
        candidate = ".".join(parts[:cut])
        if candidate in modules:
            return candidate
    return None


def subtree_moments(param_moments: dict[str, np.ndarray], paths: Iterable[str]) -> dict[str, np.ndarray]:
    """Each module path's subtree moments: the sum over the parameters under it (``module.weight`` is under
    ``module``)."""
    out = {path: np.zeros(MOMENTS) for path in paths}
    for name, values in param_moments.items():
        parts = name.split(".")
        for cut in range(len(parts)):
            prefix = ".".join(parts[:cut])
            if prefix in out:
                out[prefix] += values
    return out


class ForwardRecord:
    """What the probe forward records, shared by both libraries' probes: call order and counts, shapes, and the
    producer of each array (arrays are held until the probe ends, so an ``id`` is never reused meanwhile)."""

    def __init__(self, modules: dict[str, ModuleFacts]):
        self.modules = modules
        self.next_order = 0
        self.produced: dict[int, str] = {}  # id(array) -> the module whose output it is (the innermost first)
        self.held: list = []
        self.inputs: dict[str, int] = {}  # path -> id of its main input at the first call

    def started(self, path: str, main_input, shape: list[int] | None, integer: bool = False) -> None:
        facts = self.modules[path]
        facts.calls += 1
        if facts.calls > 1:
            return
        facts.order = self.next_order
        self.next_order += 1
        facts.in_shape = shape
        facts.in_integer = integer
        if main_input is not None:
            self.held.append(main_input)
            self.inputs[path] = id(main_input)
            facts.input_from = self.produced.get(id(main_input))

    def finished(self, path: str, main_output, shape: list[int] | None) -> None:
        facts = self.modules[path]
        if facts.calls > 1 or facts.done >= 0:
            return
        facts.done = self.next_order
        self.next_order += 1
        if main_output is None:
            return
        facts.out_shape = shape
        self.held.append(main_output)
        inner = self.produced.get(id(main_output))
        if inner is not None and inner != path and inner.startswith(f"{path}." if path else ""):
            facts.output_of = inner  # it hands back what a module under it returned
        else:
            self.produced[id(main_output)] = path
        taker = next(
            (
                other
                for other, seen in self.inputs.items()
                if seen == self.inputs.get(path) and other != path and other.startswith(f"{path}." if path else "")
            ),
            None,
        )
        facts.input_of = taker


def output_choice(out: Any, last_inner: Any, is_array: Callable[[Any], bool]) -> tuple[tuple | None, Any]:
    """A module's output among what it returns, and where it sits: where it returns several arrays, the one the
    last module called directly under it returned (what it computed last: mlx-vlm's towers return tuples such as
    ``(embeddings, hidden_1, ..., hidden_n)``, transformers' ``last_hidden_state`` beside a merger's
    ``pooler_output``), else its first array; ``where`` is None for the first array."""
    found = leaves(out, is_array)
    if not found:
        return None, None
    if len(found) > 1 and last_inner is not None:
        for where, array in found[1:]:
            if array is last_inner:
                return where, array
    return None, found[0][1]


def embed_scale(module: Any) -> float | None:
    """The constant a scaled embedding multiplies its rows by inside the module (its ``embed_scale``: transformers'
    Gemma embeddings), None for a plain module."""
    value = getattr(module, "embed_scale", None)
    if value is None or isinstance(value, bool):
        return None
    try:
        found = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):  # not one number
        return None
    return None if found == 1.0 else found
