"""Aya Vision's logits: transformers 5.24's ``AyaVisionForConditionalGeneration`` computes them with its own
``lm_head`` (``models/aya_vision/modeling_aya_vision.py:366``) and never multiplies by the Cohere2 text config's
``logit_scale`` (0.0625 by default), which ``Cohere2ForCausalLM`` does (``models/cohere2/modeling_cohere2.py:476``),
and with it transformers' first Aya Vision (4.50, whose language model was a ``Cohere2ForCausalLM``) and mlx-vlm
0.7.10 (``aya_vision/language.py:172``). Every logit differs by that factor (argmax, and so greedy tokens, unchanged);
the patch is for transformers' runtime."""

from __future__ import annotations

from typing import Any

from ....errors import HypothesisPatchError
from ..patching import torch_output

__all__ = ["aya_vision_logit_scale"]

CLOSES = {
    "aya_vision_logit_scale": {
        "runtimes": ("transformers",),
        "stages": ("text.logits.last",),
        "model_types": ("aya_vision",),
        "defect": "transformers' Aya Vision computes the logits with its own lm_head and never multiplies them by the "
        "Cohere2 text config's logit_scale, which Cohere2 (and mlx-vlm) do",
    }
}

#: model type -> runtime -> the ready patch that closes every defect found in that runtime's port of it (the
#: sweep runs each failing model type again with these)
WHOLE = {"aya_vision": {"transformers": "aya_vision_logit_scale"}}


def aya_vision_logit_scale(model: Any) -> Any:
    """(transformers' model) The head's logits multiplied by the text config's ``logit_scale``, as Cohere2's causal
    LM does."""
    from transformers.models.aya_vision.modeling_aya_vision import AyaVisionForConditionalGeneration

    if not isinstance(model, AyaVisionForConditionalGeneration):
        raise HypothesisPatchError(
            f"aya_vision_logit_scale corrects transformers' Aya Vision head; it was given a {type(model).__name__}",
            "apply it to the transformers runtime of an aya_vision checkpoint",
        )
    scale = float(model.config.text_config.logit_scale)
    torch_output(model.lm_head, lambda logits: logits * scale)
    return model
