"""Checkpoints with the published models' shapes scaled down (issue 50), and long inputs for them.

What sets a float32 port's round-off is kept from each released config: the text head_dim (128), the RoPE base,
M-RoPE's sections, the grouped-query ratio, tied embeddings, DeepStack, the experts' width relative to the hidden
size; the widths and depths are cut so a 4,096-position prefill runs in seconds. Built once per test run
(conftest's ``computed_once``) with the families' own seeded builders; nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

from conftest import ROOT, computed_once, shared_root
from driftscope.families.molmo2.fixture import SyntheticMolmo2Spec
from driftscope.families.qwen2_5_vl.fixture import SyntheticQwen25VLSpec
from driftscope.families.qwen3_vl.fixture import SyntheticQwen3VLSpec
from driftscope.families.qwen3_vl_moe.fixture import SyntheticQwen3VLMoeSpec

#: Qwen3-VL-2B: head_dim 128, 16 / 8 heads, rope_theta 5e6, mrope [24, 20, 20], tied embeddings, DeepStack at
#: 5, 11, 17 of 24 blocks (here 1, 2, 3 of 4)
QWEN3_VL_2B = SyntheticQwen3VLSpec(
    vision_depth=4,
    vision_hidden=128,
    vision_heads=2,
    vision_intermediate=512,
    deepstack_visual_indexes=(1, 2, 3),
    text_hidden=256,
    text_layers=2,
    text_heads=4,
    text_kv_heads=2,
    text_head_dim=128,
    text_intermediate=768,
    mrope_section=(24, 20, 20),
    rope_theta=5e6,
    tie_word_embeddings=True,
    seed=50,
)
#: Qwen3-VL-32B: head_dim 128, 64 / 8 heads (8 queries a key), the 1152-wide tower's head_dim 72, untied
QWEN3_VL_32B = SyntheticQwen3VLSpec(
    vision_depth=4,
    vision_hidden=144,
    vision_heads=2,
    vision_intermediate=538,
    deepstack_visual_indexes=(1, 2, 3),
    text_hidden=256,
    text_layers=2,
    text_heads=8,
    text_kv_heads=1,
    text_head_dim=128,
    text_intermediate=1280,
    mrope_section=(24, 20, 20),
    rope_theta=5e6,
    seed=51,
)
#: Qwen3-VL-30B-A3B: the 32B's tower, 32 / 4 heads of 128, experts 768 wide against a 2048 hidden (here 96 / 256),
#: 8 chosen of 128 (here 2 of 8)
QWEN3_VL_30B_A3B = SyntheticQwen3VLMoeSpec(
    base=replace(QWEN3_VL_32B, text_intermediate=768, seed=52),
    num_experts=8,
    experts_per_token=2,
    moe_intermediate=96,
)
#: Qwen2.5-VL-7B: head_dim 128 (3584 / 28), 28 / 4 heads, mrope [16, 24, 24], rope_theta 1e6
QWEN2_5_VL_7B = SyntheticQwen25VLSpec(
    text_hidden=256, text_layers=2, text_heads=2, text_kv_heads=1, text_intermediate=1024, mrope_section=(16, 24, 24)
)
#: Molmo2-4B's decoder (Qwen3-4B): head_dim 128, 32 / 8 heads, rope_theta 1e6
MOLMO2_4B = SyntheticMolmo2Spec(
    text_hidden=256, text_layers=2, text_heads=4, text_kv_heads=1, text_head_dim=128, text_intermediate=768, seed=53
)

SHAPES = {
    "qwen3_vl-2b": ("qwen3_vl", QWEN3_VL_2B),
    "qwen3_vl-32b": ("qwen3_vl", QWEN3_VL_32B),
    "qwen3_vl_moe-30b-a3b": ("qwen3_vl_moe", QWEN3_VL_30B_A3B),
    "qwen2_5_vl-7b": ("qwen2_5_vl", QWEN2_5_VL_7B),
    "molmo2-4b": ("molmo2", MOLMO2_4B),
}


def _build(family: str, spec, folder: Path) -> Path:
    if family == "molmo2":
        from driftscope.families.molmo2.fixture import make_checkpoints

        return make_checkpoints(folder / "hub", folder / "native", spec)[1]
    if family == "qwen2_5_vl":
        from driftscope.families.qwen2_5_vl.fixture import make_checkpoint
    elif family == "qwen3_vl":
        from driftscope.families.qwen3_vl.fixture import make_checkpoint
    else:
        from driftscope.families.qwen3_vl_moe.fixture import make_checkpoint
    return make_checkpoint(folder / "native", spec)


@cache
def checkpoint(name: str):
    """The opened checkpoint of one of ``SHAPES``, built once per test run."""
    from driftscope.families.checkpoints import open_checkpoint

    family, spec = SHAPES[name]

    def build(folder: Path) -> Path:
        _build(family, spec, folder)
        return folder

    folder = computed_once(f"published/{name}", build, lambda out: out)
    return open_checkpoint(folder / "native")


def long_inputs(checkpoint, positions: int = 4096, images=(ROOT / "fixtures" / "images" / "shapes_224.png",)):
    """The family's inputs for ``images`` with a prompt long enough that the prefill fills ``positions``
    positions (words added until the tokenizer's ids reach that many)."""
    from driftscope.families import get_family

    family = get_family(checkpoint.family)
    inputs = family.prepare_inputs(checkpoint, list(images))
    words = positions // 8
    while True:
        prompt = " ".join(f"word{i % 50}" for i in range(words))
        inputs.text = family.text_inputs(checkpoint, inputs, prompt=prompt, max_new_tokens=2)
        if inputs.text.input_ids.size >= positions:
            return inputs
        words += max(1, (positions - inputs.text.input_ids.size) // 6 + 1)


def scratch() -> Path:
    folder = shared_root() / "scratch" / "published"
    folder.mkdir(parents=True, exist_ok=True)
    return folder
