"""One runtime's TapSet read together with stages written later into other files (by narrowing).

A run's TapSet is written once, stage by stage, as the runtime captures; narrowing adds the substages of one
block for one runtime pair afterwards, in a file of their own. :class:`TapUnion` reads the two as one TapSet:
every stage from the first file that holds it, the metadata (label, runtime, policy) from the run's own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from driftscope.taps.tapset import TapSet


class TapUnion:
    """``primary`` (a run's TapSet) and ``extras`` (stages added later), read as one TapSet."""

    def __init__(self, primary: TapSet, extras: Sequence[TapSet] = ()):
        self.primary = primary
        self.parts: list[TapSet] = [primary, *extras]
        self.meta = primary.meta
        self.tensor_path, self.sidecar_path = primary.tensor_path, primary.sidecar_path

    @property
    def runtime(self) -> str:
        return self.primary.runtime

    @property
    def label(self) -> str:
        return self.primary.label

    def _owner(self, stage_id: str) -> TapSet:
        for part in self.parts:
            if stage_id in part:
                return part
        raise KeyError(stage_id)

    def stage_ids(self) -> list[str]:
        seen: dict[str, None] = {}
        for part in self.parts:
            seen.update(dict.fromkeys(part.stage_ids()))
        return list(seen)

    def __contains__(self, stage_id: object) -> bool:
        return any(stage_id in part for part in self.parts)

    def declaration(self, stage_id: str) -> dict:
        return self._owner(stage_id).declaration(stage_id) if stage_id in self else {"id": stage_id}

    def __getitem__(self, stage_id: str) -> np.ndarray:
        return self._owner(stage_id)[stage_id]

    def mapped(self, stage_id: str) -> np.ndarray:
        return self._owner(stage_id).mapped(stage_id)

    def rows(self, stage_id: str, start: int, stop: int) -> np.ndarray:
        return self._owner(stage_id).rows(stage_id, start, stop)

    def rows_into(self, stage_id: str, start: int, stop: int, buffer: np.ndarray) -> np.ndarray:
        return self._owner(stage_id).rows_into(stage_id, start, stop, buffer)

    def stored_dtype(self, stage_id: str) -> str:
        return self._owner(stage_id).stored_dtype(stage_id)

    def shape(self, stage_id: str) -> tuple[int, ...]:
        return self._owner(stage_id).shape(stage_id)

    def items(self) -> Iterator[tuple[str, np.ndarray]]:
        for stage_id in self.stage_ids():
            yield stage_id, self[stage_id]


def with_extras(tapset: TapSet, extras: Sequence[TapSet]) -> TapSet | TapUnion:
    """``tapset`` itself when there is nothing to add, else the union."""
    return TapUnion(tapset, extras) if extras else tapset
