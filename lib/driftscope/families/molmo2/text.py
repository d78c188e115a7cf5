"""Molmo2's prompt side: each image's token grid, then the user turn, as transformers' processor builds it."""

from __future__ import annotations

import numpy as np

from driftscope.inputs.processor_output import ModelInputs
from driftscope.inputs.text_inputs import DEFAULT_PROMPT, TextInputs, prompt_tokenizer

from ...errors import InputError
from ..qwen_shared.tokenizer import QWEN2_TOKENIZERS
from .processor import image_token_ids, image_token_string


def build_text_inputs(
    checkpoint,
    inputs: ModelInputs,
    prompt: str = DEFAULT_PROMPT,
    max_new_tokens: int = 16,
    expect: list[str] | None = None,
) -> TextInputs:
    """BOS, every image's low- then high-resolution grid (``<im_col>`` after each row), then the user turn.

    Token types mark every image token (patches, row ends, starts and ends) as transformers' processor does:
    they attend to each other both ways in the prefill."""
    tokenizer = prompt_tokenizer(checkpoint.path, QWEN2_TOKENIZERS)
    bos = tokenizer.bos_token or tokenizer.eos_token or ""
    grids = np.asarray(inputs["grids"]).reshape(-1, 4)
    images = "".join(image_token_string(tuple(int(v) for v in grid)) for grid in grids)
    text = f"{bos}{images}<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    ids = np.asarray(tokenizer(text)["input_ids"], dtype=np.int64)
    patch_id = int(checkpoint.config.get("image_patch_id", tokenizer.convert_tokens_to_ids("<im_patch>")))
    found, expected = int((ids == patch_id).sum()), int(np.asarray(inputs.image_tokens).sum())
    if found != expected:
        raise InputError(
            f"the tokenizer turned {expected} image patches into {found} <im_patch> tokens",
            "use the checkpoint's own tokenizer, where <im_patch> is one special token",
        )
    types = np.isin(ids, image_token_ids(tokenizer)).astype(np.int64)
    return TextInputs(ids, patch_id, prompt, int(max_new_tokens), list(expect or []), token_types=types)
