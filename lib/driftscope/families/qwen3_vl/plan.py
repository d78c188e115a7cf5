"""Qwen3-VL: the stage plan in execution order (draft, until the Family interface settles).

There are no windows: every vision stage keeps the processor's order (2x2 merge blocks one after
another, each block's 4 patches row-major), the order transformers' blocks run in, declared
``raster`` as for Qwen2.5-VL's patch embedding. DeepStack merger K runs right after the block it
reads (``deepstack_visual_indexes[K]``); its output is added to the text hidden states right after
decoder layer K.
"""

from __future__ import annotations

from ...stages import Stage, StagePlan

FAMILY = "qwen3_vl"

#: Substages of one vision block, in execution order: (name, axes, meaning).
BLOCK_SUBSTAGES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("norm1", ("tokens", "hidden"), "LayerNorm before attention"),
    ("attn.q", ("tokens", "heads", "head_dim"), "query after RoPE"),
    ("attn.k", ("tokens", "heads", "head_dim"), "key after RoPE"),
    ("attn.v", ("tokens", "heads", "head_dim"), "value"),
    ("attn.context", ("tokens", "hidden"), "attention context (per image), heads concatenated"),
    ("attn.out", ("tokens", "hidden"), "attention output projection"),
    ("residual1", ("tokens", "hidden"), "block input + attention output"),
    ("norm2", ("tokens", "hidden"), "LayerNorm before the MLP"),
    ("mlp.fc1", ("tokens", "intermediate"), "MLP linear_fc1"),
    ("mlp.act", ("tokens", "intermediate"), "GELU (tanh approximation) of fc1"),
    ("mlp.fc2", ("tokens", "hidden"), "MLP linear_fc2"),
)

#: What each block substage reads; "in" is the block's input.
SUBSTAGE_INPUTS: dict[str, tuple[str, ...]] = {
    "norm1": ("in",),
    "attn.q": ("norm1",),
    "attn.k": ("norm1",),
    "attn.v": ("norm1",),
    "attn.context": ("attn.q", "attn.k", "attn.v"),
    "attn.out": ("attn.context",),
    "residual1": ("in", "attn.out"),
    "norm2": ("residual1",),
    "mlp.fc1": ("norm2",),
    "mlp.act": ("mlp.fc1",),
    "mlp.fc2": ("mlp.act",),
}


def block_stage_id(block: int, substage: str | None = None) -> str:
    return f"vision.block.{block}" if substage is None else f"vision.block.{block}.{substage}"


def deepstack_stage_id(branch: int, substage: str | None = None) -> str:
    return f"vision.deepstack.{branch}" if substage is None else f"vision.deepstack.{branch}.{substage}"


def _vision(config: dict) -> tuple[int, list[int]]:
    vision = dict(config.get("vision_config") or {})
    return int(vision.get("depth", 27)), [int(i) for i in vision.get("deepstack_visual_indexes", (8, 16, 24))]


def _merger_stages(stage: str, what: str, postshuffle: bool) -> list[Stage]:
    norm_axes, norm_unit = (
        (("merged_tokens", "merged_hidden"), "merged") if postshuffle else (("tokens", "hidden"), "patch")
    )
    norm_meaning = "LayerNorm over 4x hidden after the 2x2 regroup" if postshuffle else "LayerNorm over hidden"
    merged = ("merged_tokens", "merged_hidden")
    return [
        Stage(f"{stage}.norm", norm_axes, "raster", norm_unit, description=f"{what}: {norm_meaning}"),
        Stage(f"{stage}.fc1", merged, "raster", "merged", description=f"{what}: linear_fc1 of the 2x2 regroup"),
        Stage(f"{stage}.act", merged, "raster", "merged", description=f"{what}: exact (erf) GELU of fc1"),
        Stage(stage, ("merged_tokens", "out_hidden"), "raster", "merged", description=f"{what}: output (linear_fc2)"),
    ]


def vision_plan(config: dict) -> StagePlan:
    """Every stage of the Qwen3-VL vision tower for this checkpoint config, in execution order."""
    depth, deepstack = _vision(config)
    raster = {"token_order": "raster", "token_unit": "patch"}
    stages = [
        Stage("inputs.pixel_values", ("patches", "channels"), **raster, description="processor output"),
        Stage("inputs.grid_thw", ("images", "thw"), integer=True, description="processor grid per image"),
        Stage("inputs.image_tokens", ("images",), integer=True, description="merged tokens per image"),
        Stage("vision.patch_embed", ("tokens", "hidden"), **raster, description="Conv3d patch embedding (with bias)"),
        Stage(
            "vision.pos_embed",
            ("tokens", "hidden"),
            **raster,
            description="learned position table, bilinearly interpolated (align_corners) to the grid",
        ),
        Stage("vision.positioned", ("tokens", "hidden"), **raster, description="patch embedding + position table"),
        Stage("vision.rotary.cos", ("tokens", "head_dim"), **raster, side=True, description="2D RoPE cos table"),
        Stage("vision.rotary.sin", ("tokens", "head_dim"), **raster, side=True, description="2D RoPE sin table"),
        Stage("vision.cu_seqlens", ("frames+1",), integer=True, description="attention bounds, one per image frame"),
    ]
    for block in range(depth):
        for name, axes, meaning in BLOCK_SUBSTAGES:
            stages.append(
                Stage(block_stage_id(block, name), axes, **raster, block=block, substage=name, description=meaning)
            )
        stages.append(
            Stage(block_stage_id(block), ("tokens", "hidden"), **raster, block=block, description="block output")
        )
        if block in deepstack:
            branch = deepstack.index(block)
            stages += _merger_stages(deepstack_stage_id(branch), f"DeepStack branch {branch} (block {block})", True)
    stages += _merger_stages("vision.merger", "main merger", False)
    merge = int(dict(config.get("vision_config") or {}).get("spatial_merge_size", 2))
    meta = {"deepstack_visual_indexes": deepstack, "spatial_merge_size": merge, "windows": False}
    return StagePlan(FAMILY, stages, depth, meta)


def text_stages(config: dict, max_new_tokens: int) -> list[Stage]:
    """Stages after the tower: merged embeddings, M-RoPE positions, each text layer (and the DeepStack
    adds after the first ones), final norm, logits, greedy tokens."""
    text = dict(config.get("text_config") or config)
    layers = int(text.get("num_hidden_layers", 0))
    branches = len(_vision(config)[1])
    stages = [
        Stage("text.input_ids", ("tokens",), integer=True, description="prompt token ids"),
        Stage("text.position_ids", ("3", "tokens"), integer=True, description="M-RoPE position ids (t, h, w)"),
        Stage("text.rope_deltas", ("batch",), integer=True, description="M-RoPE delta for generated positions"),
        Stage("text.embeds.image", ("image_tokens", "hidden"), description="merged input embeddings at image slots"),
        Stage("text.embeds.text", ("text_tokens", "hidden"), description="input embeddings at text slots"),
        Stage(
            "text.embeds.text_slots_changed",
            ("count",),
            integer=True,
            description="text slots whose embedding differs from the token's own row (must be 0)",
        ),
    ]
    for i in range(layers):
        stages.append(
            Stage(
                f"text.layer.{i}.last",
                ("hidden",),
                description=f"text layer {i} output, last position (before any DeepStack add)",
            )
        )
        if i < branches:
            stages.append(
                Stage(
                    f"text.layer.{i}.deepstack",
                    ("image_tokens", "hidden"),
                    description=f"text layer {i} output at the image slots after adding DeepStack branch {i}",
                )
            )
    stages += [
        Stage("text.norm.last", ("hidden",), description="final norm, last position"),
        Stage("text.logits.last", ("vocab",), description="prefill logits, last position"),
        Stage("text.generate.tokens", ("steps",), integer=True, description=f"greedy tokens ({max_new_tokens})"),
        Stage("text.generate.margins", ("steps",), side=True, description="top-1 minus top-2 logit at each step"),
    ]
    return stages


def block_input(block: int) -> str:
    return "vision.positioned" if block == 0 else block_stage_id(block - 1)


def replay_inputs(stage_id: str, config: dict) -> tuple[str, ...] | None:
    """The stages a same-input replay of ``stage_id`` reads (None: not replayable, e.g. index math)."""
    depth, deepstack = _vision(config)
    parts = stage_id.split(".")
    if stage_id.startswith("vision.block."):
        block = int(parts[2])
        if len(parts) == 3:
            return (block_input(block),)
        names = SUBSTAGE_INPUTS[".".join(parts[3:])]
        return tuple(block_input(block) if name == "in" else block_stage_id(block, name) for name in names)
    if stage_id.startswith("vision.deepstack."):
        branch, prefix = int(parts[2]), deepstack_stage_id(int(parts[2]))
        return _merger_inputs(stage_id, prefix, block_stage_id(deepstack[branch]))
    if stage_id.startswith("vision.merger"):
        return _merger_inputs(stage_id, "vision.merger", block_stage_id(depth - 1))
    return {"vision.positioned": ("vision.patch_embed", "vision.pos_embed")}.get(stage_id)


def _merger_inputs(stage_id: str, prefix: str, source: str) -> tuple[str, ...]:
    chain = {
        f"{prefix}.norm": source,
        f"{prefix}.fc1": f"{prefix}.norm",
        f"{prefix}.act": f"{prefix}.fc1",
        prefix: f"{prefix}.act",
    }
    return (chain[stage_id],)
