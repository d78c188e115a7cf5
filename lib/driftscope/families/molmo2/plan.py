"""Molmo2's stages in execution order (a draft of the family's plan; wiring waits for the family interface).

ViT stages are per crop: [crops, patches, ...] in raster order within each crop. Pooled stages have
one row per pooled token (low-resolution crop first). ``vision.selected.L`` is named by the layer the
config selects, resolved against the declared depth; ``pool.valid_counts`` and the pooling indices
are integers (compared exactly).
"""

from __future__ import annotations

from ...errors import CheckpointError
from ...stages import Stage, StagePlan
from .config import read_facts

FAMILY = "molmo2"

#: Substages of one ViT block, in execution order: (name, axes, meaning).
BLOCK_SUBSTAGES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("norm1", ("crops", "patches", "hidden"), "LayerNorm before attention"),
    ("attn.q", ("crops", "patches", "heads", "head_dim"), "query projection (with bias)"),
    ("attn.k", ("crops", "patches", "heads", "head_dim"), "key projection (with bias)"),
    ("attn.v", ("crops", "patches", "heads", "head_dim"), "value projection (with bias)"),
    ("attn.context", ("crops", "patches", "hidden"), "attention context, heads concatenated"),
    ("attn.out", ("crops", "patches", "hidden"), "attention output projection"),
    ("residual1", ("crops", "patches", "hidden"), "block input + attention output"),
    ("norm2", ("crops", "patches", "hidden"), "LayerNorm before the MLP"),
    ("mlp.fc1", ("crops", "patches", "intermediate"), "fc1"),
    ("mlp.act", ("crops", "patches", "intermediate"), "GELU (tanh approximation) of fc1"),
    ("mlp.fc2", ("crops", "patches", "hidden"), "fc2"),
)


def _vit(stage_id: str, axes: tuple[str, ...], description: str, **kw) -> Stage:
    return Stage(stage_id, axes, "raster", "patch", description=description, **kw)


def _pooled(stage_id: str, axes: tuple[str, ...], description: str, **kw) -> Stage:
    return Stage(stage_id, axes, "raster", "pooled", description=description, **kw)


def stage_plan(config: dict, text: bool = True) -> StagePlan:
    """Every stage of Molmo2 for this checkpoint config (either layout), in execution order."""
    facts = read_facts(config)
    depth = facts.execution_depth
    if len(set(facts.selected_layers)) != len(facts.selected_layers):
        raise CheckpointError(
            f"vit_layers {list(facts.adapter.configured_layers)} select one layer twice "
            f"({list(facts.selected_layers)}); driftscope names the selected stages by layer",
            "list each ViT layer once in adapter_config.vit_layers",
        )
    hidden = ("crops", "patches", "hidden")
    stages = [
        Stage("inputs.pixel_values", ("crops", "patches", "pixels"), "raster", "patch", description="crop pixels"),
        Stage("inputs.pooling", ("tokens", "slots"), integer=True, description="pooling indices, -1 for padding"),
        _vit("vision.patch_embed", hidden, "linear patch embedding of 14x14x3 pixel rows"),
        Stage(
            "vision.pos_embed", ("patches", "hidden"), side=True, description="learned positions (bicubic if resized)"
        ),
        _vit("vision.positioned", hidden, "patch embedding + positions (block 0 input)"),
    ]
    for block in range(depth):
        for name, axes, meaning in BLOCK_SUBSTAGES:
            stages.append(_vit(f"vision.block.{block}.{name}", axes, meaning, block=block, substage=name))
        stages.append(_vit(f"vision.block.{block}", hidden, "block output", block=block))
    for slot, layer in enumerate(facts.selected_layers):
        configured = facts.adapter.configured_layers[slot]
        stages.append(
            _vit(f"vision.selected.{layer}", hidden, f"ViT layer {layer} (configured {configured}), slot {slot}")
        )
    pooled = ("tokens", "slots", "pool_dim")
    stages += [
        _vit("vision.concatenated", ("crops", "patches", "pool_dim"), "selected layers concatenated, configured order"),
        _pooled("pool.gathered", pooled, "patches of each token's window, padding slots zero"),
        _pooled("pool.valid_counts", ("tokens",), "valid patches per token", integer=True),
        _pooled("pool.query", ("tokens", "pool_dim"), "mean of the valid patches"),
        _pooled("pool.output", ("tokens", "hidden"), "attention over the valid patches, output projection"),
        _pooled("projector.gate", ("tokens", "intermediate"), "gate projection"),
        _pooled("projector.act", ("tokens", "intermediate"), "SiLU(gate)"),
        _pooled("projector.up", ("tokens", "intermediate"), "up projection"),
        _pooled("projector.product", ("tokens", "intermediate"), "SiLU(gate) * up"),
        _pooled("projector.output", ("tokens", "text_hidden"), "down projection: the image features"),
    ]
    if text:
        stages.append(_pooled("text.embeds.image", ("tokens", "text_hidden"), "<im_patch> embeddings + features"))
        stages += [
            Stage(f"text.layer.{i}.last", ("hidden",), description=f"text layer {i} output, last position")
            for i in range(facts.text.layers)
        ]
        stages += [
            Stage("text.norm.last", ("hidden",), description="final norm, last position"),
            Stage("text.logits.last", ("vocab",), description="prefill logits, last position"),
        ]
    meta = {
        "layout": facts.layout,
        "declared_depth": facts.vit.declared_depth,
        "configured_layers": list(facts.adapter.configured_layers),
        "selected_layers": list(facts.selected_layers),
        "execution_depth": depth,
    }
    return StagePlan(FAMILY, stages, depth, meta)
