"""The generic family's stage plan on the testers' tiny checkpoints: what each runtime is told to tap for a stage
(its module on each side, the layouts between them) and what it declares it cannot give."""

from __future__ import annotations

import numpy as np
from conftest import SHAPES
from driftscope.families.checkpoints import open_checkpoint
from make_generic_tinies import ensure


def _plan(model_type: str):
    from driftscope.families import get_family

    checkpoint = open_checkpoint(ensure(model_type))
    return checkpoint, get_family("generic").plan_for(checkpoint)


def test_a_convolution_input_goes_back_channels_first_where_tiles_and_channels_are_both_three():
    """InternVL's probe crops three 64x64 tiles of 3 channels: MLX's patch embedding takes [3, 64, 64, 3], where two
    orders of the axes move a single one; the convolution's channel order says which, so the captured input is
    compared (a shape mismatch before)."""
    from driftscope.families.generic.entries import entries, to_reference

    _, plan = _plan("internvl")
    entry = entries(plan)["vision.embeddings.patch_embeddings.projection.input"]
    assert entry["capture"] == "input" and entry["refusal"] is None
    nhwc = np.arange(3 * 64 * 64 * 3, dtype=np.float32).reshape(3, 64, 64, 3)
    np.testing.assert_array_equal(to_reference(nhwc, entry, "input_back"), nhwc.transpose(0, 3, 1, 2))


def test_a_module_mlx_vlm_never_calls_is_declared_absent_saying_so(tmp_path):
    """mlx-vlm's CLIP tower runs its encoder's layers itself and never calls the encoder: its stage is declared
    absent with why, not missing (a gate would fail on a stage it was never going to get)."""
    from driftscope.capture.runtimes import get_runtime
    from driftscope.families.generic import _prepare_inputs
    from driftscope.families.generic.entries import entries

    checkpoint, plan = _plan("llava")
    why = entries(plan)["vision.encoder"]["refusal"]
    assert why == "not comparable: mlx-vlm's forward never calls vision_tower.vision_model.encoder"
    tapset = get_runtime("mlx")(checkpoint, "f32").capture(_prepare_inputs(checkpoint, [SHAPES]), plan, tmp_path)
    assert tapset.meta["declared_absent"]["vision.encoder"] == why
    assert "vision.encoder" not in tapset and "vision.block.1" in tapset


def test_decoders_that_run_on_different_numbers_of_positions_are_compared_not_refused():
    """mlx-vlm's LLaVA-NeXT merge hands its decoder more rows than the prompt has: a difference (compared, a shape
    mismatch naming both lengths); the vision towers are compared at what each computed last, the pooled CLS on both
    sides (transformers' ``pooler_output``, mlx-vlm's first array), where their first arrays held different numbers
    of elements."""
    from driftscope.families.generic.entries import entries

    _, plan = _plan("llava_next")
    read = entries(plan)
    assert read["text.layer.0.input_layernorm"]["refusal"] is None and read["text.layer.0"]["layout"] is None
    assert read["vision.output"]["refusal"] is None and read["vision.output"]["torch_item"] == ["pooler_output"]
