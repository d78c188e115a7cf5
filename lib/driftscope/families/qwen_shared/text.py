"""The Qwen prompt side: the chat format around the images, the prompt stages every runtime writes, and the
decoder's stages on its modules."""

from __future__ import annotations

import numpy as np

from driftscope.inputs.processor_output import ModelInputs
from driftscope.inputs.text_inputs import DEFAULT_PROMPT, TextInputs, prompt_tokenizer
from driftscope.taps.module_taps import ModuleTap, decoder_taps

from ...errors import InputError
from .tokenizer import QWEN2_TOKENIZERS
from .video_text import video_prompt


def build_text_inputs(
    checkpoint,
    inputs: ModelInputs,
    prompt: str = DEFAULT_PROMPT,
    max_new_tokens: int = 16,
    expect: list[str] | None = None,
    *,
    video_style: str = "seconds_per_grid",
) -> TextInputs:
    """Qwen chat format: each image as <|vision_start|> n x <|image_pad|> <|vision_end|>, then each video in the
    family's ``video_style`` (``qwen_shared.video_text``), then the prompt."""
    videos = list(inputs.facts.get("videos") or [])
    grid_thw = np.asarray(inputs["grid_thw"]).tolist()
    image_grids = grid_thw[: len(grid_thw) - len(videos)]
    image_tokens = inputs.image_tokens.tolist()[: len(image_grids)]
    tokenizer = prompt_tokenizer(checkpoint.path, QWEN2_TOKENIZERS)
    config = checkpoint.config
    vision = config.get("vision_config") or {}
    merge = int(vision.get("spatial_merge_size", 2))
    temporal = int(vision.get("temporal_patch_size", 2))
    clip = video_prompt(
        videos, grid_thw[len(image_grids) :], merge, temporal, video_style, vision.get("tokens_per_second", 4)
    )
    images = "".join("<|vision_start|>" + "<|image_pad|>" * int(n) + "<|vision_end|>" for n in image_tokens)
    text = f"<|im_start|>user\n{images}{clip.text}{prompt}<|im_end|>\n<|im_start|>assistant\n"
    ids = np.asarray(tokenizer(text)["input_ids"], dtype=np.int64)
    image_token_id = int(config.get("image_token_id", tokenizer.convert_tokens_to_ids("<|image_pad|>")))
    _check_count(ids, image_token_id, sum(int(n) for n in image_tokens), "image", "<|image_pad|>")
    out = TextInputs(ids, image_token_id, prompt, int(max_new_tokens), list(expect or []))
    if videos:
        out.video_token_id = int(config.get("video_token_id", tokenizer.convert_tokens_to_ids("<|video_pad|>")))
        expected = sum(t * h * w // (merge * merge) for t, h, w in grid_thw[len(image_grids) :])
        _check_count(ids, out.video_token_id, expected, "video", "<|video_pad|>")
        out.position_grids = image_grids + clip.grids
        out.time_intervals = [1] * len(image_grids) + clip.intervals
        out.second_per_grid_ts = clip.second_per_grid_ts
        inputs.facts["video_prompt"] = {"style": video_style, "videos": clip.facts}
    return out


def _check_count(ids: np.ndarray, token_id: int, expected: int, what: str, token: str) -> None:
    found = int((ids == token_id).sum())
    if found != expected:
        raise InputError(
            f"the tokenizer turned {expected} {what} placeholders into {found} {what} tokens",
            f"use the checkpoint's own tokenizer, where {token} is one special token",
        )


def put_text_inputs(
    inputs: ModelInputs,
    sink,
    embeds: np.ndarray,
    token_rows: np.ndarray,
    position_ids: np.ndarray,
    rope_deltas: np.ndarray,
) -> None:
    """The prompt-side stages every text-capable runtime writes the same way (M-RoPE positions: t, h, w)."""
    text = inputs.text
    image = text.vision_slots  # the image slots, then the video slots (the tower's rows in packed order)
    sink.put("text.input_ids", text.input_ids)
    sink.put("text.position_ids", np.asarray(position_ids).reshape(3, -1))
    sink.put("text.rope_deltas", np.asarray(rope_deltas).reshape(-1))
    sink.put("text.embeds.image", embeds[image])
    sink.put("text.embeds.text", embeds[~image])
    changed = (embeds[~image] != token_rows[~image]).any(axis=-1).sum()
    sink.put("text.embeds.text_slots_changed", np.array([changed], dtype=np.int64))


class AppliedOffsets:
    """``text.rope_delta``: the M-RoPE offset each decode step applied to the token it fed, i.e. the position the
    decoder's layers rotated it by (the largest of t, h, w) minus its sequence index, one per step 1, 2, ... (a
    token rewound and fed again: the teacher-forced call's). Read from what the layers received, never from the
    delta the decoder stores, so a fault in applying the delta shows here, apart from the prompt's
    ``text.rope_deltas``."""

    def __init__(self) -> None:
        self.by_index: dict[int, int] = {}

    def record(self, positions, index: int) -> None:
        """One decode call's ``positions`` (its M-RoPE rows, the last three t, h, w; None: the decoder placed the
        token at its index) for the token at sequence ``index``."""
        if positions is None:
            self.by_index[int(index)] = 0
            return
        rows = np.asarray(positions)
        rows = rows[-3:] if rows.ndim == 3 else rows  # transformers 5 may put a text row before t, h, w
        self.by_index[int(index)] = int(rows.max()) - int(index)

    def put(self, sink) -> None:
        if self.by_index:
            offsets = [self.by_index[index] for index in sorted(self.by_index)]
            sink.put("text.rope_delta", np.asarray(offsets, dtype=np.int64))


def tied_head(config: dict) -> tuple[str, ...]:
    """The derived tensors of a Qwen config: ``lm_head.weight`` when it is tied to the word embedding."""
    text = config.get("text_config") or {}
    return ("lm_head.weight",) if config.get("tie_word_embeddings", text.get("tie_word_embeddings")) else ()


#: The text side's tensors, in either layout transformers saves (``model.layers.*`` or ``model.language_model.*``).
TEXT_WEIGHTS = ("model.layers.*", "model.embed_tokens.*", "model.norm.*", "model.language_model.*", "lm_head.*")


def text_taps(layers: int) -> list[ModuleTap]:
    """The decoder's stages on its modules (``taps.module_taps.decoder_taps``): the same paths under transformers'
    ``model.model.language_model`` and mlx-vlm's ``language_model.model``."""
    return decoder_taps(layers, torch=("layers", "norm"), mlx=("layers", "norm"))
