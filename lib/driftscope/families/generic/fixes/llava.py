"""mlx-vlm 0.7.10's LLaVA text models (``llava``, ``llava_next``; ``llava_onevision`` builds on Qwen2's): the decoder
MLP is always SwiGLU, ``down(silu(gate(x)) * up(x))`` (``llava/language.py:12`` and ``llava_next/language.py:12``
import ``SwiGLUMLP as MLP``, ``qwen2/language.py:12`` the same), whatever the text config's ``hidden_act`` says;
transformers' ``LlamaMLP`` / ``Qwen2MLP`` gate with ``ACT2FN[hidden_act]``. Their text config classes have no
``hidden_act`` field at all (``llava/config.py``)."""

from __future__ import annotations

from typing import Any

from ....errors import HypothesisPatchError
from ..patching import checkpoint_config, mlx_gated_mlps

__all__ = ["llava_text_mlp_hidden_act"]

#: the model types whose mlx-vlm text model builds ``SwiGLUMLP`` for every layer
MODEL_TYPES = ("llava", "llava_next", "llava_onevision")

CLOSES = {
    "llava_text_mlp_hidden_act": {
        "runtimes": ("mlx",),
        "stages": ("text.layer.*.mlp",),
        "model_types": MODEL_TYPES,
        "defect": "mlx-vlm's text MLP is always SwiGLU, down(silu(gate(x)) * up(x)), whatever the text config's "
        "hidden_act declares; transformers gates with that activation",
    }
}

#: model type -> runtime -> the ready patch that closes every defect found in that runtime's port of it (the
#: sweep runs each failing model type again with these)
WHOLE = {model_type: {"mlx": "llava_text_mlp_hidden_act"} for model_type in MODEL_TYPES}


def llava_text_mlp_hidden_act(model: Any, hidden_act: str | None = None) -> Any:
    """Gate every text MLP with the checkpoint's ``text_config.hidden_act`` (``hidden_act`` overrides it), as
    transformers does: ``down(act(gate(x)) * up(x))``."""
    from mlx_vlm.models.mlp import SwiGLUMLP

    name = "llava_text_mlp_hidden_act"
    config = checkpoint_config(model, name) if hidden_act is None else {}
    if hidden_act is None and config.get("model_type") not in MODEL_TYPES:
        raise HypothesisPatchError(
            f"{name} corrects mlx-vlm's {', '.join(MODEL_TYPES)} text MLP; this is {config.get('model_type')!r}",
            "apply it to the mlx runtime of one of those checkpoints",
        )
    wanted = hidden_act or (config.get("text_config") or {}).get("hidden_act", "silu")
    if wanted in ("silu", "swish"):
        raise HypothesisPatchError(
            f"{name}: the text config's hidden_act is {wanted!r}, which mlx-vlm's SwiGLU already computes",
            "leave the patch out for this checkpoint",
        )
    language = getattr(model, "language_model", None)
    mlps = [m for _, m in language.named_modules() if isinstance(m, SwiGLUMLP)] if language is not None else []
    if not mlps:
        raise HypothesisPatchError(f"{name} found no SwiGLU MLP in this {type(model).__name__}", "write your own patch")
    mlx_gated_mlps(mlps, wanted, name)
    return model
