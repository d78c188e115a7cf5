"""How one side's array is laid out as the other side's: an axis permutation, then adjacent axes merged (or
singleton axes dropped or added). Found from the two shapes a probe saw, or declared by what a module is (an MLX
convolution is channels-last where torch's is channels-first); never guessed where two layouts could fit.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

#: the largest rank whose permutations are searched
MAX_RANK = 6


@dataclass(frozen=True)
class Layout:
    """The size-1 axes ``drop`` removed first, then ``perm`` applied (numpy transpose), then the permuted axes
    grouped in order: output axis ``k`` is the product of the axes of ``groups[k]`` (an empty group is a new axis of
    size 1)."""

    perm: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]
    why: str = ""
    drop: tuple[int, ...] = ()

    @property
    def identity(self) -> bool:
        rank = len(self.perm)
        return not self.drop and self.perm == tuple(range(rank)) and self.groups == tuple((i,) for i in range(rank))

    def apply(self, array: np.ndarray) -> np.ndarray:
        """``array`` in the other side's layout (a ValueError when its shape does not allow it)."""
        if self.drop:
            array = np.squeeze(array, axis=self.drop)
        moved = np.transpose(array, self.perm)
        shape = [math.prod(moved.shape[i] for i in group) for group in self.groups]
        return np.ascontiguousarray(moved.reshape(shape))

    def describe(self) -> str:
        if self.identity:
            return "same layout"
        steps = [f"size-1 axes {list(self.drop)} dropped"] if self.drop else []
        if self.perm != tuple(range(len(self.perm))):
            steps.append(f"axes permuted {list(self.perm)}")
        if self.groups != tuple((i,) for i in range(len(self.perm))):
            steps.append("axes grouped " + " ".join("(" + ",".join(map(str, g)) + ")" for g in self.groups))
        return "; ".join(steps) + (f" ({self.why})" if self.why else "")

    def to_dict(self) -> dict:
        return {
            "perm": list(self.perm),
            "groups": [list(g) for g in self.groups],
            "why": self.why,
            "drop": list(self.drop),
        }

    @classmethod
    def from_dict(cls, data: dict) -> Layout:
        groups = tuple(tuple(g) for g in data["groups"])
        return cls(tuple(data["perm"]), groups, data.get("why", ""), tuple(data.get("drop", ())))


def _groups(shape: tuple[int, ...], target: tuple[int, ...]) -> tuple[tuple[int, ...], ...] | None:
    """Contiguous runs of ``shape``'s axes whose products are ``target``'s sizes (a size-1 target axis takes a
    size-1 axis or none; size-1 axes left over are dropped); None if there are none."""

    def walk(i: int, k: int) -> list[tuple[int, ...]] | None:
        if k == len(target):
            return [] if all(size == 1 for size in shape[i:]) else None
        if target[k] == 1:
            if i < len(shape) and shape[i] == 1:
                rest = walk(i + 1, k + 1)
                if rest is not None:
                    return [(i,), *rest]
            rest = walk(i, k + 1)
            return None if rest is None else [(), *rest]
        product, j = 1, i
        while j < len(shape) and product < target[k]:
            product *= shape[j]
            j += 1
        if product != target[k]:
            return None
        rest = walk(j, k + 1)
        return None if rest is None else [tuple(range(i, j)), *rest]

    found = walk(0, 0)
    return None if found is None else tuple(found)


def channels_last_to_first(rank: int) -> tuple[int, ...]:
    """The permutation taking ``[N, *spatial, C]`` to ``[N, C, *spatial]``."""
    return (0, rank - 1, *range(1, rank - 1))


def find_layout(source: list[int], target: list[int], declared: tuple[int, ...] | None = None) -> Layout | str:
    """How an array of shape ``source`` becomes ``target``: a :class:`Layout`, or why none can be chosen (no
    candidate fits, or more than one does). ``declared``: the permutation a module's kind declares (tried first).

    The same order of axes, merged or split where needed, is taken first; else the permutations of the axes that
    are not 1 (size-1 axes dropped): the one that fits, or the only one that fits by moving a single axis."""
    source, target = tuple(source), tuple(target)
    if math.prod(source) != math.prod(target):
        return f"not comparable: {list(source)} and {list(target)} hold different numbers of elements"
    if declared is not None:
        groups = _groups(tuple(source[i] for i in declared), target)
        if groups is not None:
            return Layout(declared, groups, "the module's declared channel order")
    identity = tuple(range(len(source)))
    groups = _groups(source, target)
    if groups is not None:
        return Layout(identity, groups)
    drop = tuple(i for i, size in enumerate(source) if size == 1)
    kept = tuple(size for size in source if size != 1)
    if len(kept) > MAX_RANK:
        return f"not comparable: {list(source)} vs {list(target)}: declare its layout"
    fits = []
    for perm in itertools.permutations(range(len(kept))):
        groups = _groups(tuple(kept[i] for i in perm), target)
        if groups is not None:
            fits.append(Layout(perm, groups, "", drop))
    moves = [layout for layout in fits if _moves_one_axis(layout.perm)]
    if len(fits) == 1:
        return fits[0]
    if len(moves) == 1:
        chosen = moves[0]
        why = f"the one layout of {len(fits)} that fit these shapes moving a single axis"
        return Layout(chosen.perm, chosen.groups, why, chosen.drop)
    if not fits:
        return f"not comparable: no order of the axes of {list(source)} gives {list(target)}: declare its layout"
    return (
        f"not comparable: {len(fits)} layouts take {list(source)} to {list(target)} "
        f"(e.g. {list(fits[0].perm)} and {list(fits[1].perm)}): declare its layout"
    )


def _moves_one_axis(perm: tuple[int, ...]) -> bool:
    """Whether ``perm`` moves a single axis and keeps the others in order."""
    for axis in range(len(perm)):
        rest = [a for a in perm if a != axis]
        if rest == sorted(rest):
            return True
    return False
