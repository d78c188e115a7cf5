"""What quantized policies need to know about Qwen2.5-VL: its tensor groups in both namings, the MLX -> checkpoint
name map, the config MLX-community directories carry, and the stages that are one linear layer's output."""

from __future__ import annotations

import numpy as np

from driftscope.model.quant.names import NameMap
from driftscope.model.quant.profiles import LinearSite, QuantProfile
from driftscope.model.quant.select import TensorGroups

from .mlx_config import adapt_config
from .plan import parse_stage

#: block substage -> the linear layer (under ``vision_tower.blocks.N.``) whose output it is
BLOCK_LINEARS = {
    "attn.out": "attn.proj",
    "mlp.gate": "mlp.gate_proj",
    "mlp.up": "mlp.up_proj",
    "mlp.down": "mlp.down_proj",
}


def _value_third(output: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The value part of the fused q/k/v projection, as ``attn.v`` holds it: (tokens, heads, head_dim)."""
    return output.reshape(output.shape[0], 3, *shape[1:])[:, 2]


def linear_site(stage_id: str) -> LinearSite | None:
    """The linear layer whose output ``stage_id`` is (the stage's replay input is the layer's input)."""
    block, kind = parse_stage(stage_id)
    if block is None:
        return LinearSite("vision_tower.merger.mlp.2") if kind == "merger.window" else None
    if kind == "attn.v":
        return LinearSite(f"vision_tower.blocks.{block}.attn.qkv", _value_third)
    return LinearSite(f"vision_tower.blocks.{block}.{BLOCK_LINEARS[kind]}") if kind in BLOCK_LINEARS else None


PROFILE = QuantProfile(
    checkpoint=TensorGroups(vision=("visual.", "model.visual."), text=("model.", "lm_head.")),
    mlx=TensorGroups(vision=("vision_tower.",), text=("language_model.",)),
    mlx_names=NameMap(
        renames=(
            ("vision_tower.", "visual."),
            ("language_model.model.", "model."),
            ("language_model.lm_head.", "lm_head."),
        ),
        # MLX's Conv3d weight is (out, t, h, w, in); the checkpoint's (out, in, t, h, w)
        permutes=(("patch_embed.proj.weight", (0, 4, 1, 2, 3)),),
    ),
    mlx_config=adapt_config,
    linears=linear_site,
)
