"""One builder of tiny random-weight checkpoints for any model type with a tester config (``testers``).

The tester's config -> the model type's config class -> the model class transformers maps the type to for
image-text-to-text, every parameter seeded random (norm scales and biases too: the generic family aligns the two
libraries' modules by the values they own, so no two tensors may be equal), a byte-level BPE tokenizer trained here
with the family's special tokens (``tokens``), the family's chat template and processor (``tiny_processor``),
everything saved with ``save_pretrained`` in the layout the hub's checkpoints use. Nothing is downloaded; building
twice gives byte-identical files.
"""

from __future__ import annotations

import json
from pathlib import Path

from driftscope.model.synthetic import reinitialize, train_tokenizer

from .testers import VOCAB, get_tester
from .tiny_processor import save_processor
from .tokens import SPECS

#: the scale of every matrix (N(0, gain / sqrt(fan_in))): activations stay of order one through the tiny stacks
WEIGHT_GAIN = 1.0


def build_tokenizer(model_type: str):
    """The family's tokenizer: byte-level BPE with its special tokens (pad first), ``VOCAB`` ids in all."""
    spec = SPECS[model_type]
    return train_tokenizer(
        VOCAB,
        spec.tokens(),
        eos_token=spec.eos,
        pad_token=spec.pad,
        bos_token=spec.bos,
        extra_special_tokens=spec.named,
    )


def build_config(model_type: str, tokenizer, adjusted: bool = True):
    """The tester's config as the model type's config class, with the tokenizer's ids and ``VOCAB`` words
    (``adjusted``: with the changes ``testers.ADJUSTMENTS`` makes for our use)."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type, **get_tester(model_type, adjusted).config)
    for section in {id(config): config, id(text := config.get_text_config()): text}.values():
        section.vocab_size = VOCAB
    for key, token in SPECS[model_type].ids.items():
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == tokenizer.unk_token_id and token != tokenizer.unk_token:
            raise ValueError(f"the {model_type} tokenizer has no {token!r} for {key}")
        *parents, leaf = key.split(".")
        owner = config
        for parent in parents:
            owner = getattr(owner, parent)
        setattr(owner, leaf, int(token_id))
    return config


def build_model(config, seed: int):
    """The model class transformers maps the config's type to for image-text-to-text, every parameter seeded random,
    in f32, with the conversion mapping that saves it in the hub's layout attached."""
    import torch
    from transformers import AutoModelForImageTextToText
    from transformers.conversion_mapping import get_model_conversion_mapping

    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32).eval()
    reinitialize(model, seed, WEIGHT_GAIN)
    # save_pretrained reverts the conversion mapping transformers loads hub checkpoints through, but for a model built
    # from a config it drops the prefix changes (e.g. CLIP's `vision_model.`); attaching the full mapping, as
    # from_pretrained does, makes it write every name the hub's way
    model._weight_conversions = get_model_conversion_mapping(model, add_legacy=False)
    return model


def build_tiny(model_type: str, directory: str | Path, seed: int = 0, adjusted: bool = True) -> Path:
    """Write the tiny checkpoint of ``model_type`` (weights, config, tokenizer, chat template, processor) to
    ``directory``; returns it. ``adjusted=False`` keeps the tester's settings where ``testers.ADJUSTMENTS`` changes
    them (a checkpoint to show what mlx-vlm does with the tester's own config)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(model_type)
    config = build_config(model_type, tokenizer, adjusted)
    model = build_model(config, seed)
    model.save_pretrained(directory)
    save_processor(model_type, directory, tokenizer, SPECS[model_type].template)
    fixture = {"model_type": model_type, "seed": seed, "tester": get_tester(model_type).source, "adjusted": adjusted}
    (directory / "driftscope_fixture.json").write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
    return directory
