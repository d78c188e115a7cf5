"""What quantized policies need to know about Qwen3-VL: its tensor groups in both namings, the MLX -> checkpoint
name map, the config MLX-community directories carry, and the stages that are one linear layer's output.

Every matrix of both sides is quantizable at group size 64 on the tiny fixture, the position table (an embedding)
included, as ``nn.quantize`` quantizes it; mlx-vlm's ``fast_pos_embed_interpolate`` reads the quantized table
through the embedding call.
"""

from __future__ import annotations

import numpy as np

from driftscope.model.quant.names import NameMap
from driftscope.model.quant.profiles import LinearSite, QuantProfile
from driftscope.model.quant.select import TensorGroups

from .mlx_config import adapt_config
from .plan import parse_stage

#: block substage -> the linear layer (under ``vision_tower.blocks.N.``) whose output it is
BLOCK_LINEARS = {"attn.out": "attn.proj", "mlp.fc1": "mlp.linear_fc1", "mlp.fc2": "mlp.linear_fc2"}
#: merger substage -> its linear layer (under the main merger or a DeepStack merger)
MERGER_LINEARS = {"fc1": "linear_fc1", "output": "linear_fc2"}


def _value_third(output: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The value part of the fused q/k/v projection, as ``attn.v`` holds it: (tokens, heads, head_dim)."""
    return output.reshape(output.shape[0], 3, *shape[1:])[:, 2]


def linear_site(stage_id: str) -> LinearSite | None:
    """The linear layer whose output ``stage_id`` is (the stage's replay input is the layer's input)."""
    if not stage_id.startswith("vision."):
        return None
    block, branch, kind = parse_stage(stage_id)
    if block is not None:
        if kind == "attn.v":
            return LinearSite(f"vision_tower.blocks.{block}.attn.qkv", _value_third)
        return LinearSite(f"vision_tower.blocks.{block}.{BLOCK_LINEARS[kind]}") if kind in BLOCK_LINEARS else None
    prefix, _, sub = kind.partition(".")
    if sub not in MERGER_LINEARS:
        return None
    if prefix == "deepstack" and branch is not None:
        return LinearSite(f"vision_tower.deepstack_merger_list.{branch}.{MERGER_LINEARS[sub]}")
    return LinearSite(f"vision_tower.merger.{MERGER_LINEARS[sub]}") if prefix == "merger" else None


PROFILE = QuantProfile(
    checkpoint=TensorGroups(vision=("model.visual.",), text=("model.language_model.", "lm_head.")),
    mlx=TensorGroups(vision=("vision_tower.",), text=("language_model.",)),
    mlx_names=NameMap(
        renames=(
            ("vision_tower.", "model.visual."),
            ("language_model.model.", "model.language_model."),
            ("language_model.lm_head.", "lm_head."),
        ),
        # MLX's Conv3d weight is (out, t, h, w, in); the checkpoint's (out, in, t, h, w)
        permutes=(("patch_embed.proj.weight", (0, 4, 1, 2, 3)),),
    ),
    mlx_config=adapt_config,
    linears=linear_site,
)
