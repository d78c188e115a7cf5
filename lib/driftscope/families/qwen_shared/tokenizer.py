"""The Qwen special tokens, chat template and the offline tokenizer of the tiny random-weight checkpoints, the
token ids their configs name, and the tokenizer's files beside the weights."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from driftscope.model.checkpoint_storage import FIXTURE_MARKER
from driftscope.model.synthetic import train_tokenizer

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer with Qwen's special tokens, trained on the fixed tiny corpus."""
    return train_tokenizer(vocab_size, SPECIAL_TOKENS, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def text_token_ids(token_id: Callable[[str], int]) -> dict[str, int]:
    """A synthetic checkpoint's ``text_config`` token ids (``token_id`` maps a special token to its id)."""
    return {
        "bos_token_id": token_id("<|endoftext|>"),
        "eos_token_id": token_id("<|im_end|>"),
        "pad_token_id": token_id("<|endoftext|>"),
    }


def vision_token_ids(token_id: Callable[[str], int]) -> dict[str, int]:
    """A synthetic checkpoint's top-level token ids: the image and video placeholders and their delimiters."""
    return {
        "image_token_id": token_id("<|image_pad|>"),
        "video_token_id": token_id("<|video_pad|>"),
        "vision_start_token_id": token_id("<|vision_start|>"),
        "vision_end_token_id": token_id("<|vision_end|>"),
    }


def save_tokenizer(out_dir: Path, tokenizer, spec: object) -> None:
    """The tokenizer with Qwen's chat template, and the marker naming the spec that made the checkpoint."""
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    (out_dir / FIXTURE_MARKER).write_text(json.dumps({"spec": repr(spec)}, indent=1) + "\n")
