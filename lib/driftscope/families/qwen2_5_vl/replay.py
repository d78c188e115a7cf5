"""What every replayed Qwen2.5-VL stage needs besides its inputs: rotary tables, attention bounds, window order;
for the text stages the prompt's token ids, M-RoPE positions and where its image slots are."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapSet

from ..qwen_shared.replay import TextReplay
from .plan import BLOCK0_INPUT, TEXT_INPUT


@dataclass
class ReplayContext(TextReplay):
    """Side inputs taken from the reference run, in window order where the blocks need them."""

    cos: np.ndarray  # [patches, head_dim], window order
    sin: np.ndarray
    cu_seqlens: np.ndarray
    cu_window_seqlens: np.ndarray
    window_index: np.ndarray  # merged-token permutation
    full_blocks: frozenset[int]
    merge_unit: int
    input_ids: np.ndarray | None = None  # the prompt (text stages only)
    text_positions: np.ndarray | None = None  # [3, tokens] M-RoPE position ids
    image_token_id: int | None = None

    def bounds(self, block: int) -> np.ndarray:
        return self.cu_seqlens if block in self.full_blocks else self.cu_window_seqlens

    def to_window(self, raster: np.ndarray) -> np.ndarray:
        """Patch rows from raster (processor) order to window order."""
        grouped = raster.reshape(len(self.window_index), self.merge_unit, *raster.shape[1:])
        return grouped[self.window_index].reshape(raster.shape)

    @classmethod
    def from_tapset(cls, reference: TapSet, full_blocks, merge_unit: int = 4) -> ReplayContext:
        needed = [
            "vision.rotary.cos",
            "vision.rotary.sin",
            "vision.cu_seqlens",
            "vision.cu_window_seqlens",
            "vision.window_index",
        ]
        missing = [stage for stage in needed if stage not in reference]
        if missing:
            from ...errors import TapFileError

            raise TapFileError(
                f"the reference TapSet {reference.tensor_path.name} lacks {missing} needed to replay",
                "capture the side stages (they are in every default stage selection)",
            )
        window_index = np.asarray(reference["vision.window_index"]).astype(np.int64)
        ctx = cls(
            np.zeros(0),
            np.zeros(0),
            np.asarray(reference["vision.cu_seqlens"]).astype(np.int64),
            np.asarray(reference["vision.cu_window_seqlens"]).astype(np.int64),
            window_index,
            frozenset(int(b) for b in full_blocks),
            merge_unit,
        )
        ctx.cos = ctx.to_window(np.asarray(reference["vision.rotary.cos"], dtype=np.float32))
        ctx.sin = ctx.to_window(np.asarray(reference["vision.rotary.sin"], dtype=np.float32))
        return ctx

    @classmethod
    def from_plan(cls, reference: TapSet, plan: StagePlan) -> ReplayContext:
        ctx = cls.from_tapset(
            reference, plan.meta.get("fullatt_block_indexes", []), int(plan.meta.get("spatial_merge_size", 2)) ** 2
        )
        ctx.read_text(reference, plan)
        return ctx

    def stage(self, reference: TapSet, stage_id: str) -> np.ndarray | None:
        """A reference stage as a replay input (the block-0 input is the patch embedding in window order)."""
        if stage_id == BLOCK0_INPUT:
            if "vision.patch_embed" not in reference:
                return None
            return self.to_window(np.asarray(reference["vision.patch_embed"]))
        if stage_id == TEXT_INPUT:
            return self.text_sequence(reference)
        return np.asarray(reference[stage_id]) if stage_id in reference else None
