"""Qwen3-VL's mutations on the tiny fixture: under the float32 contract every one is first seen at the stage
it declares (the default F16 contract's power over the same fixture is tests/families/test_families.py's); each
declares itself blind, with the reason, on inputs that cannot reveal it."""

from __future__ import annotations

from driftscope.families.qwen3_vl.mutations import MUTATIONS
from driftscope.taps.stages import StageSelection
from qwen3_vl_support import F32, capture, checkpoint, config, inputs, plan, scratch

EXPECTED = {
    "deepstack_branch_dropped": "text.layer.1.deepstack",
    "deepstack_branch_zeroed": "vision.deepstack.1",
    "deepstack_branches_swapped": "text.layer.0.deepstack",
    "deepstack_one_layer_late": "text.layer.0.deepstack",
    "exact_gelu_in_blocks": "vision.block.0.mlp.act",
    "tanh_gelu_in_mergers": "vision.deepstack.0.act",
    "bf16_position_interpolation": "vision.pos_embed",
    "nearest_position_interpolation": "vision.pos_embed",
    "qwen2_resize_bounds": "inputs.pixel_values",
    "bilinear_resampling": "inputs.pixel_values",
}
#: blind on the one-image fixture (the video tests, tests/families/test_video_runs.py, see it detected)
BLIND_HERE = {"cross_image_leak": "one image of one frame"}


def test_every_mutation_is_first_seen_at_its_declared_stage_under_the_f32_contract():
    from conftest import family_power_capture
    from driftscope.replay.power import fixture_power

    # the 224 case is ``runs``' inputs: the mutated captures are test_families' (judged there by the default contract)
    power = fixture_power(
        capture("transformers", "224"),
        checkpoint(),
        inputs("224"),
        plan(),
        F32,
        scratch() / "power",
        capture=family_power_capture("qwen3_vl"),
    )
    found = {entry["mutation"]: entry for entry in power["mutations"]}
    assert sorted(found) == sorted([*EXPECTED, *BLIND_HERE]) == MUTATIONS.names()
    for name, reason in BLIND_HERE.items():
        assert not found[name]["detected"] and found[name]["blind_reason"].startswith(reason), found[name]
    for name, stage in EXPECTED.items():
        entry = found[name]
        assert entry["detected"] and entry["first_divergence"] == stage == entry["declared_stage"], entry


def test_each_mutation_says_why_an_input_cannot_reveal_it():
    full, vision = plan(), plan().select(StageSelection(exclude=("text.*",)))
    for name in ("deepstack_branch_dropped", "deepstack_branches_swapped", "deepstack_one_layer_late"):
        assert MUTATIONS.get(name).blind(inputs("224"), full) is None
        assert "no text: section" in MUTATIONS.get(name).blind(inputs("224"), vision)
    # 448x448 is already a multiple of 32 within the bounds: neither the resampler nor the bounds matter
    assert "resampler is never used" in MUTATIONS.get("bilinear_resampling").blind(inputs("448"), full)
    assert "same sizes" in MUTATIONS.get("qwen2_resize_bounds").blind(inputs("448"), full)
    for name in ("bilinear_resampling", "qwen2_resize_bounds", "nearest_position_interpolation"):
        assert MUTATIONS.get(name).blind(inputs("224"), full) is None
    on_rows = inputs("224")
    on_rows = type(on_rows)(
        {**on_rows.arrays, "grid_thw": on_rows["grid_thw"] * 0 + [1, 48, 48]},
        [],
        [],
        on_rows.image_tokens,
        on_rows.facts,
    )
    assert "lands exactly on a row" in MUTATIONS.get("nearest_position_interpolation").blind(on_rows, full)
    assert config()["vision_config"]["deepstack_visual_indexes"] == [1, 3, 4]


def test_a_processor_mutation_hands_the_runtime_other_inputs_with_the_prompt_rebuilt():
    mutated = MUTATIONS.get("qwen2_resize_bounds").inputs(checkpoint(), inputs("224"), {})
    assert mutated["grid_thw"].tolist() == [[1, 14, 14]]  # 224x224 within Qwen2's bounds: not upscaled
    assert int((mutated.text.input_ids == 6).sum()) == 49 and mutated.text.prompt == inputs("224").text.prompt
    assert any("min_pixels 3136" in warning for warning in mutated.warnings)
    bilinear = MUTATIONS.get("bilinear_resampling").inputs(checkpoint(), inputs("224"), {})
    assert bilinear.facts["processor"]["resample"] == "bilinear"
    assert bilinear["pixel_values"].shape == inputs("224")["pixel_values"].shape
    assert abs(bilinear["pixel_values"] - inputs("224")["pixel_values"]).max() > 0.08
