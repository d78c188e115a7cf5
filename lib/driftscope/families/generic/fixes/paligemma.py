"""Two defects of mlx-vlm 0.7.10's PaliGemma, each with its ready patch (``paligemma_fixes``: both).

``paligemma_image_scale``: the port scales the image tokens by the wrong width (``paligemma/paligemma.py`` line 97:
``image_features / (self.config.hidden_size**0.5)``, then ``language.py`` line 228 multiplies every row by
``text_config.hidden_size**0.5``). ``self.config.hidden_size`` is the composite's top-level ``hidden_size``, which
transformers' ``PaliGemmaConfig`` writes as its class default 2048 whatever the text model's width; transformers
merges the projector's features unscaled into embeddings its ``GemmaTextScaledWordEmbedding`` scaled
(``modeling_paligemma.py``), i.e. divides and multiplies by the same text width. Every checkpoint whose text model is
not 2048 wide (PaliGemma 2's Gemma 2 widths; the tester's 32: image rows 8x too small) gets its image tokens scaled
by ``sqrt(text width / 2048)``.

The patch makes the width the port divides by the text model's (the attribute it reads).

``paligemma_positions_from_one``: the port rotates queries and keys from position 0 (``paligemma/language.py`` lines
88-93: ``self.rope(x, offset=cache.offset)``, ``self.rope(x)``), transformers from 1 ("Paligemma positions are
1-indexed", ``modeling_paligemma.py`` line 218, in the prefill and in every decode step). Attention scores depend on
relative positions alone, so every layer's output agrees to round-off, but the KV cache holds keys rotated one
position apart (values agree). The patch offsets each attention's RoPE by one."""

from __future__ import annotations

from typing import Any

from ..patching import mlx_call, mlx_closes, mlx_vlm_port

__all__ = ["paligemma_fixes", "paligemma_image_scale", "paligemma_positions_from_one"]

CLOSES = mlx_closes(
    {
        "paligemma_image_scale": (
            ("text.layer.0.input",),
            "mlx-vlm divides the image features by the square root of the composite config's "
            "hidden_size (2048 by default), not the text model's width its embedding scale multiplies them by",
        ),
        "paligemma_positions_from_one": (
            ("text.cache.*.keys",),
            "mlx-vlm rotates queries and keys from position 0, where transformers' "
            "PaliGemma counts positions from 1: the KV cache holds keys rotated one position apart",
        ),
    },
    "paligemma_fixes",
    "paligemma",
)

#: model type -> runtime -> the ready patch that closes every defect found in that runtime's port of it (the
#: sweep runs each failing model type again with these)
WHOLE = {"paligemma": {"mlx": "paligemma_fixes"}}


def paligemma_image_scale(model: Any) -> Any:
    """Divide the image features by the text model's width, which the text model multiplies them by."""
    config = mlx_vlm_port(model, "paligemma", "paligemma_image_scale").config
    config.hidden_size = config.text_config.hidden_size  # read by _prepare_inputs_for_multimodal alone
    return model


def _from_one(self, x, offset=0):
    """``nn.RoPE.__call__`` one position later."""
    return super(type(self), self).__call__(x, offset=offset + 1)


def paligemma_positions_from_one(model: Any) -> Any:
    """Rotate queries and keys from position 1, as transformers does (see the module docstring)."""
    text = mlx_vlm_port(model, "paligemma", "paligemma_positions_from_one").language_model.model
    for layer in text.layers:
        mlx_call(layer.self_attn.rope, _from_one)
    return model


def paligemma_fixes(model: Any, skip: list[str] | tuple[str, ...] = ()) -> Any:
    """Both corrections, or all but those named in ``skip`` (a runtime takes one patch)."""
    for name, patch in FIXES.items():
        if name not in skip:
            patch(model)
    return model


#: the corrections in the order their defects show along the plan
FIXES = {"paligemma_image_scale": paligemma_image_scale, "paligemma_positions_from_one": paligemma_positions_from_one}
