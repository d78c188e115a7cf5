"""Which of Molmo2's operators a runtime can keep in float32, by the stage they compute, and where mlx-vlm's
model holds them (``options.f32`` and ``driftscope precision``, see ``driftscope.model.mixed``).

A ViT block operator is named by its stage's substage name (``norm2``; Molmo2 projects q, k and v separately);
an image-path operator by its stage id: the patch embedding, the pooler's attention as one operator
(``pool.output``: its q/k/v/o projections and the attention), the projector's gate, up and down
(``projector.output``) projections.

mlx-vlm 0.7.10's Molmo2 port has defects no float32 operator closes (fast GELU, the selected layers, the causal
image mask: ``driftscope.hypotheses:mlx_vlm_fixes``); a search over an unpatched MLX candidate says so ("no set
of float32 operators closes it"), and a search over one patched with the fixes searches what is left.

The text side: the plan taps each decoder layer's output only (``text.layer.N``), no substage inside a layer, so
the search has no text operator kinds to name (``TEXT``).
"""

from __future__ import annotations

from typing import Any

from driftscope.errors import ParameterError
from driftscope.taps.mlx_hooks import attribute_site

from ..capabilities import PrecisionCapabilities
from .plan import parse_stage

#: Why no text operator is searched (the report's ``precision.<candidate>.text``).
TEXT = (
    "the Molmo2 plan taps each text decoder layer's output only (text.layer.N), no substage inside a layer: "
    "the search names no text operator kinds"
)
CAPABILITIES = PrecisionCapabilities(text_reason=TEXT)

#: mlx-vlm's module for each ViT block operator kind (under ``vision_tower.image_vit.transformer[b]``).
_MLX_BLOCK = {
    "norm1": "attention_norm",
    "attn.q": "attention.wq",
    "attn.k": "attention.wk",
    "attn.v": "attention.wv",
    "attn.out": "attention.wo",
    "norm2": "ffn_norm",
    "mlp.fc1": "feed_forward.w1",
    "mlp.act": "feed_forward.act",
    "mlp.fc2": "feed_forward.w2",
}
#: mlx-vlm's module for each image-path operator (under ``vision_tower``).
_MLX_TOWER = {
    "vision.patch_embed": "image_vit.patch_embedding",
    "pool.output": "image_pooling_2d",
    "projector.gate": "image_projector.w1",
    "projector.up": "image_projector.w3",
    "projector.output": "image_projector.w2",
}
#: What the emitter's contract widens (``Contract.at``): every dot and every rounding of the state.
_EMITTER_BLOCK = (
    "norm1",
    "attn.q",
    "attn.k",
    "attn.v",
    "attn.context",
    "attn.out",
    "residual1",
    "norm2",
    "mlp.fc1",
    "mlp.fc2",
)
_EMITTER_TOWER = ("vision.patch_embed", "vision.positioned", "pool.output", "projector.gate", "projector.up")
_EMITTER_TOWER += ("projector.output",)

BLOCK_KINDS = {"mlx": tuple(_MLX_BLOCK), "iree": _EMITTER_BLOCK, "jax": _EMITTER_BLOCK}
TOWER_KINDS = {"mlx": tuple(_MLX_TOWER), "iree": _EMITTER_TOWER, "jax": _EMITTER_TOWER}


def mlx_sites(model: Any, stage_ids: list[str]) -> list[tuple[Any, str | int]]:
    """(owner, attribute) of the mlx-vlm module computing each stage."""
    tower = model.vision_tower
    sites = []
    for stage_id in stage_ids:
        block, kind = parse_stage(stage_id)
        table = _MLX_BLOCK if block is not None else _MLX_TOWER
        if kind not in table:
            raise ParameterError(
                f"options.f32 names {stage_id!r}, which mlx-vlm's Molmo2 port cannot compute in float32 alone",
                f"name a ViT block's {', '.join(_MLX_BLOCK)} or one of {', '.join(_MLX_TOWER)}",
            )
        owner = tower.image_vit.transformer[block] if block is not None else tower
        sites.append(attribute_site(owner, table[kind]))
    return sites


def operators(runtime: str, plan) -> list[str]:
    """The operators ``runtime`` can keep in float32, in the plan's order, as stage-id templates (``{b}``: a block
    index): the plan's block substages, then the image path's stages where ``runtime`` can.
    ``plan``: the family's full vision plan."""
    block_kinds, tower_kinds = BLOCK_KINDS.get(runtime, ()), TOWER_KINDS.get(runtime, ())
    found: list[str] = []
    for stage in plan:
        if stage.block == 0 and stage.substage is not None:
            template = f"vision.block.{{b}}.{stage.substage}"
            if stage.substage in block_kinds and template not in found:
                found.append(template)
        elif stage.block is None and stage.id in tower_kinds:
            found.append(stage.id)
    return found
