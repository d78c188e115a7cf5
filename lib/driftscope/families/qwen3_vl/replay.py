"""What every replayed Qwen3-VL stage needs besides its inputs: the rotary tables, the attention bounds and
the grids, all from the reference run (no windows: everything stays in the processor's order)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapSet

from ...errors import TapFileError

NEEDED = ("vision.rotary.cos", "vision.rotary.sin", "vision.cu_seqlens", "inputs.grid_thw")


@dataclass
class ReplayContext:
    """Side inputs taken from the reference run."""

    cos: np.ndarray  # [patches, head_dim]
    sin: np.ndarray
    cu_seqlens: np.ndarray  # one segment per image frame
    grid_thw: np.ndarray

    @property
    def segments(self) -> np.ndarray:
        """The frame id of every patch row (what the compiled attention masks by)."""
        return np.repeat(np.arange(len(self.cu_seqlens) - 1, dtype=np.int32), np.diff(self.cu_seqlens))

    @classmethod
    def from_plan(cls, reference: TapSet, plan: StagePlan) -> ReplayContext:
        missing = [stage for stage in NEEDED if stage not in reference]
        if missing:
            raise TapFileError(
                f"the reference TapSet {reference.tensor_path.name} lacks {missing} needed to replay",
                "capture the side stages (they are in every default stage selection)",
            )
        return cls(
            np.asarray(reference["vision.rotary.cos"], dtype=np.float32),
            np.asarray(reference["vision.rotary.sin"], dtype=np.float32),
            np.asarray(reference["vision.cu_seqlens"]).astype(np.int64),
            np.asarray(reference["inputs.grid_thw"]).astype(np.int64),
        )

    def stage(self, reference: TapSet, stage_id: str) -> np.ndarray | None:
        """A reference stage as a replay input."""
        return np.asarray(reference[stage_id]) if stage_id in reference else None
