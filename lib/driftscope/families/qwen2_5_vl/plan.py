"""Qwen2.5-VL's stage plan: every stage in execution order, the substages narrowing captures, what each
replay reads; the module table both engines tap (``ModuleTap``); the replay context the replays read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from driftscope.taps.module_taps import ModuleTap, argument, both, output
from driftscope.taps.stages import VIT_ATTENTION_INPUTS, Stage, StagePlan, block_stage_id
from driftscope.taps.tapset import TapSet

from ..base import block_substages
from ..qwen_shared.plan import (
    TEXT_INPUT,
    decoder_rotary,
    edge_replay_inputs,
    head_stages,
    layer_index,
    prompt_stages,
    vision_config,
)
from ..qwen_shared.replay import TextReplay
from ..qwen_shared.tower import block_taps

# Qwen2.5-VL's stage plan: vision and text stages in execution order, substages, what each replay reads.

NAME = "qwen2_5_vl"

#: Substages of one vision block, in execution order: (name, axes).
BLOCK_SUBSTAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("norm1", ("tokens", "hidden")),
    ("attn.q", ("tokens", "heads", "head_dim")),
    ("attn.k", ("tokens", "heads", "head_dim")),
    ("attn.v", ("tokens", "heads", "head_dim")),
    ("attn.context", ("tokens", "hidden")),
    ("attn.out", ("tokens", "hidden")),
    ("residual1", ("tokens", "hidden")),
    ("norm2", ("tokens", "hidden")),
    ("mlp.gate", ("tokens", "intermediate")),
    ("mlp.act", ("tokens", "intermediate")),
    ("mlp.up", ("tokens", "intermediate")),
    ("mlp.product", ("tokens", "intermediate")),
    ("mlp.down", ("tokens", "hidden")),
)

SUBSTAGE_MEANING = {
    "norm1": "RMSNorm before attention",
    "attn.q": "query after RoPE",
    "attn.k": "key after RoPE",
    "attn.v": "value",
    "attn.context": "attention context, heads concatenated, before the output projection",
    "attn.out": "attention output projection",
    "residual1": "block input + attention output",
    "norm2": "RMSNorm before the MLP",
    "mlp.gate": "gate projection",
    "mlp.act": "SiLU(gate)",
    "mlp.up": "up projection",
    "mlp.product": "SiLU(gate) * up",
    "mlp.down": "down projection",
}


def check_config(config: dict) -> None:
    """Refuse a text ``mrope_section`` that does not split the rotary half of a head (transformers and every port
    split the head_dim / 2 frequencies into t, h, w chunks of these sizes, after the whole tower ran)."""
    text = dict(config.get("text_config") or config)
    prefix = "text_config." if config.get("text_config") else ""
    places = [(text, prefix + key) for key in ("rope_parameters", "rope_scaling")]
    places += [(config, key) for key in ("rope_parameters", "rope_scaling")]
    found = [(owner[key.split(".")[-1]], key) for owner, key in places if owner.get(key.split(".")[-1])]
    rope, where = found[0] if found else ({}, "")
    if "mrope_section" not in rope or "hidden_size" not in text or "num_attention_heads" not in text:
        return
    sections = [int(s) for s in rope["mrope_section"]]
    half = int(text["hidden_size"]) // int(text["num_attention_heads"]) // 2
    if sum(sections) != half or len(sections) != 3 or min(sections) < 0:
        from driftscope.errors import CheckpointError

        raise CheckpointError(
            f"{where}.mrope_section {sections} sums to {sum(sections)}, but the text head_dim "
            f"{2 * half} (hidden_size {text['hidden_size']} / {text['num_attention_heads']} heads) has {half} "
            "rotary frequencies to split into the t, h, w sections",
            f"set mrope_section to three sizes summing to {half} (Qwen2.5-VL-3B's head_dim 128 uses [16, 24, 24])",
        )


def vision_plan(config: dict) -> StagePlan:
    """Every stage of the Qwen2.5-VL vision tower for this checkpoint config, in execution order."""
    vision = vision_config(config)
    depth = int(vision.get("depth", 32))
    full = sorted(int(i) for i in vision.get("fullatt_block_indexes", []))
    stages = [
        Stage(
            "inputs.pixel_values", ("patches", "channels"), "raster", "patch", description="processor output", data=True
        ),
        Stage("inputs.grid_thw", ("images", "thw"), integer=True, description="processor grid per image", data=True),
        Stage("inputs.image_tokens", ("images",), integer=True, description="merged tokens per image", data=True),
        Stage("vision.patch_embed", ("tokens", "hidden"), "raster", "patch", description="Conv3d patch embedding"),
        Stage("vision.rotary.cos", ("tokens", "head_dim"), "raster", "patch", side=True, description="RoPE cos table"),
        Stage("vision.rotary.sin", ("tokens", "head_dim"), "raster", "patch", side=True, description="RoPE sin table"),
        Stage("vision.window_index", ("merged_tokens",), integer=True, description="window permutation", data=True),
        Stage(
            "vision.cu_window_seqlens",
            ("windows+1",),
            integer=True,
            description="window attention bounds (empty windows dropped)",
            data=True,
        ),
        Stage("vision.cu_seqlens", ("images+1",), integer=True, description="full attention bounds", data=True),
    ]
    for block in range(depth):
        kind = "full" if block in full else "window"
        for name, axes in BLOCK_SUBSTAGES:
            stages.append(
                Stage(
                    block_stage_id(block, name),
                    axes,
                    "window",
                    "patch",
                    block=block,
                    substage=name,
                    description=f"{SUBSTAGE_MEANING[name]} ({kind} attention block)",
                )
            )
        stages.append(
            Stage(
                block_stage_id(block),
                ("tokens", "hidden"),
                "window",
                "patch",
                block=block,
                description=f"block output ({kind} attention)",
            )
        )
    stages += [
        Stage("vision.merger.norm", ("tokens", "hidden"), "window", "patch", description="merger RMSNorm"),
        Stage("vision.merger.hidden", ("merged_tokens", "merged_hidden"), "window", "merged", description="GELU(fc1)"),
        Stage("vision.merger.window", ("merged_tokens", "out_hidden"), "window", "merged", description="merger output"),
        Stage("vision.merger", ("merged_tokens", "out_hidden"), "raster", "merged", description="restored to raster"),
    ]
    merge = int(vision.get("spatial_merge_size", 2))
    meta = {
        "fullatt_block_indexes": full,
        "spatial_merge_size": merge,
        # window-ordered stages go back to raster order through each side's own window index
        "token_orders": {
            "window": {
                "index": "vision.window_index",
                "rows_per_index": {"patch": merge**2, "merged": 1},
                "segments": "vision.cu_window_seqlens",  # a window's tokens: its bounds, in patch rows
                "segment_unit": "patch",
            }
        },
        "landmarks": ["vision.patch_embed", "vision.merger"],
        # the prompt's image placeholder, which the text replays read to rebuild the input embeddings
        "image_token_id": int(config.get("image_token_id", 151655)),
        "video_token_id": int(config.get("video_token_id", 151656)),  # a video's slots follow the images'
    }
    return StagePlan(NAME, stages, depth, meta)


#: Block input of block 0: the patch embedding in window order (a view of the reference's tap, ``stage@view``).
BLOCK0_INPUT = "vision.patch_embed@window"

#: What each substage reads, by substage name; "in" is the block's input.
SUBSTAGE_INPUTS: dict[str, tuple[str, ...]] = {
    **VIT_ATTENTION_INPUTS,
    "mlp.gate": ("norm2",),
    "mlp.act": ("mlp.gate",),
    "mlp.up": ("norm2",),
    "mlp.product": ("mlp.act", "mlp.up"),
    "mlp.down": ("mlp.product",),
}


def block_input(block: int) -> str:
    return BLOCK0_INPUT if block == 0 else block_stage_id(block - 1)


def parse_stage(stage_id: str) -> tuple[int | None, str]:
    """``vision.block.3.mlp.up`` -> (3, "mlp.up"); ``vision.block.3`` -> (3, "block"); merger -> (None, name)."""
    parts = stage_id.split(".")
    if stage_id.startswith("vision.block."):
        return int(parts[2]), ".".join(parts[3:]) or "block"
    return None, ".".join(parts[1:])


def replay_inputs(stage_id: str, depth: int, text_layers: int = 0) -> tuple[str, ...] | None:
    """The stages a replay of ``stage_id`` reads (None: not replayable, e.g. index math); ``text_layers``: the
    decoder's depth, when the plan follows the prompt past the tower."""
    parts = stage_id.split(".")
    if stage_id.startswith("vision.block."):
        block = int(parts[2])
        if len(parts) == 3:
            return (block_input(block),)
        substage = ".".join(parts[3:])
        return tuple(
            block_input(block) if name == "in" else block_stage_id(block, name) for name in SUBSTAGE_INPUTS[substage]
        )
    if stage_id.startswith("text."):
        return text_replay_inputs(stage_id, text_layers)
    last = block_stage_id(depth - 1)
    return {
        "vision.patch_embed": ("inputs.pixel_values",),
        "vision.rotary.cos": ("inputs.grid_thw",),
        "vision.rotary.sin": ("inputs.grid_thw",),
        "vision.merger.norm": (last,),
        "vision.merger.hidden": ("vision.merger.norm",),
        "vision.merger.window": ("vision.merger.hidden",),
        "vision.merger": ("vision.merger.window",),  # the window order undone with the window index
    }.get(stage_id)


def text_layer_input(layer: int) -> str:
    return TEXT_INPUT if layer == 0 else f"text.layer.{layer - 1}"


def text_replay_inputs(stage_id: str, layers: int) -> tuple[str, ...] | None:
    """What a text stage's replay reads: each layer its predecessor's whole sequence (position ids and the causal
    mask come with the replay context); the final norm and the logits the last position (both act per position)."""
    if stage_id.startswith("text.layer."):
        return (text_layer_input(layer_index(stage_id)),)
    return edge_replay_inputs(stage_id, layers)


def text_stages(config: dict, max_new_tokens: int) -> list[Stage]:
    """Stages after the tower: merged embeddings, M-RoPE positions, each text layer, logits, greedy tokens."""
    text = dict(config.get("text_config") or config)
    layers = int(text.get("num_hidden_layers", 0))
    stages = prompt_stages()
    for i in range(layers):
        stages += [
            Stage(f"text.layer.{i}", ("tokens", "hidden"), description=f"text layer {i} output, every position"),
            Stage(f"text.layer.{i}.last", ("hidden",), description=f"text layer {i} output, last position"),
        ]
    return stages + head_stages(max_new_tokens, decoder_rotary(config, 1e6))


#: The merger's pieces, in execution order: what narrowing captures when the merger's output diverges first.
MERGER_PIECES = ("vision.merger.norm", "vision.merger.hidden", "vision.merger.window")


def substages_of(stage_id: str, plan: StagePlan) -> tuple[str, ...]:
    """A block output's substages (the default), and the merger's pieces for the merger's output."""
    if stage_id == "vision.merger":
        return tuple(piece for piece in MERGER_PIECES if piece in plan)
    return block_substages(stage_id, plan)


# Qwen2.5-VL's stages that are a module's output or input, declared for both sides (``taps.module_taps``): paths
# from the tower (transformers' ``model.model.visual``, mlx-vlm's ``vision_tower``: the same names), ``{i}`` each
# block. What no module gives is written by ``torch`` and ``mlx``: q/k after RoPE (a function), the
# window index and the attention bounds (a function and each block's keyword arguments), the merged features (the
# tower's result), and on MLX the rotary tables (its angles, from a method) and the SiLU (a function its MLP calls).

#: each block's MLP stages on its modules (``{i}``: the block); on MLX the activation is ``nn.silu``, a function
MLP = (
    both("vision.block.{i}.mlp.gate", output("blocks.{i}.mlp.gate_proj")),
    ModuleTap("vision.block.{i}.mlp.act", torch=output("blocks.{i}.mlp.act_fn")),
    both("vision.block.{i}.mlp.up", output("blocks.{i}.mlp.up_proj")),
    both("vision.block.{i}.mlp.product", argument("blocks.{i}.mlp.down_proj")),
    both("vision.block.{i}.mlp.down", output("blocks.{i}.mlp.down_proj")),
)


def tower_taps(tower: Any) -> list[ModuleTap]:
    """Every stage of the tower that a module's output or input holds, for ``tower``'s depth and heads."""
    return [
        *block_taps(tower, MLP),
        both("vision.merger.norm", output("merger.ln_q")),
        both("vision.merger.hidden", output("merger.mlp.1")),
        both("vision.merger.window", output("merger")),
    ]


# What every replayed Qwen2.5-VL stage needs besides its inputs: rotary tables, attention bounds, window order;
# for the text stages the prompt's token ids, M-RoPE positions and where its image slots are.


@dataclass
class ReplayContext(TextReplay):
    """Side inputs taken from the reference run, in window order where the blocks need them."""

    cos: np.ndarray  # [patches, head_dim], window order
    sin: np.ndarray
    cu_seqlens: np.ndarray
    cu_window_seqlens: np.ndarray
    window_index: np.ndarray  # merged-token permutation
    full_blocks: frozenset[int]
    merge_unit: int
    input_ids: np.ndarray | None = None  # the prompt (text stages only)
    text_positions: np.ndarray | None = None  # [3, tokens] M-RoPE position ids
    image_token_id: int | None = None

    def bounds(self, block: int) -> np.ndarray:
        return self.cu_seqlens if block in self.full_blocks else self.cu_window_seqlens

    def to_window(self, raster: np.ndarray) -> np.ndarray:
        """Patch rows from raster (processor) order to window order."""
        grouped = raster.reshape(len(self.window_index), self.merge_unit, *raster.shape[1:])
        return grouped[self.window_index].reshape(raster.shape)

    @classmethod
    def from_tapset(cls, reference: TapSet, full_blocks, merge_unit: int = 4) -> ReplayContext:
        needed = [
            "vision.rotary.cos",
            "vision.rotary.sin",
            "vision.cu_seqlens",
            "vision.cu_window_seqlens",
            "vision.window_index",
        ]
        missing = [stage for stage in needed if stage not in reference]
        if missing:
            from driftscope.errors import TapFileError

            raise TapFileError(
                f"the reference TapSet {reference.tensor_path.name} lacks {missing} needed to replay",
                "capture the side stages (they are in every default stage selection)",
            )
        window_index = np.asarray(reference["vision.window_index"]).astype(np.int64)
        ctx = cls(
            np.zeros(0),
            np.zeros(0),
            np.asarray(reference["vision.cu_seqlens"]).astype(np.int64),
            np.asarray(reference["vision.cu_window_seqlens"]).astype(np.int64),
            window_index,
            frozenset(int(b) for b in full_blocks),
            merge_unit,
        )
        ctx.cos = ctx.to_window(np.asarray(reference["vision.rotary.cos"], dtype=np.float32))
        ctx.sin = ctx.to_window(np.asarray(reference["vision.rotary.sin"], dtype=np.float32))
        return ctx

    @classmethod
    def from_plan(cls, reference: TapSet, plan: StagePlan) -> ReplayContext:
        ctx = cls.from_tapset(
            reference, plan.meta.get("fullatt_block_indexes", []), int(plan.meta.get("spatial_merge_size", 2)) ** 2
        )
        ctx.read_text(reference, plan)
        return ctx

    def stage(self, reference: TapSet, stage_id: str) -> np.ndarray | None:
        """A reference stage as a replay input (the block-0 input is the patch embedding in window order)."""
        if stage_id == BLOCK0_INPUT:
            if "vision.patch_embed" not in reference:
                return None
            return self.to_window(np.asarray(reference["vision.patch_embed"]))
        if stage_id == TEXT_INPUT:
            return self.text_sequence(reference)
        return np.asarray(reference[stage_id]) if stage_id in reference else None
