"""Qwen3-VL's ready-made hypothesis patches (``patch: driftscope.hypotheses:NAME`` in a parameter file).

Each takes the loaded model of the runtime it is given (mlx-vlm's ``Model`` or transformers'
``Qwen3VLForConditionalGeneration``) and changes it in place to test a "what if".
"""

from __future__ import annotations

from typing import Any

__all__ = ["drop_deepstack_branch", "scale_block_output"]


def _is_mlx(model: Any) -> bool:
    return hasattr(model, "vision_tower")


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
    if _is_mlx(model):
        blocks = model.vision_tower.blocks
        blocks[block] = _Scaled(blocks[block], factor)
    else:
        model.model.visual.blocks[block].register_forward_hook(lambda module, args, out: out * factor)
    return model


def drop_deepstack_branch(model: Any, branch: int = 1) -> Any:
    """What if DeepStack branch ``branch`` were not added to the decoder (the tower still computes it)?"""
    if _is_mlx(model):
        import mlx.core as mx

        original = model.get_input_embeddings

        def embeddings(*args, **kwargs):
            features = original(*args, **kwargs)
            if features.deepstack_visual_embeds is not None:
                features.deepstack_visual_embeds = [
                    mx.zeros_like(f) if k == branch else f for k, f in enumerate(features.deepstack_visual_embeds)
                ]
            return features

        object.__setattr__(model, "get_input_embeddings", embeddings)
        return model

    def without_branch(module, args, kwargs):
        features = kwargs.get("deepstack_visual_embeds")
        if features is not None:
            kwargs["deepstack_visual_embeds"] = [f * 0 if k == branch else f for k, f in enumerate(features)]
        return args, kwargs

    model.model.language_model.register_forward_pre_hook(without_branch, with_kwargs=True)
    return model
