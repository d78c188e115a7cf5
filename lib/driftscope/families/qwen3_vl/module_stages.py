"""Qwen3-VL's stages that are a module's output or input, declared for both sides (``taps.module_taps``): paths
from the tower (transformers' ``model.model.visual``, mlx-vlm's ``vision_tower``: the same names), ``{i}`` each
block; and the decoder's, with the DeepStack image slots. What no module gives is written by ``transformers_taps``
and ``mlx_taps``: q/k after RoPE (a function), the interpolated position table (the gathered rows times the
weights a function returned; on MLX a method), the attention bounds (each block's keyword arguments), and on MLX
the rotary tables (its angles, from a method).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from driftscope.taps.module_taps import ModuleTap, argument, both, output

from ..qwen_shared.text import text_taps
from ..qwen_shared.tower import block_taps
from .plan import deepstack_stage_id


def _merger(stage: str, path: str) -> list[ModuleTap]:
    """A merger's norm, first projection, activation and output."""
    return [
        both(f"{stage}.norm", output(f"{path}.norm")),
        both(f"{stage}.fc1", output(f"{path}.linear_fc1")),
        both(f"{stage}.act", output(f"{path}.act_fn")),
        both(stage, output(path)),
    ]


#: each block's MLP stages on its modules (``{i}``: the block)
MLP = (
    both("vision.block.{i}.mlp.fc1", output("blocks.{i}.mlp.linear_fc1")),
    both("vision.block.{i}.mlp.act", output("blocks.{i}.mlp.act_fn")),
    both("vision.block.{i}.mlp.fc2", output("blocks.{i}.mlp.linear_fc2")),
)


def tower_taps(tower: Any) -> list[ModuleTap]:
    """Every stage of the tower that a module's output or input holds, for ``tower``'s depth, heads and branches."""
    branches = range(len(tower.deepstack_merger_list))
    return [
        *block_taps(tower, MLP),
        ModuleTap("vision.positioned", torch=argument("rotary_pos_emb"), mlx=argument("blocks.0")),
        *(tap for branch in branches for tap in _merger(deepstack_stage_id(branch), f"deepstack_merger_list.{branch}")),
        *_merger("vision.merger", "merger"),
    ]


def decoder_taps(layers: int, branches: int, image: np.ndarray) -> list[ModuleTap]:
    """The decoder's stages (``qwen_shared.text.text_taps``), and for each layer followed by a DeepStack add its
    own output's image slots (``text.layer.N.image``) and what the next layer (or the final norm) receives after
    the add (``text.layer.N.deepstack``); ``image``: the image slots, then the video slots."""

    def slots(array: np.ndarray) -> np.ndarray:
        return array[0][image]

    taps = text_taps(layers)
    for index in range(min(branches, layers)):
        following = f"layers.{index + 1}" if index + 1 < layers else "norm"
        taps.append(both(f"text.layer.{index}.image", output(f"layers.{index}", slots)))
        taps.append(both(f"text.layer.{index}.deepstack", argument(following, slots)))
    return taps
