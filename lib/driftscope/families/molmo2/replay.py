"""What every replayed Molmo2 stage needs besides its inputs: the pooling indices and the selected layers; for
the text stages the prompt's token ids and where its ``<im_patch>`` slots are."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapSet

from ...errors import TapFileError
from .plan import TEXT_INPUT


@dataclass
class ReplayContext:
    """Side inputs taken from the reference run."""

    pooling: np.ndarray  # [tokens, slots] int64, -1 for padding
    selected_layers: tuple[int, ...]  # resolved, configured order (the plan's)
    input_ids: np.ndarray | None = None  # the prompt (text stages only)
    image_token_id: int | None = None  # <im_patch>

    @property
    def valid(self) -> np.ndarray:
        return self.pooling >= 0

    @property
    def image_slots(self) -> np.ndarray:
        """Where the prompt's ``<im_patch>`` tokens are (a [tokens] mask)."""
        return self.input_ids == self.image_token_id

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
        ctx = cls(
            np.asarray(reference["inputs.pooling"]).astype(np.int64),
            tuple(int(layer) for layer in plan.meta.get("selected_layers", [])),
        )
        if "text.input_ids" in reference:
            ctx.input_ids = np.asarray(reference["text.input_ids"]).astype(np.int64)
            ctx.image_token_id = int(plan.meta.get("image_token_id", -1))
        return ctx

    def stage(self, reference: TapSet, stage_id: str) -> np.ndarray | None:
        """A reference stage as a replay input (``text.embeds@sequence``: the whole prompt's embeddings)."""
        if stage_id == TEXT_INPUT:
            return self.text_sequence(reference)
        return np.asarray(reference[stage_id]) if stage_id in reference else None

    def text_sequence(self, reference: TapSet) -> np.ndarray | None:
        """The whole prompt's input embeddings: image slots from ``text.embeds.image``, the rest from
        ``text.embeds.text``."""
        if self.input_ids is None or not {"text.embeds.image", "text.embeds.text"} <= set(reference.stage_ids()):
            return None
        image, text = np.asarray(reference["text.embeds.image"]), np.asarray(reference["text.embeds.text"])
        sequence = np.zeros((len(self.input_ids), image.shape[-1]), dtype=np.float32)
        sequence[self.image_slots] = image
        sequence[~self.image_slots] = text
        return sequence
