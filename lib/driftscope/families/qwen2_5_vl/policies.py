"""What Qwen2.5-VL's precision policies need: the quantization profile (tensor groups, MLX names, the
linear layers behind stages) and the operators each runtime can keep in float32 (``options.f32``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from driftscope.errors import ParameterError
from driftscope.model.quant.names import NameMap
from driftscope.model.quant.profiles import LinearSite, QuantProfile
from driftscope.model.quant.select import TensorGroups
from driftscope.taps.mlx_hooks import attribute_site

from ..capabilities import PrecisionCapabilities
from .mlx import adapt_config
from .plan import parse_stage

# What quantized policies need to know about Qwen2.5-VL: its tensor groups in both namings, the MLX -> checkpoint
# name map, the config MLX-community directories carry, and the stages that are one linear layer's output.

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


# Which of Qwen2.5-VL's operators a runtime can keep in float32, by the stage they compute, and where mlx-vlm's
# model holds them (``options.f32`` and ``driftscope precision``, see ``driftscope.model.mixed``).
#
# A block operator is named by its stage's substage name (``norm2``), except the fused q/k/v projection, which
# computes three stages and is named ``attn.qkv``; a tower operator by its stage id (``vision.merger.norm``).
#
# The text side: the plan taps each decoder layer's output only (``text.layer.N``), no substage inside a layer, so
# the search has no text operator kinds to name (``TEXT``); a text failure is reported, not searched.

#: Why no text operator is searched (the report's ``precision.<candidate>.text``).
TEXT = (
    "the Qwen2.5-VL plan taps each text decoder layer's output only (text.layer.N), no substage inside a layer: "
    "the search names no text operator kinds"
)
CAPABILITIES = PrecisionCapabilities(text_reason=TEXT)

#: The operator computing each substage (the fused projection computes q, k and v).
OPERATOR_OF = {"attn.q": "attn.qkv", "attn.k": "attn.qkv", "attn.v": "attn.qkv"}

#: mlx-vlm's module for each operator kind: under a block, or under the vision tower.
_MLX_BLOCK = {
    "norm1": "norm1",
    "attn.qkv": "attn.qkv",
    "attn.out": "attn.proj",
    "norm2": "norm2",
    "mlp.gate": "mlp.gate_proj",
    "mlp.up": "mlp.up_proj",
    "mlp.down": "mlp.down_proj",
}
_MLX_TOWER = {
    "patch_embed": "patch_embed",
    "merger.norm": "merger.ln_q",
    "merger.hidden": "merger.mlp.0",
    "merger.window": "merger.mlp.2",
}
#: What the emitter's contract widens (``Contract.at``): every dot and every rounding of the state.
_EMITTER_BLOCK = (
    "norm1",
    "attn.qkv",
    "attn.context",
    "attn.out",
    "residual1",
    "norm2",
    "mlp.gate",
    "mlp.up",
    "mlp.down",
)
_EMITTER_TOWER = ("patch_embed", "merger.norm", "merger.hidden", "merger.window")

BLOCK_KINDS = {"mlx": tuple(_MLX_BLOCK), "iree": _EMITTER_BLOCK, "jax": _EMITTER_BLOCK}
TOWER_KINDS = {"mlx": tuple(_MLX_TOWER), "iree": _EMITTER_TOWER, "jax": _EMITTER_TOWER}


def mlx_sites(model: Any, stage_ids: list[str]) -> list[tuple[Any, str | int]]:
    """(owner, attribute) of the mlx-vlm module computing each stage (a stage id, or a block's ``attn.qkv``)."""
    tower = model.vision_tower
    sites = []
    for stage_id in stage_ids:
        block, kind = parse_stage(stage_id)
        table = _MLX_BLOCK if block is not None else _MLX_TOWER
        if kind not in table:
            raise ParameterError(
                f"options.f32 names {stage_id!r}, which mlx-vlm's Qwen2.5-VL port cannot compute in float32 alone",
                f"name a block's {', '.join(_MLX_BLOCK)} or the tower's {', '.join(_MLX_TOWER)}",
            )
        owner = tower.blocks[block] if block is not None else tower
        sites.append(attribute_site(owner, table[kind]))
    return sites


def operators(runtime: str, plan) -> list[str]:
    """The operators ``runtime`` can keep in float32, in the plan's order, as stage-id templates (``{b}``: a block
    index): the plan's block substages (the fused projection once), then its tower stages, where ``runtime`` can.
    ``plan``: the family's full vision plan."""
    block_kinds, tower_kinds = BLOCK_KINDS.get(runtime, ()), TOWER_KINDS.get(runtime, ())
    found: list[str] = []
    for stage in plan:
        if stage.block == 0 and stage.substage is not None:
            kind = OPERATOR_OF.get(stage.substage, stage.substage)
            template = f"vision.block.{{b}}.{kind}"
            if kind in block_kinds and template not in found:
                found.append(template)
        elif stage.block is None and parse_stage(stage.id)[1] in tower_kinds:
            found.append(stage.id)
    return found
