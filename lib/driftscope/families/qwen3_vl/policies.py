"""What Qwen3-VL's precision policies need: the quantization profile (tensor groups, MLX names, the linear
layers behind stages) and the operators each runtime can keep in float32 (``options.f32``)."""

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

# What quantized policies need to know about Qwen3-VL: its tensor groups in both namings, the MLX -> checkpoint
# name map, the config MLX-community directories carry, and the stages that are one linear layer's output.
#
# Every matrix of both sides is quantizable at group size 64 on the tiny fixture, the position table (an embedding)
# included, as ``nn.quantize`` quantizes it; mlx-vlm's ``fast_pos_embed_interpolate`` reads the quantized table
# through the embedding call.

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


# Which of Qwen3-VL's operators a runtime can keep in float32, by the stage they compute, and where mlx-vlm's
# model holds them (``options.f32`` and ``driftscope precision``, see ``driftscope.model.mixed``). Qwen3-VL-MoE
# builds on this tower and uses this module too.
#
# A block operator is named by its stage's substage name (``norm2``), except the fused q/k/v projection, which
# computes three stages and is named ``attn.qkv``; a merger operator (the main merger's or a DeepStack branch's) by
# its stage id (``vision.merger.norm``), except its second projection, whose output is the merger's own stage and
# which is named ``<merger>.fc2`` (``vision.merger.fc2``, ``vision.deepstack.1.fc2``).
#
# The text side: the plan taps each decoder layer's output only (``text.layer.N``), no substage inside a layer, so
# the search has no text operator kinds to name (``TEXT``); a text failure is reported, not searched.

#: Why no text operator is searched (the report's ``precision.<candidate>.text``).
TEXT = (
    "the Qwen3-VL plan taps each text decoder layer's output only (text.layer.N), no substage inside a layer: "
    "the search names no text operator kinds"
)
CAPABILITIES = PrecisionCapabilities(text_reason=TEXT)

#: The operator computing each substage (the fused projection computes q, k and v).
OPERATOR_OF = {"attn.q": "attn.qkv", "attn.k": "attn.qkv", "attn.v": "attn.qkv"}

#: mlx-vlm's module for each block operator kind (under ``vision_tower.blocks[b]``).
_MLX_BLOCK = {
    "norm1": "norm1",
    "attn.qkv": "attn.qkv",
    "attn.out": "attn.proj",
    "norm2": "norm2",
    "mlp.fc1": "mlp.linear_fc1",
    "mlp.act": "mlp.act_fn",
    "mlp.fc2": "mlp.linear_fc2",
}
#: mlx-vlm's module for each merger operator kind (under the merger or a DeepStack branch's merger).
_MLX_MERGER = {"norm": "norm", "fc1": "linear_fc1", "fc2": "linear_fc2"}
#: What the emitter's contract widens (``Contract.at``): every dot and every rounding of the state.
_EMITTER_BLOCK = (
    "norm1",
    "attn.qkv",
    "attn.context",
    "attn.out",
    "residual1",
    "norm2",
    "mlp.fc1",
    "mlp.fc2",
)

BLOCK_KINDS = {"mlx": tuple(_MLX_BLOCK), "iree": _EMITTER_BLOCK, "jax": _EMITTER_BLOCK}
#: Tower operators besides the mergers': the patch embedding (and, in the emitter, the positioned sum's rounding).
TOWER_KINDS = {"mlx": ("patch_embed",), "iree": ("patch_embed", "positioned"), "jax": ("patch_embed", "positioned")}
MERGER_KINDS = {"mlx": tuple(_MLX_MERGER), "iree": tuple(_MLX_MERGER), "jax": tuple(_MLX_MERGER)}


def _refuse(stage_id: str) -> ParameterError:
    return ParameterError(
        f"options.f32 names {stage_id!r}, which mlx-vlm's Qwen3-VL port cannot compute in float32 alone",
        f"name a block's {', '.join(_MLX_BLOCK)}, vision.patch_embed, or a merger's "
        f"{', '.join(_MLX_MERGER)} (vision.merger.fc2, vision.deepstack.K.norm, ...)",
    )


def mlx_sites(model: Any, stage_ids: list[str]) -> list[tuple[Any, str | int]]:
    """(owner, attribute) of the mlx-vlm module computing each operator (a stage id, ``attn.qkv`` or ``.fc2``)."""
    tower = model.vision_tower
    sites = []
    for stage_id in stage_ids:
        if stage_id.endswith(".fc2") and not stage_id.startswith("vision.block."):
            block, branch, kind = parse_stage(stage_id[: -len(".fc2")])
            kind = kind.split(".", 1)[0] + ".fc2"
        else:
            block, branch, kind = parse_stage(stage_id)
        if block is not None:
            if kind not in _MLX_BLOCK:
                raise _refuse(stage_id)
            sites.append(attribute_site(tower.blocks[block], _MLX_BLOCK[kind]))
        elif kind == "patch_embed":
            sites.append((tower, "patch_embed"))
        else:
            owner, _, sub = kind.partition(".")
            if sub not in _MLX_MERGER or owner not in ("merger", "deepstack"):
                raise _refuse(stage_id)
            merger = tower.merger if branch is None else tower.deepstack_merger_list[branch]
            sites.append((merger, _MLX_MERGER[sub]))
    return sites


def operators(runtime: str, plan) -> list[str]:
    """The operators ``runtime`` can keep in float32, in the plan's order, as stage-id templates (``{b}``: a block
    index): the plan's block substages (the fused projection once), then the tower's, each merger's as it comes.
    ``plan``: the family's full vision plan."""
    block_kinds, merger_kinds = BLOCK_KINDS.get(runtime, ()), MERGER_KINDS.get(runtime, ())
    tower_kinds = TOWER_KINDS.get(runtime, ())
    found: list[str] = []
    for stage in plan:
        if stage.block == 0 and stage.substage is not None:
            kind = OPERATOR_OF.get(stage.substage, stage.substage)
            template = f"vision.block.{{b}}.{kind}"
            if kind in block_kinds and template not in found:
                found.append(template)
            continue
        if stage.block is not None or not stage.id.startswith("vision."):
            continue
        _, branch, kind = parse_stage(stage.id)
        if kind in tower_kinds:
            found.append(stage.id)
        owner, _, sub = kind.partition(".")
        if owner in ("merger", "deepstack") and sub in merger_kinds:
            found.append(stage.id)
        elif owner in ("merger", "deepstack") and sub == "output" and "fc2" in merger_kinds:
            found.append(f"{stage.id}.fc2")
    return found
