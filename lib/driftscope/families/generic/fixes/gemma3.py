"""mlx-vlm 0.7.10's Gemma 3 text model rounds the embedding scale to bfloat16 whatever the model's dtype
(``gemma3/language.py`` line 210: ``h *= mx.array(self.config.hidden_size**0.5, mx.bfloat16).astype(h.dtype)``);
transformers multiplies by it in the weights' dtype (``modeling_gemma3.py`` ``Gemma3TextScaledWordEmbedding``:
``embed_scale.to(self.weight.dtype)``). In bfloat16 the two agree; in float32 or float16 every row of the decoder's
input is off by bf16's rounding of ``sqrt(hidden_size)``: 1.1e-4 relative for the tester's 32, 1.9e-3 for Gemma 3
4B's 2560 (sqrt 50.596 -> 50.5). The image rows carry it too (divided by the exact scale, multiplied by the rounded).

``gemma3_embed_scale`` scales in the weights' dtype, as transformers does."""

from __future__ import annotations

from typing import Any

from ..patching import mlx_call, mlx_vlm_port

__all__ = ["gemma3_embed_scale"]

CLOSES = {
    "gemma3_embed_scale": {
        "runtimes": ("mlx",),
        "stages": ("text.layer.0.input",),
        "model_types": ("gemma3",),
        "defect": "mlx-vlm rounds the text embedding scale sqrt(hidden_size) to bfloat16 whatever the model's dtype, "
        "where transformers multiplies by it in the weights' dtype",
    }
}

#: model type -> runtime -> the ready patch that closes every defect found in that runtime's port of it (the
#: sweep runs each failing model type again with these)
WHOLE = {"gemma3": {"mlx": "gemma3_embed_scale"}}


def _scaled(self, inputs, inputs_embeds=None, mask=None, cache=None, **kwargs):
    """mlx-vlm's ``Gemma3Model.__call__`` on embeddings this call scaled (its own scaling switched off)."""
    import mlx.core as mx

    scale = inputs_embeds is None or self.driftscope_scale_inputs_embeds  # where the port scales
    h = self.embed_tokens(inputs) if inputs_embeds is None else inputs_embeds
    if scale:
        weights = self.embed_tokens.weight.dtype
        h = h * mx.array(self.config.hidden_size**0.5, dtype=weights).astype(h.dtype)
    return super(type(self), self).__call__(inputs, inputs_embeds=h, mask=mask, cache=cache, **kwargs)


def gemma3_embed_scale(model: Any) -> Any:
    """Multiply the decoder's input by ``sqrt(hidden_size)`` in the weights' dtype (see the module docstring)."""
    text = mlx_vlm_port(model, "gemma3", "gemma3_embed_scale").language_model.model
    object.__setattr__(text, "driftscope_scale_inputs_embeds", bool(text.scale_inputs_embeds))
    text.scale_inputs_embeds = False  # the port's own (bfloat16) scaling, read by its __call__
    mlx_call(text, _scaled)
    return model
