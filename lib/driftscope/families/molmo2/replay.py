"""What every replayed Molmo2 stage needs besides its inputs: the pooling indices and the selected layers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapSet

from ...errors import TapFileError


@dataclass
class ReplayContext:
    """Side inputs taken from the reference run."""

    pooling: np.ndarray  # [tokens, slots] int64, -1 for padding
    selected_layers: tuple[int, ...]  # resolved, configured order (the plan's)

    @property
    def valid(self) -> np.ndarray:
        return self.pooling >= 0

    def flat_pooling(self) -> np.ndarray:
        """Indices that gather ``pool.gathered`` rows back in order: row ``t * slots + s``, -1 where padded."""
        tokens, slots = self.pooling.shape
        return np.where(self.valid, np.arange(tokens * slots).reshape(tokens, slots), -1).astype(np.int64)

    def slot(self, layer: int) -> int:
        return self.selected_layers.index(layer)

    @classmethod
    def from_plan(cls, reference: TapSet, plan: StagePlan) -> ReplayContext:
        if "inputs.pooling" not in reference:
            raise TapFileError(
                f"the reference TapSet {reference.tensor_path.name} lacks inputs.pooling, needed to replay the pooler",
                "capture the inputs stages (they are in every default stage selection)",
            )
        return cls(
            np.asarray(reference["inputs.pooling"]).astype(np.int64),
            tuple(int(layer) for layer in plan.meta.get("selected_layers", [])),
        )

    def stage(self, reference: TapSet, stage_id: str) -> np.ndarray | None:
        return np.asarray(reference[stage_id]) if stage_id in reference else None
