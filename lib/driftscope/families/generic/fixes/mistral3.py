"""mlx-vlm 0.7.10's Mistral 3 vision tower is its Pixtral one (``mistral3/mistral3.py:7``), whose block MLP gates with
``nn.silu`` (``pixtral/vision.py:122``) whatever the vision config's ``hidden_act`` says (its ``VisionConfig`` has no
such field); transformers' ``PixtralMLP`` gates with ``ACT2FN[hidden_act]`` (``PixtralVisionConfig`` defaults to
``gelu``, the tester's; the hub's Pixtral and Mistral-Small-3.1 configs say ``silu``)."""

from __future__ import annotations

from typing import Any

from ....errors import HypothesisPatchError
from ..patching import checkpoint_config, mlx_gated_mlps

__all__ = ["pixtral_vision_mlp_hidden_act"]

CLOSES = {
    "pixtral_vision_mlp_hidden_act": {
        "runtimes": ("mlx",),
        "stages": ("vision.block.*.feed_forward",),
        "model_types": ("mistral3",),
        "defect": "mlx-vlm's Pixtral vision MLP gates with silu whatever the vision config's hidden_act declares; "
        "transformers gates with that activation",
    }
}

#: model type -> runtime -> the ready patch that closes every defect found in that runtime's port of it (the
#: sweep runs each failing model type again with these)
WHOLE = {"mistral3": {"mlx": "pixtral_vision_mlp_hidden_act"}}


def pixtral_vision_mlp_hidden_act(model: Any) -> Any:
    """Every Pixtral vision MLP gated with the checkpoint's ``vision_config.hidden_act``, as transformers does:
    ``down(act(gate(x)) * up(x))``."""
    from mlx_vlm.models.pixtral.vision import MLP

    name = "pixtral_vision_mlp_hidden_act"
    tower = getattr(model, "vision_tower", None)
    mlps = [m for _, m in tower.named_modules() if isinstance(m, MLP)] if tower is not None else []
    if not mlps:
        raise HypothesisPatchError(
            f"{name} corrects mlx-vlm's Pixtral vision MLP; it was given a {type(model).__name__}",
            "apply it to the mlx runtime of a mistral3 checkpoint",
        )
    wanted = (checkpoint_config(model, name).get("vision_config") or {}).get("hidden_act", "gelu")
    if wanted in ("silu", "swish"):
        raise HypothesisPatchError(
            f"{name}: the vision config's hidden_act is {wanted!r}, which mlx-vlm already computes",
            "leave the patch out for this checkpoint",
        )
    mlx_gated_mlps(mlps, wanted, name)
    return model
