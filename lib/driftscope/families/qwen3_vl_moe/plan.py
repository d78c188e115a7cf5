"""Qwen3-VL-MoE's stage plan: Qwen3-VL's, with each sparse decoder layer's mixture-of-experts stages (router,
chosen experts, their weights and outputs); the module table both engines tap for them."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from driftscope.taps.module_taps import ModuleTap, argument, both, output
from driftscope.taps.stages import Stage, StagePlan

from ..qwen3_vl import plan as dense

# Qwen3-VL-MoE's stage plan: Qwen3-VL's tower and DeepStack stages unchanged, and in every sparse decoder
# layer the mixture-of-experts MLP taken apart.
#
# A sparse layer ``N`` adds, before its output ``text.layer.N``: the residual after attention
# (``.residual1``), the post-attention RMSNorm the router and the experts read (``.mlp.in``), the router's
# logits (``.mlp.router``), the experts it chose per token (``.mlp.chosen``, ascending expert id: an exact
# data stage, so a token routed differently is a finding of its own), their renormalized weights
# (``.mlp.weights``, same order), each chosen expert's own output before weighting (``.mlp.experts``) and the
# block's weighted sum (``.mlp``).

NAME = "qwen3_vl_moe"

#: The pieces of a sparse layer's MLP, in execution order: (suffix, axes, meaning, integer-and-data).
MOE_STAGES: tuple[tuple[str, tuple[str, ...], str, bool], ...] = (
    ("residual1", ("tokens", "hidden"), "layer input + self-attention output", False),
    ("mlp.in", ("tokens", "hidden"), "post-attention RMSNorm: what the router and the experts read", False),
    ("mlp.router", ("tokens", "experts"), "router logits", False),
    ("mlp.chosen", ("tokens", "top_k"), "the experts the router chose (ascending expert id)", True),
    ("mlp.weights", ("tokens", "top_k"), "routing weights of the chosen experts, renormalized over top-k", False),
    ("mlp.experts", ("tokens", "top_k", "hidden"), "each chosen expert's output, before its weight", False),
    ("mlp", ("tokens", "hidden"), "mixture-of-experts output: the weighted sum of the chosen experts", False),
)

PIECES = frozenset(suffix for suffix, *_ in MOE_STAGES)

#: What each piece's replay reads ("in": the layer's input sequence).
MOE_INPUTS: dict[str, tuple[str, ...]] = {
    "residual1": ("in",),
    "mlp.in": ("residual1",),
    "mlp.router": ("mlp.in",),
    "mlp.weights": ("mlp.in", "mlp.chosen"),
    "mlp.experts": ("mlp.in", "mlp.chosen"),
    "mlp": ("mlp.in",),
}


def text_config(config: dict) -> dict:
    return dict(config.get("text_config") or config)


def sparse_layers(config: dict) -> list[int]:
    """The decoder layers whose MLP is a mixture of experts (transformers' and mlx-vlm's rule)."""
    text = text_config(config)
    experts = int(text.get("num_experts", text.get("num_local_experts", 0)))  # transformers 5 writes the latter
    step = int(text.get("decoder_sparse_step", 1))
    dense_only = set(text.get("mlp_only_layers") or [])
    layers = int(text.get("num_hidden_layers", 0))
    return [i for i in range(layers) if i not in dense_only and experts > 0 and (i + 1) % step == 0]


def moe_piece(stage_id: str) -> str | None:
    """``text.layer.2.mlp.chosen`` -> ``mlp.chosen``; None for a stage that is no piece of a sparse MLP."""
    if not stage_id.startswith("text.layer."):
        return None
    piece = stage_id.split(".", 3)[3] if stage_id.count(".") >= 3 else ""
    return piece if piece in PIECES else None


def vision_plan(config: dict) -> StagePlan:
    """Qwen3-VL's vision plan (the MoE checkpoints share its tower), under this family's name."""
    plan = dense.vision_plan(config)
    return StagePlan(NAME, plan.stages, plan.depth, plan.meta)


def text_stages(config: dict, max_new_tokens: int) -> list[Stage]:
    """Qwen3-VL's text stages with each sparse layer's MLP pieces before that layer's output."""
    sparse = set(sparse_layers(config))
    stages: list[Stage] = []
    for stage in dense.text_stages(config, max_new_tokens):
        parts = stage.id.split(".")
        if len(parts) == 3 and parts[1] == "layer" and int(parts[2]) in sparse:
            for suffix, axes, meaning, exact in MOE_STAGES:
                stages.append(
                    Stage(
                        f"{stage.id}.{suffix}",
                        axes,
                        integer=exact,
                        data=exact,
                        description=f"text layer {parts[2]}: {meaning}",
                    )
                )
        stages.append(stage)
    return stages


def replay_inputs(stage_id: str, plan: StagePlan) -> tuple[str, ...] | None:
    """A sparse MLP piece reads the pieces before it (the residual the layer's input); the chosen experts are
    data (never replayed); everything else reads what it reads in Qwen3-VL."""
    piece = moe_piece(stage_id)
    if piece is None:
        return dense.replay_inputs(stage_id, plan)
    if piece not in MOE_INPUTS:
        return None
    layer = stage_id.rsplit(f".{piece}", 1)[0]
    branches = len(plan.meta.get("deepstack_visual_indexes", []))
    source = dense.text_layer_input(int(layer.split(".")[2]), branches)
    return tuple(source if name == "in" else f"{layer}.{name}" for name in MOE_INPUTS[piece])


# Qwen3-VL-MoE's sparse layers' stages that are a module's output or input, declared for both sides
# (``taps.module_taps``): paths from the decoder (transformers' ``model.model.language_model``, mlx-vlm's
# ``language_model.model``: the same names). The router's logits, the chosen experts and their weights, and each
# chosen expert's output are not a module's output or input as they stand (sorted by expert id, weighed, or one
# expert slot at a time): ``torch`` and ``mlx`` write them.


def _rows(array: np.ndarray) -> np.ndarray:
    return array[0]


def sparse_taps(layers: Iterable[int]) -> list[ModuleTap]:
    """Each sparse layer's MLP input before and after its norm, and the MLP's output (the prompt's rows)."""
    return [
        tap
        for index in layers
        for tap in (
            both(f"text.layer.{index}.residual1", argument(f"layers.{index}.post_attention_layernorm", _rows)),
            both(f"text.layer.{index}.mlp.in", output(f"layers.{index}.post_attention_layernorm", _rows)),
            both(f"text.layer.{index}.mlp", output(f"layers.{index}.mlp", _rows)),
        )
    ]
