"""Which weights a quantization scope quantizes, and which matrix layers stay dense and why.

Quantizable tensors are the matrix weights (``*.weight`` with two axes: linear and embedding layers;
norms, biases and convolutions stay dense), as ``nn.quantize`` quantizes ``Linear`` and ``Embedding``, and the
stacked experts a family names (three axes, ``[experts, out, in]``: mlx-vlm's ``SwitchLinear``, quantized matrix by
matrix along the input axis).
A family's :class:`TensorGroups` says which names belong to the vision side and which to the text
side. A matrix whose input width (last axis) is not a multiple of the group size cannot be
quantized: it stays dense and is reported (e.g. a 588-wide patch embedding at group size 64).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from driftscope.errors import ParameterError

SCOPE_GROUPS = {"vision": ("vision",), "text": ("text",), "all": ("vision", "text")}


@dataclass(frozen=True)
class TensorGroups:
    """Name prefixes of the vision and the text side, in one naming (a checkpoint's or MLX's modules)."""

    vision: tuple[str, ...]
    text: tuple[str, ...]
    #: name suffixes of stacked expert matrices (``[experts, out, in]``), quantizable as the matrices are
    stacked: tuple[str, ...] = ()

    def group(self, name: str) -> str | None:
        """``"vision"``, ``"text"`` or None; vision prefixes are tried first (``model.visual.`` is not text)."""
        if name.startswith(self.vision):
            return "vision"
        if name.startswith(self.text):
            return "text"
        return None


@dataclass(frozen=True)
class LeftDense:
    """A matrix layer in scope that stays dense because its input width is not a multiple of the group size."""

    name: str
    group: str
    input_width: int
    group_size: int

    @property
    def reason(self) -> str:
        return f"input width {self.input_width} is not a multiple of the group size {self.group_size}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "group": self.group, "input_width": self.input_width, "reason": self.reason}


@dataclass(frozen=True)
class Selection:
    """The matrix weights a scope quantizes (sorted names) and the ones it must leave dense."""

    scope: str
    group_size: int
    quantized: tuple[str, ...]
    left_dense: tuple[LeftDense, ...]

    def __contains__(self, name: object) -> bool:
        return name in self.quantized

    def to_dict(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "group_size": self.group_size,
            "quantized": len(self.quantized),
            "left_dense": [layer.to_dict() for layer in self.left_dense],
        }


def is_matrix_weight(name: str, shape: tuple[int, ...], stacked: tuple[str, ...] = ()) -> bool:
    """A linear or embedding weight (two axes), or a stack of expert matrices named by a ``stacked`` suffix."""
    if len(shape) == 3 and stacked and name.endswith(stacked):
        return True
    return name.endswith(".weight") and len(shape) == 2


def select_weights(
    shapes: Mapping[str, tuple[int, ...]],
    groups: TensorGroups,
    group_size: int,
    scope: str = "all",
    required: bool = True,
) -> Selection:
    """The :class:`Selection` of ``scope`` over a checkpoint's ``{name: shape}`` (``required``: selecting nothing
    is an error)."""
    if scope not in SCOPE_GROUPS:
        raise ParameterError(f"quantization scope {scope!r} is not known", f"use one of: {', '.join(SCOPE_GROUPS)}")
    wanted = SCOPE_GROUPS[scope]
    quantized, left = [], []
    for name in sorted(shapes):
        shape = tuple(shapes[name])
        group = groups.group(name)
        if group not in wanted or not is_matrix_weight(name, shape, groups.stacked):
            continue
        if shape[-1] % group_size:
            left.append(LeftDense(name, group, shape[-1], group_size))
        else:
            quantized.append(name)
    if not quantized and required:
        raise ParameterError(
            f"quantization scope {scope!r} selects no matrix weight (group size {group_size}, "
            f"{len(left)} left dense, prefixes vision {groups.vision}, text {groups.text})",
            "check the scope and that the checkpoint is the family's; a smaller group_size may fit its widths",
        )
    return Selection(scope, group_size, tuple(quantized), tuple(left))


def module_predicate(selection: Selection) -> Callable[[str, Any], bool]:
    """An ``nn.quantize`` class predicate quantizing exactly the selected modules (names in MLX's naming).

    The returned function's ``hits`` set collects the module paths it accepted.
    """
    hits: set[str] = set()

    def predicate(path: str, module: Any) -> bool:
        if f"{path}.weight" in selection and hasattr(module, "to_quantized"):
            hits.add(path)
            return True
        return False

    predicate.hits = hits  # type: ignore[attr-defined]
    return predicate
