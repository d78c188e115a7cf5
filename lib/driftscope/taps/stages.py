"""Stage ids, their declarations, and the ordered StagePlan of one model family and config.

A stage declares its axes, its token order (``window`` or ``raster``; ``none`` for tensors without
tokens), the unit of a token row (``patch`` or ``merged``), and whether its values are integers
(compared exactly). A ``data`` stage (processor output, index math) is not computed by the model's
operators: it is compared exactly and never replayed. A ``rotary`` stage holds vectors rotated by RoPE: its
float32 round-off grows with the position, and the judge derives the bound it may use from the declaration
(``judge.bounds``, docs/bounds.md). Two runtimes' taps are compared only through these declarations.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np

#: What a pre-norm ViT block's attention half reads, by substage name ("in": the block's input); a family's
#: ``SUBSTAGE_INPUTS`` adds its MLP's.
VIT_ATTENTION_INPUTS: dict[str, tuple[str, ...]] = {
    "norm1": ("in",),
    "attn.q": ("norm1",),
    "attn.k": ("norm1",),
    "attn.v": ("norm1",),
    "attn.context": ("attn.q", "attn.k", "attn.v"),
    "attn.out": ("attn.context",),
    "residual1": ("in", "attn.out"),
    "norm2": ("residual1",),
}
#: What a two-layer MLP (fc1, activation, fc2) after ``norm2`` reads.
VIT_MLP_INPUTS: dict[str, tuple[str, ...]] = {
    "mlp.fc1": ("norm2",),
    "mlp.act": ("mlp.fc1",),
    "mlp.fc2": ("mlp.act",),
}


def block_stage_id(block: int, substage: str | None = None) -> str:
    """The stage id of a vision block (``vision.block.3``) or of one of its substages (``vision.block.3.mlp.fc1``)."""
    return f"vision.block.{block}" if substage is None else f"vision.block.{block}.{substage}"


@dataclass(frozen=True)
class Rotary:
    """How a stage's vectors are rotated by RoPE (its last axis: the first ``2 * len(inv_freq)`` channels rotate,
    any further ones do not).

    ``inv_freq``: each frequency's angle per position (radians); ``pairing``: which channels rotate together,
    ``half`` (channel i with i + d/2, transformers' ``rotate_half``) or ``interleaved`` (2i with 2i + 1);
    ``axis``: the stage's axis of positions; ``positions``: the integer stage holding each position's rotary
    positions (tokens on its last axis; leading axes, e.g. M-RoPE's t, h, w, are maxed over), None when a
    position is its index. Positions past those the stage holds (decoded tokens) continue one a step."""

    inv_freq: tuple[float, ...]
    pairing: str = "half"
    axis: int = -2
    positions: str | None = None

    @classmethod
    def default(cls, theta: float, rotary_dim: int, **declared) -> Rotary:
        """The standard frequencies ``theta ** (-2i / rotary_dim)``, computed in float64."""
        inv_freq = float(theta) ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
        return cls(tuple(float(f) for f in inv_freq), **declared)

    @classmethod
    def from_dict(cls, data: dict) -> Rotary:
        return cls(**{**data, "inv_freq": tuple(float(f) for f in data["inv_freq"])})


@dataclass(frozen=True)
class Stage:
    """One tappable point of a model, with a declared meaning."""

    id: str
    axes: tuple[str, ...]
    token_order: str = "none"  # "raster" | "window" | "none"
    token_unit: str | None = None  # "patch" | "merged" | None
    integer: bool = False
    block: int | None = None
    substage: str | None = None
    side: bool = False  # a side input (e.g. RoPE tables), not on the activation path
    description: str = ""
    data: bool = False  # inputs or index math, not the model's operators: compared exactly, never replayed
    rotary: Rotary | None = None  # vectors rotated by RoPE: the judge derives a position-dependent bound

    def to_dict(self) -> dict:
        out = asdict(self)
        out["axes"] = list(self.axes)
        if self.rotary is None:
            out.pop("rotary")  # plans without RoPE stages read as they did
        else:
            out["rotary"]["inv_freq"] = list(self.rotary.inv_freq)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Stage:
        data = dict(data)
        data["axes"] = tuple(data.get("axes", ()))
        if isinstance(data.get("rotary"), dict):
            data["rotary"] = Rotary.from_dict(data["rotary"])
        return cls(**data)


@dataclass(frozen=True)
class StageSelection:
    """Which stages a run captures.

    ``blocks``: capture every block's output. ``substages``: block indices whose substages are
    captured (``"all"`` for every block, and the pieces of layers that are no numbered block, e.g. a decoder
    layer's, which narrowing otherwise captures when it needs them). ``include``/``exclude``: extra glob patterns.
    """

    blocks: bool = True
    substages: tuple[int, ...] | str = ()
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @classmethod
    def everything(cls) -> StageSelection:
        return cls(blocks=True, substages="all")

    def check_depth(self, depth: int) -> None:
        """Refuse block indices a tower of ``depth`` blocks does not have (``-depth`` up to ``depth - 1``): taken
        modulo the depth, ``substages: [99]`` on 8 blocks would have captured block 3's."""
        from driftscope.errors import ParameterError

        if self.substages == "all" or not depth:
            return
        outside = [index for index in self.substages if not -depth <= index < depth]
        if outside:
            raise ParameterError(
                f"stages.substages {outside} are not blocks of this checkpoint's {depth}-block tower",
                f"use block indices 0..{depth - 1} (or -1 for the last)",
            )

    def wants(self, stage: Stage, depth: int) -> bool:
        if any(fnmatch.fnmatchcase(stage.id, pattern) for pattern in self.exclude):
            return False
        if any(fnmatch.fnmatchcase(stage.id, pattern) for pattern in self.include):
            return True
        if stage.block is None:  # a piece of an unnumbered layer (a decoder layer's): captured when asked for all
            return stage.substage is None or self.substages == "all"
        if stage.substage is None:
            return self.blocks
        if self.substages == "all":
            return True
        wanted = {index % depth for index in self.substages}  # negative indices count from the end
        return stage.block in wanted

    def to_dict(self) -> dict:
        return {
            "blocks": self.blocks,
            "substages": self.substages if isinstance(self.substages, str) else list(self.substages),
            "include": list(self.include),
            "exclude": list(self.exclude),
        }


@dataclass
class StagePlan:
    """The stages of one family and config, in execution order."""

    family: str
    stages: list[Stage]
    depth: int = 0
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._index = {stage.id: position for position, stage in enumerate(self.stages)}

    def __iter__(self) -> Iterator[Stage]:
        return iter(self.stages)

    def __len__(self) -> int:
        return len(self.stages)

    def __contains__(self, stage_id: object) -> bool:
        return stage_id in self._index

    def __getitem__(self, stage_id: str) -> Stage:
        return self.stages[self._index[stage_id]]

    def position(self, stage_id: str) -> int:
        return self._index[stage_id]

    def ids(self) -> list[str]:
        return [stage.id for stage in self.stages]

    def select(self, selection: StageSelection) -> StagePlan:
        selection.check_depth(self.depth)
        kept = [stage for stage in self.stages if selection.wants(stage, self.depth)]
        return StagePlan(self.family, kept, self.depth, dict(self.meta))

    def with_stages(self, stage_ids: Iterable[str], full: StagePlan) -> StagePlan:
        """This plan plus ``stage_ids`` (declared by ``full``), in ``full``'s execution order."""
        wanted = set(self.ids()) | set(stage_ids)
        kept = [stage for stage in full if stage.id in wanted]
        kept += [stage for stage in self.stages if stage.id not in full]  # e.g. text stages ``full`` lacks
        return StagePlan(self.family, kept, self.depth, dict(self.meta))

    def ordered(self, stage_ids: Iterable[str]) -> list[str]:
        """``stage_ids`` sorted by execution order; ids not in the plan go last, alphabetically."""
        known = sorted((i for i in stage_ids if i in self._index), key=self._index.__getitem__)
        unknown = sorted(i for i in stage_ids if i not in self._index)
        return known + unknown


@dataclass(frozen=True)
class TokenOrder:
    """How rows of a stage in a non-raster token order go back to raster order: ``index`` is the integer
    stage (captured by each side) holding the permutation, applied to groups of ``rows_per_index[unit]``
    rows; ``segments``, when the order visits segments (e.g. attention windows), the integer stage of their
    bounds in rows of ``segment_unit``. A family declares its orders in its plan's ``meta["token_orders"]``."""

    index: str
    rows_per_index: dict[str, int]
    segments: str | None = None
    segment_unit: str = "patch"

    @classmethod
    def of(cls, plan: StagePlan | None, token_order: str | None) -> TokenOrder | None:
        return orders_of(plan).get(token_order or "")

    def group(self, unit: str | None) -> int:
        return int(self.rows_per_index.get(unit or "", 1))

    def is_permutation(self, index: np.ndarray, rows: int, unit: str | None) -> bool:
        """Whether ``index`` permutes the ``rows`` rows of a stage in ``unit`` (groups of ``group(unit)``)."""
        size = rows // max(self.group(unit), 1)
        index = np.asarray(index).reshape(-1)
        return len(index) == size and np.array_equal(np.sort(index), np.arange(size))

    def to_raster(self, array: np.ndarray, permutation: np.ndarray, unit: str | None) -> np.ndarray:
        """Rows of ``array`` put back in raster order using that runtime's own ``permutation``."""
        reverse = np.argsort(np.asarray(permutation).reshape(-1), kind="stable")
        grouped = array.reshape(len(reverse), self.group(unit), *array.shape[1:])
        return grouped[reverse].reshape(array.shape)


def orders_of(plan: StagePlan | None) -> dict[str, TokenOrder]:
    """The non-raster token orders ``plan`` declares, by name."""
    declared = (plan.meta if plan else {}).get("token_orders") or {}
    return {
        name: TokenOrder(
            entry["index"],
            dict(entry["rows_per_index"]),
            entry.get("segments"),
            entry.get("segment_unit", "patch"),
        )
        for name, entry in declared.items()
    }
