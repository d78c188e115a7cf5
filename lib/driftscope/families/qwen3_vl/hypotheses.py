"""Qwen3-VL's ready-made hypothesis patches (``patch: driftscope.hypotheses:NAME`` in a parameter file).

Each takes the loaded model of the runtime it is given (mlx-vlm's ``Model`` or transformers'
``Qwen3VLForConditionalGeneration``) and changes it in place to test a "what if".
"""

from __future__ import annotations

from typing import Any

from ..qwen_shared.tower import scale_block_output

__all__ = ["drop_deepstack_branch", "scale_block_output"]


def _is_mlx(model: Any) -> bool:
    return hasattr(model, "vision_tower")


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
