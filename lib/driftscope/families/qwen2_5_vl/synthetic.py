"""Random-weight Qwen2.5-VL checkpoints built from a config, saved with ``save_pretrained``.

Used by the fixture script and the shared family tests (the tiny checkpoints) and the benchmarks
(a real-size vision tower). Nothing is downloaded: the tokenizer is a byte-level BPE trained here on a
fixed corpus, the image processor is transformers' PIL class.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from driftscope.model.synthetic import reinitialize

from ..qwen_shared.synthetic import config_arguments, save_tokenizer
from ..qwen_shared.tokenizer import build_tokenizer


@dataclass(frozen=True)
class SyntheticQwen25VLSpec:
    """Shape and seed of a random-weight Qwen2.5-VL checkpoint."""

    vision_depth: int = 8
    vision_hidden: int = 64
    vision_heads: int = 4
    vision_intermediate: int = 128
    fullatt_block_indexes: tuple[int, ...] = (3, 7)
    text_hidden: int = 64
    text_layers: int = 2
    text_heads: int = 4
    text_kv_heads: int = 2
    text_intermediate: int = 128
    mrope_section: tuple[int, ...] = (2, 3, 3)
    vocab_size: int = 512
    window_size: int = 112
    spatial_merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    seed: int = 0
    weight_gain: float = 1.0
    massive_channel: int | None = None  # plant a massive activation in this hidden channel of the vision tower
    massive_gain: float = 0.5  # patch-embedding weight of that channel: |x| ~ gain * |sum of a patch's pixels|
    tie_word_embeddings: bool = False  # lm_head shares embed_tokens (then not saved), as in the real 3B
    extra: dict = field(default_factory=dict)


def plant_massive_channel(model, channel: int, gain: float) -> None:
    """Make one hidden channel of the patch embedding huge (|x| of hundreds on ordinary images).

    Real ViTs carry such "massive activations"; squaring them in float16 (max 65504) overflows
    above |x| = 256, which is what a manual F16 RMSNorm does and a fused kernel avoids.
    """
    import torch

    with torch.no_grad():
        weight = model.model.visual.patch_embed.proj.weight
        weight[channel] = torch.full_like(weight[channel], gain)


def build_config(spec: SyntheticQwen25VLSpec, tokenizer):
    """The transformers config of ``spec``, with the special token ids of ``tokenizer``."""
    from transformers import Qwen2_5_VLConfig

    text = {"rope_parameters": {"rope_type": "default", "mrope_section": list(spec.mrope_section), "rope_theta": 1e6}}
    vision = {
        "fullatt_block_indexes": list(spec.fullatt_block_indexes),
        "window_size": spec.window_size,
        "patch_size": 14,
    }
    return Qwen2_5_VLConfig(**config_arguments(spec, tokenizer.convert_tokens_to_ids, text, vision))


def save_side_files(out_dir: Path, spec: SyntheticQwen25VLSpec, tokenizer) -> None:
    """Image processor, tokenizer with the chat template, and the spec that made the checkpoint."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=spec.min_pixels, max_pixels=spec.max_pixels, merge_size=spec.spatial_merge_size
    )
    # The combined Qwen2_5_VLProcessor also wants a video processor, which needs torchvision; the
    # image processor and tokenizer are saved side by side instead, as a real checkpoint has them.
    image_processor.save_pretrained(out_dir)
    save_tokenizer(out_dir, tokenizer, spec)


def make_checkpoint(out_dir: Path, spec: SyntheticQwen25VLSpec = SyntheticQwen25VLSpec()) -> Path:
    """Write a random-weight Qwen2.5-VL checkpoint (safetensors, tokenizer, processor) to ``out_dir``."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec.vocab_size)
    config = build_config(spec, tokenizer)
    torch.manual_seed(spec.seed)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    reinitialize(model, spec.seed, spec.weight_gain)
    if spec.massive_channel is not None:
        plant_massive_channel(model, spec.massive_channel, spec.massive_gain)
    model.save_pretrained(out_dir, safe_serialization=True)
    save_side_files(out_dir, spec, tokenizer)
    return out_dir


#: The vision tower of Qwen2.5-VL-3B (depth 32, hidden 1280, 16 heads, MLP 3420, merger to 2048, full
#: attention at 7, 15, 23, 31) with a one-layer text side of the same width, for benchmarks.
QWEN25_VL_3B_SHAPED = SyntheticQwen25VLSpec(
    vision_depth=32,
    vision_hidden=1280,
    vision_heads=16,
    vision_intermediate=3420,
    fullatt_block_indexes=(7, 15, 23, 31),
    text_hidden=2048,
    text_layers=1,
    text_heads=16,
    text_kv_heads=2,
    text_intermediate=256,
    mrope_section=(16, 24, 24),
    vocab_size=512,
)


#: The tiny fixture (depth 8, full attention at 3 and 7, hidden 64) and its massive-activation twin.
TINY_SPEC = SyntheticQwen25VLSpec()
MASSIVE_CHANNEL = 17
MASSIVE_SPEC = SyntheticQwen25VLSpec(massive_channel=MASSIVE_CHANNEL)


#: A wide variant (hidden 1024, MLP 2048, depth 2): its linear layers have 1024 and 2048 inputs, wide enough for
#: MLX's fused quantized matmul, which sums in the activation dtype, to dominate the float16 error from the first
#: linear layer on (``fixtures/make_tiny_qwen25vl_wide.py`` saves it as a 4-bit MLX-community checkpoint).
WIDE_SPEC = SyntheticQwen25VLSpec(
    vision_depth=2,
    vision_hidden=1024,
    vision_heads=16,
    vision_intermediate=2048,
    fullatt_block_indexes=(1,),
    seed=4,
)
