"""What quantized and mixed-precision policies need of Molmo2: its tensor groups in both namings, the linear
layers behind stages, and the operators each runtime can keep in float32."""

from __future__ import annotations

from typing import Any

import numpy as np

from driftscope.errors import ParameterError
from driftscope.model.quant.names import NameMap
from driftscope.model.quant.profiles import LinearSite, QuantProfile
from driftscope.model.quant.select import TensorGroups
from driftscope.taps.mlx_hooks import attribute_site

from ..capabilities import PrecisionCapabilities
from .config import mlx_config
from .plan import parse_stage

# What quantized policies need to know about Molmo2: its tensor groups in both namings, the MLX -> checkpoint
# name map, the config MLX-community directories carry, and the stages that are one linear layer's output.
#
# The vision side is the ViT, the attention pooler and the projector (``model.vision_backbone.``); the text side
# the decoder and ``lm_head``. The patch embedding is a linear layer over 14 x 14 x 3 = 588 pixel values, which no
# group size (32, 64, 128) divides: it stays dense and is reported (``left_dense``). The position table and the word
# embeddings are plain parameters in mlx-vlm (not ``nn.Embedding``), so they stay dense as ``nn.quantize`` leaves them.

VIT = "vision_tower.image_vit."
#: block substage -> the linear layer (under ``vision_tower.image_vit.transformer.N.``) whose output it is
BLOCK_LINEARS = {
    "attn.q": "attention.wq",
    "attn.k": "attention.wk",
    "attn.v": "attention.wv",
    "attn.out": "attention.wo",
    "mlp.fc1": "feed_forward.w1",
    "mlp.fc2": "feed_forward.w2",
}
#: head stage -> its linear layer (the pooler's output reads two stages, so it has no single-input replay)
HEAD_LINEARS = {
    "vision.patch_embed": VIT + "patch_embedding",
    "projector.gate": "vision_tower.image_projector.w1",
    "projector.up": "vision_tower.image_projector.w3",
    "projector.output": "vision_tower.image_projector.w2",
}


def dense_config(config: dict) -> dict:
    """``config`` without the empty ``vision_config`` mlx-vlm's layout carries next to ``vit_config``
    (transformers would build its default ViT from it)."""
    if config.get("vit_config") and not config.get("vision_config"):
        return {key: value for key, value in config.items() if key != "vision_config"}
    return dict(config)


def _as_stage(output: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The layer's ``(rows, out_features)`` output in the stage's shape (heads split, crops and patches apart)."""
    return output.reshape(shape)


def linear_site(stage_id: str) -> LinearSite | None:
    """The linear layer whose output ``stage_id`` is (the stage's replay input is the layer's input)."""
    block, kind = parse_stage(stage_id)
    if block is None:
        module = HEAD_LINEARS.get(stage_id)
        return None if module is None else LinearSite(module, _as_stage)
    if kind not in BLOCK_LINEARS:
        return None
    return LinearSite(f"{VIT}transformer.{block}.{BLOCK_LINEARS[kind]}", _as_stage)


PROFILE = QuantProfile(
    checkpoint=TensorGroups(vision=("model.vision_backbone.",), text=("model.transformer.", "lm_head.")),
    mlx=TensorGroups(vision=("vision_tower.",), text=("language_model.",)),
    mlx_names=NameMap(
        # mlx-vlm's ``Model.sanitize`` in reverse; its ViT blocks are a list, the checkpoint's ``resblocks``
        renames=(
            (VIT + "transformer.", "model.vision_backbone.image_vit.transformer.resblocks."),
            ("vision_tower.", "model.vision_backbone."),
            ("language_model.model.", "model.transformer."),
            ("language_model.lm_head.", "lm_head."),
        ),
    ),
    mlx_config=mlx_config,
    linears=linear_site,
    dense_config=dense_config,
)


# Which of Molmo2's operators a runtime can keep in float32, by the stage they compute, and where mlx-vlm's
# model holds them (``options.f32`` and ``driftscope precision``, see ``driftscope.model.mixed``).
#
# A ViT block operator is named by its stage's substage name (``norm2``; Molmo2 projects q, k and v separately);
# an image-path operator by its stage id: the patch embedding, the pooler's attention as one operator
# (``pool.output``: its q/k/v/o projections and the attention), the projector's gate, up and down
# (``projector.output``) projections.
#
# mlx-vlm 0.7.10's Molmo2 port has defects no float32 operator closes (fast GELU, the selected layers, the causal
# image mask: ``driftscope.hypotheses:mlx_vlm_fixes``); a search over an unpatched MLX candidate says so ("no set
# of float32 operators closes it"), and a search over one patched with the fixes searches what is left.
#
# The text side: the plan taps each decoder layer's output only (``text.layer.N``), no substage inside a layer, so
# the search has no text operator kinds to name (``TEXT``).

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
