"""Qwen3-VL's stage plan: every stage in execution order (vision, DeepStack branches, text), what each replay
reads; the module table both engines tap (``ModuleTap``); the replay context the replays read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from driftscope.errors import TapFileError
from driftscope.taps.module_taps import ModuleTap, argument, both, output
from driftscope.taps.stages import VIT_ATTENTION_INPUTS, VIT_MLP_INPUTS, Stage, StagePlan, block_stage_id
from driftscope.taps.tapset import TapSet

from ..qwen_shared.plan import (
    TEXT_INPUT,
    decoder_rotary,
    edge_replay_inputs,
    head_stages,
    layer_index,
    prompt_stages,
    text_layers,
    vision_config,
)
from ..qwen_shared.replay import TextReplay
from ..qwen_shared.text import text_taps
from ..qwen_shared.tower import block_taps

# Qwen3-VL's stage plan: vision and text stages in execution order, substages, what each replay reads.
#
# There are no windows: every vision stage keeps the processor's order (2x2 merge blocks one after
# another, each block's 4 patches row-major), the order transformers' blocks run in, declared ``raster``
# as for Qwen2.5-VL's patch embedding. DeepStack merger K runs right after the block it reads
# (``deepstack_visual_indexes[K]``); its output is added to the text hidden states at the image-token
# positions right after decoder layer K: ``text.layer.K.image`` holds those rows before the add,
# ``text.layer.K.deepstack`` after it, so a wrong injection is localized to the layer and the branch.

NAME = "qwen3_vl"

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
SUBSTAGE_INPUTS: dict[str, tuple[str, ...]] = {**VIT_ATTENTION_INPUTS, **VIT_MLP_INPUTS}

#: Substages of a patch merger (the main one and every DeepStack branch); the output is the prefix itself.
MERGER_SUBSTAGES = ("norm", "fc1", "act")


def deepstack_stage_id(branch: int, substage: str | None = None) -> str:
    return f"vision.deepstack.{branch}" if substage is None else f"vision.deepstack.{branch}.{substage}"


def deepstack_indexes(config: dict) -> list[int]:
    """The vision blocks whose outputs feed a DeepStack branch, branch by branch."""
    return [int(i) for i in vision_config(config).get("deepstack_visual_indexes", (8, 16, 24))]


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
    vision = vision_config(config)
    depth, deepstack = int(vision.get("depth", 27)), deepstack_indexes(config)
    raster = {"token_order": "raster", "token_unit": "patch"}
    stages = [
        Stage("inputs.pixel_values", ("patches", "channels"), **raster, description="processor output", data=True),
        Stage("inputs.grid_thw", ("images", "thw"), integer=True, description="processor grid per image", data=True),
        Stage("inputs.image_tokens", ("images",), integer=True, description="merged tokens per image", data=True),
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
        Stage(
            "vision.cu_seqlens",
            ("frames+1",),
            integer=True,
            description="attention bounds, one per image frame",
            data=True,
        ),
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
    meta = {
        "deepstack_visual_indexes": deepstack,
        "spatial_merge_size": int(vision.get("spatial_merge_size", 2)),
        "token_orders": {},  # every stage is in the processor's order
        "landmarks": ["vision.patch_embed", "vision.positioned"]
        + [deepstack_stage_id(k) for k in range(len(deepstack))]
        + ["vision.merger"],
        # what the text side reads of the tower, in the order it reads it: the merged features, then each branch
        "tower_outputs": ["vision.merger"] + [deepstack_stage_id(k) for k in range(len(deepstack))],
        # the prompt's image placeholder, which the text replays read to rebuild the input embeddings
        "image_token_id": int(config.get("image_token_id", 151655)),
        "video_token_id": int(config.get("video_token_id", 151656)),  # a video's slots follow the images'
    }
    return StagePlan(NAME, stages, depth, meta)


def text_stages(config: dict, max_new_tokens: int) -> list[Stage]:
    """Stages after the tower: merged embeddings, M-RoPE positions, each text layer (every position and the last;
    for the first ones also the image slots before and after the DeepStack add), final norm, logits, tokens."""
    text = dict(config.get("text_config") or config)
    layers = int(text.get("num_hidden_layers", 0))
    branches = len(deepstack_indexes(config))
    stages = prompt_stages()
    for i in range(layers):
        before = ", before the DeepStack add" if i < branches else ""
        stages += [
            Stage(
                f"text.layer.{i}", ("tokens", "hidden"), description=f"text layer {i} output, every position{before}"
            ),
            Stage(
                f"text.layer.{i}.last",
                ("hidden",),
                description=f"text layer {i} output, last position (a text slot: no DeepStack add there)",
            ),
        ]
        if i < branches:
            stages += [
                Stage(
                    f"text.layer.{i}.image",
                    ("image_tokens", "hidden"),
                    description=f"text layer {i} output at the image slots, before adding DeepStack branch {i}",
                ),
                Stage(
                    f"text.layer.{i}.deepstack",
                    ("image_tokens", "hidden"),
                    description=f"text layer {i} output at the image slots after adding DeepStack branch {i}",
                ),
            ]
    return stages + head_stages(max_new_tokens, decoder_rotary(config, 5e6))


def text_layer_input(layer: int, branches: int) -> str:
    """What text layer ``layer`` reads: the prompt's embeddings, its predecessor's output, or (after a DeepStack
    add) that output with the image slots after the add (a view the replay context builds)."""
    if layer == 0:
        return TEXT_INPUT
    if layer - 1 < branches:
        return f"text.layer.{layer - 1}.deepstack@sequence"
    return f"text.layer.{layer - 1}"


def text_replay_inputs(stage_id: str, plan: StagePlan) -> tuple[str, ...] | None:
    """What a text stage's replay reads: a layer's stages its input sequence (positions and the causal mask come
    with the replay context), a DeepStack add the layer's image rows and the branch's features."""
    branches = len(plan.meta.get("deepstack_visual_indexes", []))
    if stage_id.startswith("text.layer."):
        layer = layer_index(stage_id)
        if stage_id.endswith(".deepstack"):
            return (f"text.layer.{layer}.image", deepstack_stage_id(layer))
        return (text_layer_input(layer, branches),)
    return edge_replay_inputs(stage_id, text_layers(plan))


def block_input(block: int) -> str:
    return "vision.positioned" if block == 0 else block_stage_id(block - 1)


def parse_stage(stage_id: str) -> tuple[int | None, int | None, str]:
    """``(block, branch, kind)`` of a vision stage: ``vision.block.3.mlp.fc1`` -> (3, None, "mlp.fc1"),
    ``vision.block.3`` -> (3, None, "block"), ``vision.deepstack.1.fc1`` -> (None, 1, "deepstack.fc1"),
    ``vision.merger`` -> (None, None, "merger.output"), ``vision.pos_embed`` -> (None, None, "pos_embed")."""
    parts = stage_id.split(".")
    if parts[1] == "block":
        return int(parts[2]), None, ".".join(parts[3:]) or "block"
    if parts[1] == "deepstack":
        return None, int(parts[2]), "deepstack." + (".".join(parts[3:]) or "output")
    if parts[1] == "merger":
        return None, None, "merger." + (".".join(parts[2:]) or "output")
    return None, None, ".".join(parts[1:])


def replay_inputs(stage_id: str, plan: StagePlan) -> tuple[str, ...] | None:
    """The stages a same-input replay of ``stage_id`` reads (None: not replayable: inputs, the rotary side
    tables and the attention bounds, which every replay takes from the reference's context instead)."""
    if stage_id.startswith("text."):
        return text_replay_inputs(stage_id, plan)
    if not stage_id.startswith("vision."):
        return None
    block, branch, kind = parse_stage(stage_id)
    if block is not None:
        if kind == "block":
            return (block_input(block),)
        return tuple(
            block_input(block) if name == "in" else block_stage_id(block, name) for name in SUBSTAGE_INPUTS[kind]
        )
    if branch is not None:
        indexes = plan.meta.get("deepstack_visual_indexes", [])
        return _merger_input(kind, deepstack_stage_id(branch), block_stage_id(int(indexes[branch])))
    if kind.startswith("merger."):
        return _merger_input(kind, "vision.merger", block_stage_id(plan.depth - 1))
    return {
        "patch_embed": ("inputs.pixel_values",),
        "pos_embed": ("inputs.grid_thw",),
        "positioned": ("vision.patch_embed", "vision.pos_embed"),
    }.get(kind)


def _merger_input(kind: str, prefix: str, source: str) -> tuple[str, ...]:
    sub = kind.split(".", 1)[1]
    chain = {"norm": source, "fc1": f"{prefix}.norm", "act": f"{prefix}.fc1", "output": f"{prefix}.act"}
    return (chain[sub],)


# Qwen3-VL's stages that are a module's output or input, declared for both sides (``taps.module_taps``): paths
# from the tower (transformers' ``model.model.visual``, mlx-vlm's ``vision_tower``: the same names), ``{i}`` each
# block; and the decoder's, with the DeepStack image slots. What no module gives is written by ``torch``
# and ``mlx``: q/k after RoPE (a function), the interpolated position table (the gathered rows times the
# weights a function returned; on MLX a method), the attention bounds (each block's keyword arguments), and on MLX
# the rotary tables (its angles, from a method).


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


# What every replayed Qwen3-VL stage needs besides its inputs: the rotary tables, the attention bounds and
# the grids, all from the reference run (no windows: everything stays in the processor's order); for the text
# stages the prompt's token ids, M-RoPE positions and where its image slots are.

NEEDED = ("vision.rotary.cos", "vision.rotary.sin", "vision.cu_seqlens", "inputs.grid_thw")


@dataclass
class ReplayContext(TextReplay):
    """Side inputs taken from the reference run."""

    cos: np.ndarray  # [patches, head_dim]
    sin: np.ndarray
    cu_seqlens: np.ndarray  # one segment per image frame
    grid_thw: np.ndarray
    input_ids: np.ndarray | None = None  # the prompt (text stages only)
    text_positions: np.ndarray | None = None  # [3, tokens] M-RoPE position ids
    image_token_id: int | None = None

    @property
    def segments(self) -> np.ndarray:
        """The frame id of every patch row (what the compiled attention masks by)."""
        return np.repeat(np.arange(len(self.cu_seqlens) - 1, dtype=np.int32), np.diff(self.cu_seqlens))

    @classmethod
    def from_plan(cls, reference: TapSet, plan: StagePlan) -> ReplayContext:
        missing = [stage for stage in NEEDED if stage not in reference]
        if missing:
            raise TapFileError(
                f"the reference TapSet {reference.tensor_path.name} lacks {missing} needed to replay",
                "capture the side stages (they are in every default stage selection)",
            )
        ctx = cls(
            np.asarray(reference["vision.rotary.cos"], dtype=np.float32),
            np.asarray(reference["vision.rotary.sin"], dtype=np.float32),
            np.asarray(reference["vision.cu_seqlens"]).astype(np.int64),
            np.asarray(reference["inputs.grid_thw"]).astype(np.int64),
        )
        ctx.read_text(reference, plan)
        return ctx

    def stage(self, reference: TapSet, stage_id: str) -> np.ndarray | None:
        """A reference stage as a replay input, or a view: the prompt's embeddings (``text.embeds@sequence``),
        a layer's output with its image slots after the DeepStack add (``text.layer.K.deepstack@sequence``)."""
        if stage_id == TEXT_INPUT:
            return self.text_sequence(reference)
        if stage_id.endswith(".deepstack@sequence"):
            added = stage_id.split("@")[0]
            layer = added.removesuffix(".deepstack")
            if self.input_ids is None or not {added, layer} <= set(reference.stage_ids()):
                return None
            return self.with_image_rows(np.asarray(reference[layer]), np.asarray(reference[added]))
        return np.asarray(reference[stage_id]) if stage_id in reference else None
