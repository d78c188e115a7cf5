"""Qwen3-VL-MoE's defects for fixture power: the routing mutations of a sparse decoder, and Qwen3-VL's own
DeepStack and position-table mutations (the tower and DeepStack are the same model code)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from driftscope.core.registry import Registry
from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.stages import StagePlan

from ..base import Mutation
from ..qwen3_vl.mutations import MUTATIONS as DENSE
from .hypotheses import mlx_vlm_gelus

MUTATIONS: Registry[Mutation] = Registry("mutation")

#: Qwen3-VL's mutations that reach this family's model code unchanged.
SHARED = ("deepstack_branch_dropped", "nearest_position_interpolation")


def _first_sparse(plan: StagePlan, piece: str) -> list[str]:
    return [stage.id for stage in plan if stage.id.startswith("text.layer.") and stage.id.endswith(f".{piece}")][:1]


def _no_sparse_layer(inputs: ModelInputs, plan: StagePlan) -> str | None:
    if not _first_sparse(plan, "mlp.weights"):
        return "the run follows no sparse decoder layer (no text: section, or no layer with experts)"
    return None


def _on_corrected_port(install):
    """``install`` on mlx-vlm's port corrected first (its swapped tower GELUs put back: ``mlx_vlm_gelus``)."""

    def corrected(model: Any, settings: dict) -> None:
        mlx_vlm_gelus(model)
        if install is not None:
            install(model, settings)

    return corrected


def _unnormalized(model: Any, settings: dict) -> None:
    for layer in model.language_model.model.layers:
        if hasattr(layer.mlp, "norm_topk_prob"):
            layer.mlp.norm_topk_prob = False


for mutation in (
    Mutation(
        "expert_weights_unnormalized",
        "the chosen experts' routing weights are not renormalized over the top-k (norm_topk_prob off)",
        lambda plan: _first_sparse(plan, "mlp.weights"),
        _unnormalized,
        _no_sparse_layer,
    ),
    *(DENSE.get(name) for name in SHARED),
):
    MUTATIONS.register(mutation.name, replace(mutation, install=_on_corrected_port(mutation.install)))
