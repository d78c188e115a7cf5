"""Molmo2's named defects, planted in eager MLX (mlx-vlm) to prove a fixture's power.

mlx-vlm 0.7.10 has three defects of its own (``hypotheses``), so every mutation starts from mlx-vlm with
the three ready patches applied (a port that agrees with transformers) and plants one defect; three of them
put back one of mlx-vlm's own, so the audit also shows the fixture can see each real defect. Each says which
stage it should disturb first and, from the inputs alone, when a fixture is blind to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from driftscope.core.registry import Registry
from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.mlx_hooks import module_attr
from driftscope.taps.stages import StagePlan

from ..base import Mutation
from . import hypotheses
from .config import resolve_layers

MUTATIONS: Registry[Mutation] = Registry("mutation")


def corrected(model: Any, *skip: str) -> Any:
    """mlx-vlm's model with the ready patches for its defects applied (except ``skip``)."""
    return hypotheses.mlx_vlm_fixes(model, skip)


def _first_selected(plan: StagePlan) -> list[str]:
    return [f"vision.selected.{layer}" for layer in plan.meta.get("selected_layers", [])[:1]]


def _layers_after_truncation(model, settings):
    corrected(model, "layers_from_declared_depth")
    vision = model.vision_tower
    vision.vit_layers[:] = list(
        resolve_layers(tuple(vision.adapter_config.vit_layers), len(vision.image_vit.transformer))
    )


def _reversed_layers(model, settings):
    corrected(model)
    model.vision_tower.vit_layers.reverse()


def _mean_over_all_slots(model, settings):
    corrected(model)
    model.vision_tower.adapter_config.pooling_attention_mask = False


def _clamp_padding(model, settings):
    """The tower sees -1 indices clamped to 0: padded slots gather patch 0 and count as valid."""
    import mlx.core as mx

    corrected(model)
    tower = model.vision_tower
    base = type(tower)

    class Clamped(base):
        def __call__(self, images, pooled_patches_idx):
            return base.__call__(self, images, mx.maximum(pooled_patches_idx, 0))

    tower.__class__ = Clamped


@contextmanager
def _silu_by_division(model, settings) -> Iterator[None]:
    import mlx.core as mx
    from mlx_vlm.models.molmo2 import vision as vision_module

    class Division:
        def __getattr__(self, name: str) -> Any:
            return getattr(original, name)

        @staticmethod
        def silu(x):
            return x / (1 + mx.exp(-x))

    original = vision_module.nn
    with module_attr(vision_module, "nn", Division()):
        yield


def _exact_gelu(model, settings):
    import mlx.nn as nn

    corrected(model)
    for block in model.vision_tower.image_vit.transformer:
        block.feed_forward.act = nn.GELU()  # the exact erf form, not Molmo2's tanh approximation


def _causal_mask(model, settings):
    corrected(model, "bidirectional_image_mask")


def _no_negative_layers(inputs: ModelInputs, plan: StagePlan) -> str | None:
    configured, selected = plan.meta.get("configured_layers", []), plan.meta.get("selected_layers", [])
    depth = plan.depth
    if list(resolve_layers(tuple(configured), depth)) == list(selected):
        return (
            f"vit_layers {configured} resolve to the same layers against the {depth} layers that run "
            f"as against the declared {plan.meta.get('declared_depth')}: the defect changes nothing here"
        )
    return None


def _one_layer(inputs: ModelInputs, plan: StagePlan) -> str | None:
    if len(plan.meta.get("selected_layers", [])) < 2:
        return "one selected layer: there is no order to get wrong"
    return None


def _no_padding(inputs: ModelInputs, plan: StagePlan) -> str | None:
    if (np.asarray(inputs["pooling"]) >= 0).all():
        return "every pooled token of these images has all its patches: there are no padding slots"
    return None


def _crops_reversed(checkpoint, original: ModelInputs, settings: dict) -> ModelInputs:
    """The run's inputs with each image's crops in reverse order (its low-resolution crop last), the pooling
    indices unchanged: a processor whose crop order is not the one its indices assume."""
    from dataclasses import replace

    pixels = np.asarray(original["pixel_values"])
    bounds = np.cumsum([0, *np.asarray(original["num_crops"]).reshape(-1).tolist()])
    order = np.concatenate([np.arange(a, b)[::-1] for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
    return replace(original, arrays={**original.arrays, "pixel_values": pixels[order]})


def _crops_alike(inputs: ModelInputs, plan: StagePlan) -> str | None:
    if all(list(tiling) == [1, 1] for tiling in inputs.facts.get("tiling", [])):
        return (
            "one high-resolution crop per image, which is the low-resolution crop pixel for pixel (both the image "
            "resized to one crop): reordering the crops changes nothing (use an image that takes several crops)"
        )
    return None


def _no_prompt(inputs: ModelInputs, plan: StagePlan) -> str | None:
    if inputs.text is None or "text.attention_mask" not in plan:
        return "the run does not follow a prompt: the decoder's mask is never built (add text: to the parameters)"
    return None


for mutation in (
    Mutation(
        "layers_after_truncation",
        "negative vit_layers resolved against the layers that run (25) instead of the declared depth (27): "
        "[-3, -9] read layers [22, 16], not [24, 18] (mlx-vlm 0.7.10's hub-layout defect)",
        _first_selected,
        _layers_after_truncation,
        _no_negative_layers,
    ),
    Mutation(
        "layers_concatenated_reversed",
        "the selected layers concatenated in the reverse of the configured order",
        _first_selected,
        _reversed_layers,
        _one_layer,
    ),
    Mutation(
        "pool_mean_over_all_slots",
        "the pooler's query averages all 4 slots, padding included, instead of dividing by the valid count "
        "(mlx-vlm's pooling_attention_mask: false path, whose attention also reads the padding)",
        lambda plan: ["pool.query"],
        _mean_over_all_slots,
        _no_padding,
    ),
    Mutation(
        "padding_index_clamped",
        "-1 pooling indices clamped to 0 before the validity test: padded slots gather patch 0",
        lambda plan: ["pool.gathered"],
        _clamp_padding,
        _no_padding,
    ),
    Mutation(
        "crops_reversed",
        "each image's crops passed in reverse order (the low-resolution crop last) while the pooling indices "
        "assume the processor's order",
        lambda plan: ["inputs.pixel_values"],
        lambda model, settings: corrected(model),
        _crops_alike,
        inputs=_crops_reversed,
    ),
    Mutation(
        "silu_by_division",
        "the projector's SiLU computed as x / (1 + exp(-x)) instead of x * sigmoid(x)",
        lambda plan: ["projector.act"],
        lambda model, settings: corrected(model),
        during=_silu_by_division,
    ),
    Mutation(
        "exact_gelu_vit",
        "the ViT MLP's tanh-approximated GELU computed with the exact erf form",
        lambda plan: ["vision.block.0.mlp.act", "vision.block.0"],
        _exact_gelu,
    ),
    Mutation(
        "causal_image_mask",
        "the decoder's prefill mask causal over image tokens too (mlx-vlm 0.7.10's defect: transformers lets "
        "image tokens attend to each other both ways)",
        lambda plan: ["text.attention_mask"],
        _causal_mask,
        _no_prompt,
    ),
):
    MUTATIONS.register(mutation.name, mutation)
