"""mlx-vlm 0.7.10's three Molmo2 defects, found by driftscope's own comparison and replay against transformers
f32, and the ready patches that close them (tiny hub-layout checkpoint, 224 px shapes image, whole plan).

The default mlx runtime is mlx-vlm as shipped: the defects show unless a run applies a patch.
"""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.errors import HypothesisPatchError
from driftscope.families.molmo2 import hypotheses
from driftscope.families.molmo2.mlx import load_mlx_model
from driftscope.judge.compare import compare_tapsets, first_divergence
from molmo2_support import (
    DEFECT_STAGE,
    F32,
    FIXES,
    TOLERANCE,
    capture,
    checkpoint_dirs,
    config,
    errors,
    first_over,
    fixes_patch,
    plan,
    scratch,
)


def test_mlx_vlm_as_shipped_diverges_first_at_the_fast_gelu():
    measured = errors(capture("transformers", "224"), capture("mlx", "224"))
    assert first_over(measured) == "vision.block.0.mlp.act"
    assert 1.5e-2 < measured["vision.block.0.mlp.act"] < 2.5e-2  # measured 2.07e-2
    assert measured["vision.block.0.mlp.fc1"] < TOLERANCE  # the GELU's input still agrees
    assert measured["vision.selected.24"] > 1.0 and measured["text.logits.last"] > 0.1
    rows = compare_tapsets(capture("transformers", "224"), capture("mlx", "224"), F32, plan())
    assert first_divergence(rows).stage == "vision.block.0.mlp.act"


def test_the_fast_gelu_is_what_separates_block_0():
    """Independent numpy: the gap between x*sigmoid(1.702x) and the tanh GELU on block 0's fc1 values."""
    fc1 = np.asarray(capture("transformers", "224")["vision.block.0.mlp.fc1"], dtype=np.float64)
    tanh = 0.5 * fc1 * (1 + np.tanh(np.sqrt(2 / np.pi) * (fc1 + 0.044715 * fc1**3)))
    fast = fc1 / (1 + np.exp(-1.702 * fc1))
    measured = errors(capture("transformers", "224"), capture("mlx", "224"))["vision.block.0.mlp.act"]
    assert abs(np.abs(fast - tanh).max() - measured) < 1e-4


@pytest.mark.parametrize("missing", FIXES)
def test_with_two_patches_the_first_divergence_names_the_third_defect(missing):
    """driftscope's own judgement (compare under a 1e-4 contract) names the one defect the two patches leave."""
    rows = compare_tapsets(capture("transformers", "224"), capture("mlx", "224", skip=(missing,)), F32, plan())
    assert first_divergence(rows).stage == DEFECT_STAGE[missing]
    measured = errors(capture("transformers", "224"), capture("mlx", "224", skip=(missing,)))
    assert first_over(measured) == DEFECT_STAGE[missing]


@pytest.mark.slow  # a same-input replay of every stage (~1 min each on 2 cores)
@pytest.mark.parametrize("missing", FIXES)
def test_with_two_patches_the_first_introduced_error_is_the_third_defect(missing):
    """Same-input replay of mlx-vlm (two patches) on transformers' stage inputs labels the remaining defect's
    stage introduced, and nothing before it."""
    from driftscope.capture.runtimes import get_runtime
    from driftscope.replay.drilldown import drill_down
    from molmo2_support import checkpoint

    reference = capture("transformers", "224")
    rows = compare_tapsets(reference, capture("mlx", "224", skip=(missing,)), F32, plan())
    runtime = get_runtime("mlx")(checkpoint(), "f32", fixes_patch((missing,)))
    drill = drill_down(reference, runtime, rows, F32, plan(), scratch() / f"replay-{missing}", "pair")
    runtime.release()
    assert drill.first_introduced == DEFECT_STAGE[missing]


def test_the_layer_defect_reads_layers_22_and_16():
    """Without the patch mlx-vlm's first slot is transformers' layer 22 and its second layer 16."""
    model = load_mlx_model(checkpoint_dirs()["hub"], config("hub"))
    assert model.vision_tower.vit_layers == [22, 16]
    assert hypotheses.layers_from_declared_depth(model).vision_tower.vit_layers == [24, 18]
    reference = capture("transformers", "224")
    measured = errors(reference, capture("mlx", "224", skip=("layers_from_declared_depth",)))
    assert 2.0 < measured["vision.selected.24"] < 10.0 and 2.0 < measured["vision.selected.18"] < 10.0
    assert measured["projector.output"] > 0.1
    unpatched = capture("mlx", "224", skip=("layers_from_declared_depth",))
    for got, layer in (("vision.selected.24", 22), ("vision.selected.18", 16)):  # transformers' layers 22, 16
        assert np.abs(np.asarray(unpatched[got]) - np.asarray(reference[f"vision.block.{layer}"])).max() < TOLERANCE


def test_the_mask_defect_changes_the_image_rows_of_the_mask_and_moves_the_logits():
    reference = capture("transformers", "224")
    causal = capture("mlx", "224", skip=("bidirectional_image_mask",))
    measured = errors(reference, causal)
    assert measured["projector.output"] < TOLERANCE and measured["text.embeds.image"] < TOLERANCE
    types = np.asarray(reference["text.token_types"]).astype(bool)
    expected = np.tril(np.ones((len(types), len(types)), dtype=np.int64)) | np.outer(types, types)
    np.testing.assert_array_equal(reference["text.attention_mask"], expected)
    np.testing.assert_array_equal(causal["text.attention_mask"], np.tril(np.ones_like(expected)))
    assert measured["text.logits.last"] > 0.05


def test_the_three_patches_close_every_stage():
    measured = errors(capture("transformers", "224"), capture("mlx", "224", skip=()))
    assert first_over(measured) is None, {k: v for k, v in measured.items() if v >= TOLERANCE}
    assert len(measured) > 300 and "text.logits.last" in measured


def test_the_native_layout_resolves_the_layers_right_without_a_patch():
    model = load_mlx_model(checkpoint_dirs()["native"], config("native"))
    assert model.vision_tower.vit_layers == [24, 18]
    assert hypotheses.layers_from_declared_depth(model).vision_tower.vit_layers == [24, 18]


def test_the_layer_patch_needs_a_declared_depth_and_the_fixes_name_what_they_skip():
    model = load_mlx_model(checkpoint_dirs()["hub"], config("hub"))
    object.__delattr__(model, "driftscope_source_config")
    with pytest.raises(HypothesisPatchError, match="declared_depth"):
        hypotheses.layers_from_declared_depth(model)
    assert hypotheses.layers_from_declared_depth(model, declared_depth=27).vision_tower.vit_layers == [24, 18]
    with pytest.raises(HypothesisPatchError, match="ViT layers"):
        hypotheses.layers_from_declared_depth(model, declared_depth=40)
    with pytest.raises(HypothesisPatchError, match="cannot skip"):
        hypotheses.mlx_vlm_fixes(model, skip=["no_such_fix"])
