"""What every family's random-weight checkpoint builder shares: a tokenizer trained here on a fixed
tiny corpus (nothing is downloaded), seeded weights independent of transformers' init, and where
generated benchmark checkpoints live."""

from __future__ import annotations

import math
from pathlib import Path

CORPUS = [
    "a red square, a blue circle and a green triangle on a light grey background.",
    "The image shows a red square and a blue circle. There is also a green triangle.",
    "Describe the image. What shapes do you see? Which colours are they?",
    "square circle triangle red blue green orange black white checkerboard shapes colours",
    "user assistant system You are a helpful assistant.",
]


def train_tokenizer(
    vocab_size: int,
    special_tokens: list[str],
    eos_token: str,
    pad_token: str,
    corpus: list[str] = CORPUS,
    *,
    bos_token: str | None = None,
    extra_special_tokens: dict[str, str] | None = None,
):
    """A byte-level BPE tokenizer with ``special_tokens`` (ids 0, 1, ... in order; the first is not an additional
    special token), trained on ``corpus``; ``extra_special_tokens`` names some of them as tokenizer attributes
    (``image_token``, ...) the way transformers 5 checkpoints declare them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus * 4, trainer=trainer)
    named = {"extra_special_tokens": dict(extra_special_tokens)} if extra_special_tokens else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=eos_token,
        pad_token=pad_token,
        additional_special_tokens=special_tokens[1:],
        **({"bos_token": bos_token} if bos_token is not None else {}),
        **named,
    )


def reinitialize(model, seed: int, gain: float) -> None:
    """Seeded weights independent of transformers' init: N(0, gain/sqrt(fan_in)) for matrices,
    1 + N(0, 0.1) for norm scales, N(0, 0.02) for biases."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            if name.endswith("bias"):
                values = torch.randn(param.shape, generator=generator) * 0.02
            elif param.ndim == 1:
                values = 1.0 + torch.randn(param.shape, generator=generator) * 0.1
            else:
                fan_in = math.prod(param.shape[1:])
                values = torch.randn(param.shape, generator=generator) * (gain / math.sqrt(fan_in))
            param.copy_(values.to(param.dtype))


def benchmark_cache_dir() -> Path:
    """Where generated benchmark checkpoints live: the ``checkpoints`` folder of driftscope's cache."""
    from driftscope.core.paths import cache_root

    return cache_root() / "checkpoints"
