"""mlx-vlm 0.7.10's three Molmo2 defects, measured against transformers f32, and the patches that close them.

Runs on the tiny hub-layout checkpoint at 224 px. Stage order is the Molmo2 plan's; "first divergence"
is the first stage whose max |mlx - transformers| reaches 1e-4.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from driftscope.errors import HypothesisPatchError
from driftscope.families.molmo2 import hypotheses
from driftscope.families.molmo2.config import load_mlx_model, read_facts
from driftscope.families.molmo2.mlx_taps import capture
from driftscope.families.molmo2.plan import stage_plan
from driftscope.patches import HypothesisPatch
from molmo2_support import checkpoint_dirs, config, max_abs, reference_taps, shapes_inputs

PATCHES = ("tanh_gelu", "layers_from_declared_depth", "bidirectional_image_mask")
#: Where each defect first shows (the first stage the patch named after it makes agree again).
DEFECT_STAGE = {
    "tanh_gelu": "vision.block.0.mlp.act",
    "layers_from_declared_depth": "vision.selected.24",
    # the decoder's taps are at the last position, a text token whose own mask row is causal either way:
    # the image rows' change reaches it one layer later
    "bidirectional_image_mask": "text.layer.1.last",
}


@functools.cache
def mlx_errors(patches: tuple[str, ...], layout: str = "hub") -> dict[str, float]:
    """``{stage: max |mlx f32 - transformers f32|}`` in plan order, with the named patches applied."""
    model = load_mlx_model(checkpoint_dirs()[layout], config(layout))
    for name in patches:
        model = HypothesisPatch(f"driftscope.families.molmo2.hypotheses:{name}").apply(model)
    taps = capture(model, shapes_inputs(224), read_facts(config("hub")).selected_layers)
    reference = reference_taps(224)
    plan = stage_plan(config("hub"))
    assert set(reference) <= set(taps)
    return {stage: max_abs(taps[stage], reference[stage]) for stage in plan.ids() if stage in reference}


def first_divergence(errors: dict[str, float]) -> str | None:
    return next((stage for stage, error in errors.items() if not error < 1e-4), None)


def test_unpatched_mlx_vlm_shows_the_fast_gelu_first():
    errors = mlx_errors(())
    assert first_divergence(errors) == "vision.block.0.mlp.act"
    assert 1.5e-2 < errors["vision.block.0.mlp.act"] < 2.5e-2  # measured 2.07e-2
    assert errors["vision.block.0.mlp.fc1"] < 1e-4  # the GELU's input still agrees
    assert errors["vision.selected.24"] > 1.0 and errors["text.logits.last"] > 0.1


def test_fast_gelu_is_what_separates_block_0():
    """An independent numpy check: the gap between x*sigmoid(1.702x) and the tanh GELU on block 0's fc1 values."""
    fc1 = reference_taps(224)["vision.block.0.mlp.fc1"].astype(np.float64)
    tanh = 0.5 * fc1 * (1 + np.tanh(np.sqrt(2 / np.pi) * (fc1 + 0.044715 * fc1**3)))
    fast = fc1 / (1 + np.exp(-1.702 * fc1))
    assert abs(np.abs(fast - tanh).max() - mlx_errors(())["vision.block.0.mlp.act"]) < 1e-4


@pytest.mark.parametrize("missing", PATCHES)
def test_with_two_patches_the_first_divergence_is_the_third_defect(missing):
    applied = tuple(name for name in PATCHES if name != missing)
    errors = mlx_errors(applied)
    assert first_divergence(errors) == DEFECT_STAGE[missing], {k: v for k, v in errors.items() if v >= 1e-4}
    order = list(errors)
    for name in applied:  # each applied patch upstream of the remaining defect closes its own
        if order.index(DEFECT_STAGE[name]) < order.index(DEFECT_STAGE[missing]):
            assert errors[DEFECT_STAGE[name]] < 1e-4, name


def test_layers_defect_reads_layers_22_and_16():
    """Without the patch, mlx-vlm's first slot is transformers' layer 22 and its second layer 16."""
    model = load_mlx_model(checkpoint_dirs()["hub"], config("hub"))
    assert model.vision_tower.vit_layers == [22, 16]
    model = hypotheses.layers_from_declared_depth(hypotheses.tanh_gelu(model))
    assert model.vision_tower.vit_layers == [24, 18]
    errors = mlx_errors(("tanh_gelu", "bidirectional_image_mask"))
    assert 2.0 < errors["vision.selected.24"] < 10.0 and 2.0 < errors["vision.selected.18"] < 10.0  # 4.4, 4.7
    assert errors["projector.output"] > 0.1  # 0.24 on this fixture (its adapter weights are scaled by 0.5)


def test_mask_defect_moves_the_logits():
    errors = mlx_errors(("tanh_gelu", "layers_from_declared_depth"))
    assert errors["projector.output"] < 1e-4 and errors["text.embeds.image"] < 1e-4
    assert errors["text.layer.0.last"] < 1e-4
    assert errors["text.logits.last"] > 0.05  # 0.12 on this fixture


def test_all_three_patches_close_every_stage():
    errors = mlx_errors(PATCHES)
    assert first_divergence(errors) is None, {k: v for k, v in errors.items() if v >= 1e-4}
    assert errors["text.logits.last"] < 1e-4 and len(errors) > 300


def test_native_layout_resolves_the_layers_right_without_a_patch():
    model = load_mlx_model(checkpoint_dirs()["native"], config("native"))
    assert model.vision_tower.vit_layers == [24, 18]
    assert hypotheses.layers_from_declared_depth(model).vision_tower.vit_layers == [24, 18]


def test_layers_patch_needs_a_declared_depth():
    model = load_mlx_model(checkpoint_dirs()["hub"], config("hub"))
    object.__delattr__(model, "driftscope_source_config")
    with pytest.raises(HypothesisPatchError, match="declared_depth"):
        hypotheses.layers_from_declared_depth(model)
    assert hypotheses.layers_from_declared_depth(model, declared_depth=27).vision_tower.vit_layers == [24, 18]
    with pytest.raises(HypothesisPatchError, match="ViT layers"):
        hypotheses.layers_from_declared_depth(model, declared_depth=40)
