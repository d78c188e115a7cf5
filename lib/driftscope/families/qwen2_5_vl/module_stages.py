"""Qwen2.5-VL's stages that are a module's output or input, declared for both sides (``taps.module_taps``): paths
from the tower (transformers' ``model.model.visual``, mlx-vlm's ``vision_tower``: the same names), ``{i}`` each
block. What no module gives is written by ``transformers_taps`` and ``mlx_taps``: q/k after RoPE (a function), the
window index and the attention bounds (a function and each block's keyword arguments), the merged features (the
tower's result), and on MLX the rotary tables (its angles, from a method) and the SiLU (a function its MLP calls).
"""

from __future__ import annotations

from typing import Any

from driftscope.taps.module_taps import ModuleTap, argument, both, output

from ..qwen_shared.tower import block_taps

#: each block's MLP stages on its modules (``{i}``: the block); on MLX the activation is ``nn.silu``, a function
MLP = (
    both("vision.block.{i}.mlp.gate", output("blocks.{i}.mlp.gate_proj")),
    ModuleTap("vision.block.{i}.mlp.act", torch=output("blocks.{i}.mlp.act_fn")),
    both("vision.block.{i}.mlp.up", output("blocks.{i}.mlp.up_proj")),
    both("vision.block.{i}.mlp.product", argument("blocks.{i}.mlp.down_proj")),
    both("vision.block.{i}.mlp.down", output("blocks.{i}.mlp.down_proj")),
)


def tower_taps(tower: Any) -> list[ModuleTap]:
    """Every stage of the tower that a module's output or input holds, for ``tower``'s depth and heads."""
    return [
        *block_taps(tower, MLP),
        both("vision.merger.norm", output("merger.ln_q")),
        both("vision.merger.hidden", output("merger.mlp.1")),
        both("vision.merger.window", output("merger")),
    ]
