"""The Qwen prompt side: the chat format around the images, and the prompt stages every runtime writes."""

from __future__ import annotations

import numpy as np

from driftscope.inputs.processor_output import ModelInputs
from driftscope.inputs.text_inputs import DEFAULT_PROMPT, TextInputs, load_tokenizer

from ...errors import InputError


def build_text_inputs(
    checkpoint,
    inputs: ModelInputs,
    prompt: str = DEFAULT_PROMPT,
    max_new_tokens: int = 16,
    expect: list[str] | None = None,
) -> TextInputs:
    """Qwen chat format: each image as <|vision_start|> n x <|image_pad|> <|vision_end|>, then the prompt."""
    image_tokens = inputs.image_tokens.tolist()
    tokenizer = load_tokenizer(checkpoint.path)
    config = checkpoint.config
    images = "".join("<|vision_start|>" + "<|image_pad|>" * int(n) + "<|vision_end|>" for n in image_tokens)
    text = f"<|im_start|>user\n{images}{prompt}<|im_end|>\n<|im_start|>assistant\n"
    ids = np.asarray(tokenizer(text)["input_ids"], dtype=np.int64)
    image_token_id = int(config.get("image_token_id", tokenizer.convert_tokens_to_ids("<|image_pad|>")))
    found = int((ids == image_token_id).sum())
    if found != sum(int(n) for n in image_tokens):
        raise InputError(
            f"the tokenizer turned {sum(image_tokens)} image placeholders into {found} image tokens",
            "use the checkpoint's own tokenizer, where <|image_pad|> is one special token",
        )
    return TextInputs(ids, image_token_id, prompt, int(max_new_tokens), list(expect or []))


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
    image = text.input_ids == text.image_token_id
    sink.put("text.input_ids", text.input_ids)
    sink.put("text.position_ids", np.asarray(position_ids).reshape(3, -1))
    sink.put("text.rope_deltas", np.asarray(rope_deltas).reshape(-1))
    sink.put("text.embeds.image", embeds[image])
    sink.put("text.embeds.text", embeds[~image])
    changed = (embeds[~image] != token_rows[~image]).any(axis=-1).sum()
    sink.put("text.embeds.text_slots_changed", np.array([changed], dtype=np.int64))


def put_decode_delta(sink, rope_delta) -> None:
    """``text.rope_delta``: the M-RoPE offset the decoder placed generated tokens with (position = sequence index
    + delta), read from the decoder's own state once it has decoded, so a decode-only offset defect is caught
    apart from the prompt's ``text.rope_deltas``."""
    if rope_delta is not None:
        sink.put("text.rope_delta", np.asarray(rope_delta).astype(np.int64).reshape(-1))


def tied_head(config: dict) -> tuple[str, ...]:
    """The derived tensors of a Qwen config: ``lm_head.weight`` when it is tied to the word embedding."""
    text = config.get("text_config") or {}
    return ("lm_head.weight",) if config.get("tie_word_embeddings", text.get("tie_word_embeddings")) else ()


#: The text side's tensors, in either layout transformers saves (``model.layers.*`` or ``model.language_model.*``).
TEXT_WEIGHTS = ("model.layers.*", "model.embed_tokens.*", "model.norm.*", "model.language_model.*", "lm_head.*")
