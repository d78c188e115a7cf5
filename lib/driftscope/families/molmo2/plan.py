"""Molmo2's stage plan: vision, pooling, projector and text stages in execution order, what each replay reads.

ViT stages are per crop, ``[crops, patches, ...]`` (raster order within each crop, the low-resolution crop
first; ``plan.meta["row_axes"]`` says the two leading axes together index patch rows). Pooled stages have one
row per pooled token (token unit ``merged``: a 2 x 2 window of patches). ``vision.selected.L`` is named by the
layer the config selects, resolved against the DECLARED depth; the pooling indices, valid counts and the
decoder's attention mask are integers (compared exactly).
"""

from __future__ import annotations

from driftscope.taps.sink import decode_stages
from driftscope.taps.stages import VIT_ATTENTION_INPUTS, VIT_MLP_INPUTS, Rotary, Stage, StagePlan, block_stage_id

from ...errors import CheckpointError
from .config import read_facts

NAME = "molmo2"

#: Substages of one ViT block, in execution order: (name, axes, meaning).
BLOCK_SUBSTAGES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("norm1", ("crops", "patches", "hidden"), "LayerNorm before attention"),
    ("attn.q", ("crops", "patches", "heads", "head_dim"), "query projection (with bias)"),
    ("attn.k", ("crops", "patches", "heads", "head_dim"), "key projection (with bias)"),
    ("attn.v", ("crops", "patches", "heads", "head_dim"), "value projection (with bias)"),
    ("attn.context", ("crops", "patches", "hidden"), "attention context over the crop, heads concatenated"),
    ("attn.out", ("crops", "patches", "hidden"), "attention output projection"),
    ("residual1", ("crops", "patches", "hidden"), "block input + attention output"),
    ("norm2", ("crops", "patches", "hidden"), "LayerNorm before the MLP"),
    ("mlp.fc1", ("crops", "patches", "mlp"), "fc1"),
    ("mlp.act", ("crops", "patches", "mlp"), "GELU (tanh approximation) of fc1"),
    ("mlp.fc2", ("crops", "patches", "hidden"), "fc2"),
)

#: What each substage reads, by substage name; "in" is the block's input.
SUBSTAGE_INPUTS: dict[str, tuple[str, ...]] = {**VIT_ATTENTION_INPUTS, **VIT_MLP_INPUTS}

#: The pooler and projector: (stage, axes, meaning, what a replay reads). Rows are pooled tokens.
HEAD: tuple[tuple[str, tuple[str, ...], str, tuple[str, ...] | None], ...] = (
    ("pool.gathered", ("tokens", "slots", "pool_dim"), "each token's patches by index, padding slots zero",
     ("vision.concatenated",)),
    ("pool.valid_counts", ("tokens",), "valid patches per token (the query's denominator)", None),
    ("pool.query", ("tokens", "pool_dim"), "mean of the valid patches", ("pool.gathered",)),
    ("pool.output", ("tokens", "adapter_hidden"), "attention over the valid patches, output projection",
     ("pool.query", "pool.gathered")),
    ("projector.gate", ("tokens", "projector_hidden"), "gate projection", ("pool.output",)),
    ("projector.act", ("tokens", "projector_hidden"), "SiLU(gate)", ("projector.gate",)),
    ("projector.up", ("tokens", "projector_hidden"), "up projection", ("pool.output",)),
    ("projector.product", ("tokens", "projector_hidden"), "SiLU(gate) * up", ("projector.act", "projector.up")),
    ("projector.output", ("tokens", "text_hidden"), "down projection: the image features", ("projector.product",)),
)  # fmt: skip

FINAL = "projector.output"


def block_input(block: int) -> str:
    return "vision.positioned" if block == 0 else block_stage_id(block - 1)


def parse_stage(stage_id: str) -> tuple[int | None, str]:
    """``vision.block.3.mlp.fc1`` -> (3, "mlp.fc1"); ``vision.block.3`` -> (3, "block"); others -> (None, id)."""
    parts = stage_id.split(".")
    if stage_id.startswith("vision.block."):
        return int(parts[2]), ".".join(parts[3:]) or "block"
    return None, stage_id


def _vit(stage_id: str, axes: tuple[str, ...], description: str, **kw) -> Stage:
    return Stage(stage_id, axes, "raster", "patch", description=description, **kw)


def vision_plan(config: dict) -> StagePlan:
    """Every image-side stage of Molmo2 for this checkpoint config (either layout), in execution order."""
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
        _vit("inputs.pixel_values", ("crops", "patches", "pixels"), "crop pixels, 14x14x3 per patch row", data=True),
        Stage(
            "inputs.pooling",
            ("tokens", "slots"),
            integer=True,
            description="pooling indices, -1 for padding",
            data=True,
        ),
        Stage("inputs.grids", ("images", "grid"), integer=True, description="low/high-res token rows, cols", data=True),
        Stage("inputs.num_crops", ("images",), integer=True, description="crops per image", data=True),
        Stage("inputs.image_tokens", ("images",), integer=True, description="pooled tokens per image", data=True),
        _vit("vision.patch_embed", hidden, "linear patch embedding of 14x14x3 pixel rows"),
        Stage("vision.pos_embed", ("positions", "hidden"), side=True, description="learned positions of one crop"),
        _vit("vision.positioned", hidden, "patch embedding + positions (block 0 input)"),
    ]
    for block in range(depth):
        for name, axes, meaning in BLOCK_SUBSTAGES:
            stages.append(_vit(block_stage_id(block, name), axes, meaning, block=block, substage=name))
        stages.append(_vit(block_stage_id(block), hidden, "block output", block=block))
    for slot, layer in enumerate(facts.selected_layers):
        configured = facts.adapter.configured_layers[slot]
        stages.append(
            _vit(f"vision.selected.{layer}", hidden, f"ViT layer {layer} (configured {configured}), slot {slot}")
        )
    stages.append(
        _vit("vision.concatenated", ("crops", "patches", "pool_dim"), "selected layers concatenated, configured order")
    )
    for stage_id, axes, meaning, _ in HEAD:
        counts = stage_id == "pool.valid_counts"  # index math: how many pooling slots are real
        stages.append(Stage(stage_id, axes, "raster", "merged", integer=counts, description=meaning, data=counts))
    meta = {
        "layout": facts.layout,
        "declared_depth": facts.vit.declared_depth,
        "configured_layers": list(facts.adapter.configured_layers),
        "selected_layers": list(facts.selected_layers),
        "execution_depth": depth,
        "row_axes": ["crops", "patches"],  # leading axes that together index a stage's token rows
        "token_orders": {},
        "landmarks": ["vision.patch_embed", "vision.concatenated", FINAL],
        # the prompt's <im_patch> token, which the text replays read to rebuild the input embeddings
        "image_token_id": facts.image_patch_id,
    }
    return StagePlan(NAME, stages, depth, meta)


#: The whole prompt's input embeddings (``<im_patch>`` slots from ``text.embeds.image``, the rest from
#: ``text.embeds.text``), a view the replay context builds: what text layer 0 reads.
TEXT_INPUT = "text.embeds@sequence"


def text_layer_input(layer: int) -> str:
    return TEXT_INPUT if layer == 0 else f"text.layer.{layer - 1}"


def text_layers(plan: StagePlan) -> int:
    """How many decoder layers the plan follows (0 without the text stages)."""
    return sum(1 for stage in plan if stage.id.startswith("text.layer.") and stage.id.endswith(".last"))


def text_replay_inputs(stage_id: str, plan: StagePlan) -> tuple[str, ...] | None:
    """What a text stage's replay reads: a layer its predecessor's whole sequence and the decoder's mask (the
    positions are the sequence's indices); the final norm and the logits the last position."""
    parts = stage_id.split(".")
    if parts[1] == "layer":
        return (text_layer_input(int(parts[2])), "text.attention_mask")
    layers = text_layers(plan)
    return {
        "text.attention_mask": ("text.input_ids", "text.token_types"),
        "text.embeds.image": (FINAL,),
        "text.embeds.text": ("text.input_ids",),
        "text.norm.last": (f"text.layer.{layers - 1}.last",) if layers else None,
        "text.logits.last": ("text.norm.last",),
    }.get(stage_id)


def replay_inputs(stage_id: str, plan: StagePlan) -> tuple[str, ...] | None:
    """The stages a replay of ``stage_id`` reads (None: not replayable, e.g. index data and decoding)."""
    if stage_id.startswith("text."):
        return text_replay_inputs(stage_id, plan)
    block, kind = parse_stage(stage_id)
    if block is not None:
        if kind == "block":
            return (block_input(block),)
        return tuple(block_input(block) if n == "in" else block_stage_id(block, n) for n in SUBSTAGE_INPUTS[kind])
    selected = [int(layer) for layer in plan.meta.get("selected_layers", [])]
    if stage_id.startswith("vision.selected."):  # the runtime picks which block outputs it concatenates
        return tuple(block_stage_id(b) for b in range(plan.depth))
    head = {name: reads for name, _, _, reads in HEAD}
    return {
        "vision.patch_embed": ("inputs.pixel_values",),
        "vision.positioned": ("vision.patch_embed",),
        "vision.concatenated": tuple(f"vision.selected.{layer}" for layer in selected),
        **head,
    }.get(stage_id)


def text_stages(config: dict, max_new_tokens: int) -> list[Stage]:
    """After the projector: the prompt, the merged embeddings, the decoder's mask, each layer, logits, tokens."""
    facts = read_facts(config).text
    layers = facts.layers
    stages = [
        Stage("text.input_ids", ("tokens",), integer=True, description="prompt token ids", data=True),
        Stage(
            "text.token_types",
            ("tokens",),
            integer=True,
            description="1 for image tokens (mm_token_type_ids)",
            data=True,
        ),
        Stage("text.embeds.image", ("image_tokens", "text_hidden"), description="<im_patch> embeddings + features"),
        Stage("text.embeds.text", ("text_tokens", "text_hidden"), description="embeddings at the other slots"),
        Stage(
            "text.attention_mask",
            ("tokens", "tokens"),
            integer=True,
            description="1 where a prefill query row may read a key column (image tokens both ways)",
        ),
    ]
    for i in range(layers):
        stages += [
            Stage(f"text.layer.{i}", ("tokens", "text_hidden"), description=f"text layer {i} output, every position"),
            Stage(f"text.layer.{i}.last", ("text_hidden",), description=f"text layer {i} output, last position"),
        ]
    stages += [
        Stage("text.norm.last", ("text_hidden",), description="final norm, last position"),
        Stage("text.logits.last", ("vocab",), description="prefill logits, last position"),
        *decode_stages(max_new_tokens, decoder_rotary(facts)),
    ]
    return stages


def decoder_rotary(text) -> Rotary | None:
    """How the decoder rotates its keys (``rotate_half`` over the whole head, a position its index); None for a
    scaled RoPE, whose frequencies are not ``theta ** (-2i / d)`` (the contract alone judges it)."""
    return Rotary.default(text.rope_theta, text.head_dim) if text.rope_type == "default" else None
