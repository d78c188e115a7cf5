"""The prompt side of an investigation: token ids around the images, built from the checkpoint's tokenizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import CheckpointError, InputError

DEFAULT_PROMPT = "Name every shape in the image and its colour."


@dataclass
class TextInputs:
    """Token ids of a chat prompt whose user turn holds the images, and what to generate."""

    input_ids: np.ndarray  # [seq] int64
    image_token_id: int
    prompt: str
    max_new_tokens: int = 16
    expect: list[str] = field(default_factory=list)

    @property
    def mm_token_type_ids(self) -> np.ndarray:
        return (self.input_ids == self.image_token_id).astype(np.int64)

    def summary(self) -> dict:
        return {
            "prompt": self.prompt,
            "tokens": int(self.input_ids.size),
            "image_tokens": int(self.mm_token_type_ids.sum()),
            "max_new_tokens": self.max_new_tokens,
            "expect": self.expect,
        }


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as err:  # noqa: BLE001 - any failure means the checkpoint has no usable tokenizer
        raise CheckpointError(
            f"checkpoint {path} has no tokenizer transformers can load ({err})",
            "save the tokenizer next to the weights (tokenizer.json, tokenizer_config.json)",
        ) from err


def build_text_inputs(
    checkpoint,
    image_tokens: list[int],
    prompt: str = DEFAULT_PROMPT,
    max_new_tokens: int = 16,
    expect: list[str] | None = None,
) -> TextInputs:
    """Qwen chat format: each image as <|vision_start|> n x <|image_pad|> <|vision_end|>, then the prompt."""
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


def decode(checkpoint, tokens: list[int]) -> str:
    return load_tokenizer(checkpoint.path).decode([int(t) for t in tokens], skip_special_tokens=False)
