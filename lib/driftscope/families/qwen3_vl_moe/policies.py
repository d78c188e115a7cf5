"""What quantized policies need to know about Qwen3-VL-MoE: Qwen3-VL's tensor groups, name map, config and linear
stages, and the sparse layers' stacked experts.

The released checkpoints store each sparse layer's experts as two stacked tensors, ``experts.gate_up_proj``
[experts, hidden, 2 x intermediate] and ``experts.down_proj`` [experts, intermediate, hidden]; mlx-vlm splits the
first into ``switch_mlp.gate_proj`` and ``up_proj`` and transposes both into ``[experts, out, in]``
(``SwitchLinear``, which ``nn.quantize`` quantizes expert by expert along the input axis). The name map joins and
splits them, so MLX's quantized experts dequantize into the checkpoint's layout (the oracle's) and a dense
checkpoint's experts quantize in MLX's (the same codes ``nn.quantize`` gives the loaded model). The router
(``mlp.gate``) is an ordinary linear layer.
"""

from __future__ import annotations

from dataclasses import replace

from driftscope.model.quant.names import Joined
from driftscope.model.quant.profiles import QuantProfile

from ..qwen3_vl.mlx import adapt_config
from ..qwen3_vl.policies import PROFILE as DENSE

#: mlx-vlm's stacked expert matrices, [experts, out, in]
EXPERTS = (".mlp.switch_mlp.gate_proj.weight", ".mlp.switch_mlp.up_proj.weight", ".mlp.switch_mlp.down_proj.weight")
#: MLX -> checkpoint: the gate and up projections transposed and joined into ``gate_up_proj``, down transposed
JOINS = (
    Joined(".mlp.experts.gate_up_proj", EXPERTS[:2], axes=(0, 2, 1), axis=-1),
    Joined(".mlp.experts.down_proj", EXPERTS[2:], axes=(0, 2, 1)),
)


def mlx_config(config: dict) -> dict:
    """The config an MLX-community Qwen3-VL-MoE directory carries (mlx-vlm's names: ``num_experts``)."""
    from .mlx import mlx_view

    return adapt_config(mlx_view(config), "qwen3_vl_moe")


PROFILE = QuantProfile(
    checkpoint=DENSE.checkpoint,
    mlx=replace(DENSE.mlx, stacked=EXPERTS),
    mlx_names=replace(DENSE.mlx_names, joins=JOINS),
    mlx_config=mlx_config,
    linears=DENSE.linears,
)
