"""The text side of a Qwen replay context: the prompt, its M-RoPE positions, where its image slots are, and the
whole-sequence input of text layer 0."""

from __future__ import annotations

import numpy as np

from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapSet


class TextReplay:
    """Mixed into a family's replay context (a dataclass declaring ``input_ids``, ``text_positions`` and
    ``image_token_id``, all None until :meth:`read_text` finds the prompt in the reference)."""

    input_ids: np.ndarray | None  # the prompt (text stages only)
    text_positions: np.ndarray | None  # [3, tokens] M-RoPE position ids
    image_token_id: int | None
    video_token_id: int | None = None

    @property
    def image_slots(self) -> np.ndarray:
        """Where the prompt's image placeholders are, and its video placeholders (a [tokens] mask): the slots the
        tower's merged rows fill."""
        slots = self.input_ids == self.image_token_id
        return slots | (self.input_ids == self.video_token_id) if self.video_token_id is not None else slots

    def read_text(self, reference: TapSet, plan: StagePlan) -> None:
        """The prompt's ids and positions from the reference (when it followed the prompt past the tower)."""
        if "text.input_ids" in reference and "text.position_ids" in reference:
            self.input_ids = np.asarray(reference["text.input_ids"]).astype(np.int64)
            self.text_positions = np.asarray(reference["text.position_ids"]).astype(np.int64)
            self.image_token_id = int(plan.meta.get("image_token_id", -1))
            self.video_token_id = plan.meta.get("video_token_id")

    def text_sequence(self, reference: TapSet) -> np.ndarray | None:
        """The whole prompt's input embeddings: image slots from ``text.embeds.image``, the rest from
        ``text.embeds.text``."""
        if self.input_ids is None or not {"text.embeds.image", "text.embeds.text"} <= set(reference.stage_ids()):
            return None
        return self.with_image_rows(
            np.asarray(reference["text.embeds.text"]), np.asarray(reference["text.embeds.image"])
        )

    def with_image_rows(self, rest: np.ndarray, image: np.ndarray) -> np.ndarray:
        """A [tokens, hidden] sequence: ``image`` at the image slots, ``rest`` (the text rows, or all) elsewhere."""
        sequence = np.zeros((len(self.input_ids), image.shape[-1]), dtype=np.float32)
        if len(rest) == len(sequence):
            sequence[:] = rest
        else:
            sequence[~self.image_slots] = rest
        sequence[self.image_slots] = image
        return sequence
