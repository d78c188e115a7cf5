"""mlx-vlm 0.7.10's InternVL computes every GELU as MLX's tanh approximation, ``nn.GELU(approx="precise")``, whatever
the config says: the vision block MLP, built from InternVL-Chat's (``internvl/vision.py:5`` imports
``internvl_chat.vision.MLP``; ``internvl_chat/vision.py:70``), and the projector (``internvl/internvl.py:21``); its
configs have no ``hidden_act`` / ``projector_hidden_act``. transformers applies ``ACT2FN[vision_config.hidden_act]``
(``InternVLVisionMLP``) and ``ACT2FN[projector_hidden_act]`` (``InternVLMultiModalProjector``): the exact erf GELU for
the hub's InternVL3 checkpoints (``gelu`` both), x * sigmoid(1.702 x) for the tester's vision ``quick_gelu``."""

from __future__ import annotations

from typing import Any

from ....errors import HypothesisPatchError
from ..patching import checkpoint_config, mlx_activation

__all__ = ["internvl_activations"]

CLOSES = {
    "internvl_activations": {
        "runtimes": ("mlx",),
        "stages": ("vision.block.*.mlp.activation_fn", "vision.block.*.mlp", "projector.act", "projector"),
        "model_types": ("internvl",),
        "defect": "mlx-vlm computes every vision MLP and projector GELU as the tanh approximation whatever the "
        "config's hidden_act and projector_hidden_act declare (the exact erf GELU for InternVL3)",
    }
}

#: model type -> runtime -> the ready patch that closes every defect found in that runtime's port of it (the
#: sweep runs each failing model type again with these)
WHOLE = {"internvl": {"mlx": "internvl_activations"}}

#: transformers' names of the tanh GELU mlx-vlm computes
TANH = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")


def internvl_activations(model: Any) -> Any:
    """Every vision MLP's activation and the projector's computed as the checkpoint's ``vision_config.hidden_act`` and
    ``projector_hidden_act`` say."""
    from mlx_vlm.models.internvl.internvl import MultiModalProjector
    from mlx_vlm.models.internvl_chat.vision import MLP

    name = "internvl_activations"
    tower, projector = getattr(model, "vision_tower", None), getattr(model, "multi_modal_projector", None)
    mlps = [m for _, m in tower.named_modules() if isinstance(m, MLP)] if tower is not None else []
    if not mlps or not isinstance(projector, MultiModalProjector):
        raise HypothesisPatchError(
            f"{name} corrects mlx-vlm's InternVL activations; it was given a {type(model).__name__}",
            "apply it to the mlx runtime of an internvl checkpoint",
        )
    config = checkpoint_config(model, name)
    vision = (config.get("vision_config") or {}).get("hidden_act", "gelu")
    projected = config.get("projector_hidden_act", "gelu")
    if vision in TANH and projected in TANH:
        raise HypothesisPatchError(
            f"{name}: the checkpoint's activations are {vision!r} and {projected!r}, the tanh GELU mlx-vlm computes",
            "leave the patch out for this checkpoint",
        )
    for mlp in mlps:
        mlp.activation_fn = mlx_activation(vision, name)  # the modules the calls run, at the same paths
    projector.activation = mlx_activation(projected, name)
    return model
