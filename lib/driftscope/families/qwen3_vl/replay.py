"""What every replayed Qwen3-VL stage needs besides its inputs: the rotary tables, the attention bounds and
the grids, all from the reference run (no windows: everything stays in the processor's order); for the text
stages the prompt's token ids, M-RoPE positions and where its image slots are."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapSet

from ...errors import TapFileError
from ..qwen_shared.plan import TEXT_INPUT
from ..qwen_shared.replay import TextReplay

NEEDED = ("vision.rotary.cos", "vision.rotary.sin", "vision.cu_seqlens", "inputs.grid_thw")


@dataclass
class ReplayContext(TextReplay):
    """Side inputs taken from the reference run."""

    cos: np.ndarray  # [patches, head_dim]
    sin: np.ndarray
    cu_seqlens: np.ndarray  # one segment per image frame
    grid_thw: np.ndarray
    input_ids: np.ndarray | None = None  # the prompt (text stages only)
    text_positions: np.ndarray | None = None  # [3, tokens] M-RoPE position ids
    image_token_id: int | None = None

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
        ctx = cls(
            np.asarray(reference["vision.rotary.cos"], dtype=np.float32),
            np.asarray(reference["vision.rotary.sin"], dtype=np.float32),
            np.asarray(reference["vision.cu_seqlens"]).astype(np.int64),
            np.asarray(reference["inputs.grid_thw"]).astype(np.int64),
        )
        ctx.read_text(reference, plan)
        return ctx

    def stage(self, reference: TapSet, stage_id: str) -> np.ndarray | None:
        """A reference stage as a replay input, or a view: the prompt's embeddings (``text.embeds@sequence``),
        a layer's output with its image slots after the DeepStack add (``text.layer.K.deepstack@sequence``)."""
        if stage_id == TEXT_INPUT:
            return self.text_sequence(reference)
        if stage_id.endswith(".deepstack@sequence"):
            added = stage_id.split("@")[0]
            layer = added.removesuffix(".deepstack")
            if self.input_ids is None or not {added, layer} <= set(reference.stage_ids()):
                return None
            return self.with_image_rows(np.asarray(reference[layer]), np.asarray(reference[added]))
        return np.asarray(reference[stage_id]) if stage_id in reference else None
