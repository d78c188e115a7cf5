"""Qwen2.5-VL's ready-made hypothesis patches (``patch: driftscope.hypotheses:NAME`` in a parameter file).

Each takes the loaded model of the runtime it is given (mlx-vlm's ``Model`` or transformers'
``Qwen2_5_VLForConditionalGeneration``) and changes it in place to test a "what if".
"""

from __future__ import annotations

from typing import Any

__all__ = ["norm2_in_float32", "perturb_image_embeddings", "scale_block_output"]


def _vision(model: Any) -> Any:
    if hasattr(model, "vision_tower"):  # mlx-vlm
        return model.vision_tower
    return model.model.visual  # transformers


class _Scaled:
    """Calls a block and multiplies its output by a constant."""

    def __init__(self, block: Any, factor: float):
        self.block = block
        self.factor = factor

    def __call__(self, *args, **kwargs):
        return self.block(*args, **kwargs) * self.factor

    def __getattr__(self, name: str) -> Any:
        return getattr(self.block, name)


def scale_block_output(model: Any, block: int, factor: float = 1.01) -> Any:
    """Multiply vision block ``block``'s output by ``factor`` (a planted defect in one block)."""
    vision = _vision(model)
    if hasattr(vision, "vision_tower") or isinstance(vision.blocks, list):  # mlx-vlm keeps blocks in a list
        vision.blocks[block] = _Scaled(vision.blocks[block], factor)
    else:
        original = vision.blocks[block]
        original.register_forward_hook(lambda module, args, out: out * factor)
    return model


def norm2_in_float32(model: Any) -> Any:
    """Run every vision block's norm2 in float32 and cast back ("what if norm2 ran in f32?"; MLX only)."""
    import mlx.core as mx

    vision = _vision(model)

    class _Float32Norm:
        def __init__(self, norm: Any):
            self.norm = norm
            self.weight = norm.weight.astype(mx.float32)

        def __call__(self, x):
            return mx.fast.rms_norm(x.astype(mx.float32), self.weight, self.norm.eps).astype(x.dtype)

    for block in vision.blocks:
        object.__setattr__(block, "norm2", _Float32Norm(block.norm2))
    return model


def perturb_image_embeddings(model: Any, scale: float = -2.0) -> Any:
    """Multiply the merged image embeddings by ``scale`` where mlx-vlm writes them into the prompt (MLX only).

    The vision tower is untouched, so every vision stage still passes and the first failing stage is
    ``text.embeds.image``: the shape of a merge that scrambles or rescales image features.
    """
    original = model.merge_input_ids_with_image_features

    def merge(image_token_id, video_token_id, image_features, inputs_embeds, input_ids):
        return original(image_token_id, video_token_id, image_features * scale, inputs_embeds, input_ids)

    object.__setattr__(model, "merge_input_ids_with_image_features", merge)
    return model
