"""Qwen3-VL-MoE's ready-made hypothesis patches (``patch: driftscope.hypotheses:NAME``): Qwen3-VL's (its tower
and DeepStack are the same code), the correction of mlx-vlm's port, and a router shift, which changes which
experts some tokens are routed to.

mlx-vlm 0.7.10's ``qwen3_vl_moe/vision.py`` swaps the tower's two GELUs against transformers and against its own
``qwen3_vl`` port: its blocks' MLP computes the exact (erf) GELU where the checkpoint says
``gelu_pytorch_tanh``, and its patch mergers (main and DeepStack) the tanh GELU where transformers' are exact.
``mlx_vlm_gelus`` puts them back (the family's known defect of that port).
"""

from __future__ import annotations

from typing import Any

from ...errors import HypothesisPatchError
from ..capabilities import HypothesesCapabilities
from ..qwen3_vl.hypotheses import _is_mlx, drop_deepstack_branch, scale_block_output

__all__ = ["drop_deepstack_branch", "mlx_vlm_gelus", "scale_block_output", "shift_router"]

#: The stages each patch closes when a runtime's operator introduces an error there.
CLOSES = {
    "mlx_vlm_gelus": {
        "runtimes": ("mlx",),
        "stages": ("vision.block.*.mlp.act", "vision.deepstack.*.act", "vision.merger.act"),
        "defect": "mlx-vlm's Qwen3-VL-MoE tower swaps its two GELUs: its blocks' MLP computes the exact (erf) GELU "
        "where the checkpoint declares gelu_pytorch_tanh, and its patch mergers the tanh GELU where transformers' "
        "are exact",
    }
}
CAPABILITIES = HypothesesCapabilities(closes=CLOSES)


def mlx_vlm_gelus(model: Any) -> Any:
    """mlx-vlm's Qwen3-VL-MoE tower with transformers' GELUs: tanh in the blocks' MLP, exact in the mergers."""
    if not _is_mlx(model):
        raise HypothesisPatchError(
            f"mlx_vlm_gelus corrects mlx-vlm's Qwen3-VL-MoE tower; it was given a {type(model).__name__}",
            "apply it to a runtime: mlx entry of the parameter file",
        )
    import mlx.nn as nn

    tower = model.vision_tower
    for block in tower.blocks:
        block.mlp.act_fn = nn.GELU(approx="tanh")
    for merger in [*tower.deepstack_merger_list, tower.merger]:
        merger.act_fn = nn.GELU()
    return model


class _Shifted:
    """Calls a router's linear layer and adds ``shift`` to one expert's logit."""

    def __init__(self, gate: Any, expert: int, shift: float):
        self.gate, self.expert, self.shift = gate, expert, shift

    def __call__(self, x):
        import mlx.core as mx

        logits = self.gate(x)
        return logits + self.shift * (mx.arange(logits.shape[-1]) == self.expert).astype(logits.dtype)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.gate, name)


def shift_router(model: Any, layer: int = 0, expert: int = 0, shift: float = 1.0) -> Any:
    """What if decoder layer ``layer``'s router favoured ``expert`` by ``shift`` (added to its logit)?"""
    if _is_mlx(model):
        block = model.language_model.model.layers[layer].mlp
        object.__setattr__(block, "gate", _Shifted(block.gate, expert, shift))
        return model
    import torch

    router = model.model.language_model.layers[layer].mlp.gate

    def shifted(module, args, out):  # the router's own math on the shifted logits
        logits = out[0].clone()
        logits[:, expert] += shift
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        top, chosen = torch.topk(probs, module.top_k, dim=-1)
        return logits, (top / top.sum(dim=-1, keepdim=True)).to(logits.dtype), chosen

    router.register_forward_hook(shifted)
    return model
