"""What the random-weight checkpoints of both Qwen families share: the config sections their specs give, the token
ids they name, and the tokenizer's files beside the weights."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from driftscope.model.checkpoint_storage import FIXTURE_MARKER

from .tokenizer import CHAT_TEMPLATE


def config_arguments(spec: Any, token_id: Callable[[str], int], text: dict, vision: dict) -> dict:
    """The keyword arguments of a Qwen config class for a synthetic ``spec`` (its ``text_*``, ``vision_*``,
    ``vocab_size``, ``spatial_merge_size``, ``tie_word_embeddings`` and ``extra``): ``text`` and ``vision`` are
    the family's own settings of each section; ``token_id`` maps a special token to its id."""
    return dict(
        text_config=dict(
            hidden_size=spec.text_hidden,
            intermediate_size=spec.text_intermediate,
            num_hidden_layers=spec.text_layers,
            num_attention_heads=spec.text_heads,
            num_key_value_heads=spec.text_kv_heads,
            vocab_size=spec.vocab_size,
            max_position_embeddings=4096,
            **text,
            **text_token_ids(token_id),
        ),
        vision_config=dict(
            depth=spec.vision_depth,
            hidden_size=spec.vision_hidden,
            intermediate_size=spec.vision_intermediate,
            num_heads=spec.vision_heads,
            out_hidden_size=spec.text_hidden,
            spatial_merge_size=spec.spatial_merge_size,
            temporal_patch_size=2,
            **vision,
        ),
        **vision_token_ids(token_id),
        eos_token_id=token_id("<|im_end|>"),
        tie_word_embeddings=spec.tie_word_embeddings,
        **spec.extra,
    )


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
