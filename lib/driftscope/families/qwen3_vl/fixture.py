"""Random-weight Qwen3-VL checkpoints built from a config, saved with ``save_pretrained``.

Nothing is downloaded: the tokenizer is the byte-level BPE trained on a fixed corpus (the Qwen
tokens of ``qwen_shared.tokenizer``), the image processor is transformers' PIL class with Qwen3-VL's settings
(patch 16, merge 2, mean/std 0.5, the real checkpoints' pixel bounds). Building twice gives
identical bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from driftscope.model.synthetic import reinitialize

from ..qwen_shared.synthetic import config_arguments, save_tokenizer
from ..qwen_shared.tokenizer import build_tokenizer

#: Qwen3-VL's released ``preprocessor_config.json`` bounds: ``size.shortest_edge`` / ``longest_edge``.
QWEN3_VL_MIN_PIXELS = 65536
QWEN3_VL_MAX_PIXELS = 16777216


@dataclass(frozen=True)
class SyntheticQwen3VLSpec:
    """Shape and seed of a random-weight Qwen3-VL checkpoint."""

    vision_depth: int = 6
    vision_hidden: int = 64
    vision_heads: int = 4
    vision_intermediate: int = 128
    deepstack_visual_indexes: tuple[int, ...] = (1, 3, 4)
    num_position_embeddings: int = 2304
    patch_size: int = 16
    spatial_merge_size: int = 2
    text_hidden: int = 64
    text_layers: int = 4
    text_heads: int = 4
    text_kv_heads: int = 2
    text_head_dim: int = 16
    text_intermediate: int = 128
    mrope_section: tuple[int, ...] = (4, 2, 2)
    rope_theta: float = 5e6
    tie_word_embeddings: bool = False
    vocab_size: int = 512
    min_pixels: int = QWEN3_VL_MIN_PIXELS
    max_pixels: int = QWEN3_VL_MAX_PIXELS
    seed: int = 0
    weight_gain: float = 1.0
    extra: dict = field(default_factory=dict)


def build_config(spec: SyntheticQwen3VLSpec, token_id):
    """The ``Qwen3VLConfig`` of ``spec``; ``token_id`` maps special-token strings to ids."""
    from transformers import Qwen3VLConfig

    rope = {"rope_type": "default", "rope_theta": spec.rope_theta, "mrope_section": list(spec.mrope_section)}
    text = {"head_dim": spec.text_head_dim, "rope_parameters": {**rope, "mrope_interleaved": True}}
    vision = {
        "patch_size": spec.patch_size,
        "num_position_embeddings": spec.num_position_embeddings,
        "deepstack_visual_indexes": list(spec.deepstack_visual_indexes),
    }
    return Qwen3VLConfig(**config_arguments(spec, token_id, text, vision))


def image_processor(spec: SyntheticQwen3VLSpec):
    """transformers' PIL image processor with Qwen3-VL's settings (patch, merge, mean/std 0.5, pixel bounds)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        min_pixels=spec.min_pixels,
        max_pixels=spec.max_pixels,
        patch_size=spec.patch_size,
        merge_size=spec.spatial_merge_size,
        temporal_patch_size=2,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )


def make_checkpoint(out_dir: Path, spec: SyntheticQwen3VLSpec = SyntheticQwen3VLSpec()) -> Path:
    """Write a random-weight Qwen3-VL checkpoint (safetensors, tokenizer, image processor) to ``out_dir``."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec.vocab_size)
    config = build_config(spec, tokenizer.convert_tokens_to_ids)
    torch.manual_seed(spec.seed)
    model = Qwen3VLForConditionalGeneration(config).eval()
    reinitialize(model, spec.seed, spec.weight_gain)
    model.save_pretrained(out_dir, safe_serialization=True)
    # Qwen3VLProcessor also wants a video processor (torchvision); the pieces are saved side by side.
    image_processor(spec).save_pretrained(out_dir)
    save_tokenizer(out_dir, tokenizer, spec)
    return out_dir


#: The tiny fixture: vision depth 6, hidden 64, DeepStack at blocks 1, 3, 4; text 4 layers.
TINY_SPEC = SyntheticQwen3VLSpec()
