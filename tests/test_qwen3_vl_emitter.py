"""The JAX Qwen3-VL emitter (f32) against transformers f32: every vision stage, every DeepStack branch,
the hidden states after each DeepStack add and the prefill logits, at 224, 448 and two images packed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from driftscope.errors import CheckpointError
from driftscope.families.qwen3_vl.emitter import VisionSpec, load_vision_weights
from driftscope.families.qwen3_vl.emitter.layers import Contract
from driftscope.families.qwen3_vl.emitter.stages import stage_function, stage_weights
from driftscope.families.qwen3_vl.plan import replay_inputs, vision_plan
from qwen3_vl_support import (
    TOLERANCE,
    case,
    checkpoint_dir,
    config,
    emitter_weights,
    jax_taps,
    max_errors,
    reference,
    run_tower,
    vision_stage_ids,
)


@pytest.mark.parametrize("name", ["224", "448", "two-256"])
def test_jax_f32_agrees_with_transformers_on_every_stage(name):
    expected, got = reference(name), jax_taps(name)
    text = [k for k in expected if k.startswith("text.layer.") or k in ("text.norm.last", "text.logits.last")]
    errors = max_errors(got, expected, vision_stage_ids() + text)
    assert len([k for k in errors if k.endswith(".deepstack")]) == 3 and len(errors) > 100
    worst = {key: f"{value:.1e}" for key, value in errors.items() if value > TOLERANCE}
    assert not worst, worst
    np.testing.assert_array_equal(got["text.position_ids"], expected["text.position_ids"])
    print(
        name,
        "worst vision",
        max(v for k, v in errors.items() if k.startswith("vision")),
        "logits",
        errors["text.logits.last"],
    )


def test_packed_images_attend_only_to_themselves():
    """The second of two packed images (mirror images of each other) gives the result transformers gives
    for that image alone: the segment mask isolates it from the first image and from the padding rows."""
    packed, alone = run_tower("two-256"), reference("mirrored-256")
    half = packed["vision.block.5"].shape[0] // 2
    assert abs(packed["vision.block.5"][:half] - packed["vision.block.5"][half:]).max() > 0.1
    for stage in ("vision.block.0.attn.context", "vision.block.5", "vision.deepstack.2", "vision.merger"):
        rows = packed[stage].shape[0] // 2
        np.testing.assert_allclose(packed[stage][rows:], alone[stage], atol=TOLERANCE, err_msg=stage)


def test_exact_gelu_in_the_blocks_is_caught():
    """Negative control: the emitter with erf GELU in the vision MLPs (the checkpoint says tanh) fails the contract."""
    vision = emitter_weights()[0]
    mutated = run_tower("224", dataclasses.replace(vision, hidden_act="gelu"))
    expected = reference("224")
    assert abs(mutated["vision.block.0.mlp.act"] - expected["vision.block.0.mlp.act"]).max() > TOLERANCE
    assert abs(mutated["vision.block.0.mlp.fc1"] - expected["vision.block.0.mlp.fc1"]).max() < TOLERANCE


def test_every_vision_operator_replays_the_reference_from_its_own_inputs():
    """Same-input replay: each stage function fed transformers' own inputs reproduces transformers' output."""
    import jax

    spec, _, vision_weights, _ = emitter_weights()
    expected = reference("224")
    segments = np.zeros(int(case("224").grid_thw[0].prod()), np.int32)  # one image: one segment
    cos, sin = expected["vision.rotary.cos"], expected["vision.rotary.sin"]
    checked, functions = 0, {}
    for stage in vision_plan(config()):
        sources = replay_inputs(stage.id, config())
        if sources is None:
            continue
        kind = _kind(stage.id)
        if kind not in functions:  # one compilation per kind: every block (and every branch) shares it
            functions[kind] = jax.jit(stage_function(kind, spec, Contract()))
        args = tuple(expected[s] for s in sources)
        got = np.asarray(functions[kind](stage_weights(vision_weights, stage.id), args, cos, sin, segments))
        assert abs(got - expected[stage.id]).max() < TOLERANCE, stage.id
        checked += 1
    assert checked == len(vision_plan(config())) - 8  # all but inputs, pos_embed, rotary tables and bounds
    table = stage_function("pos_embed", spec, Contract())
    got = table(
        stage_weights(vision_weights, "vision.pos_embed"),
        (expected["vision.interp_indices"], expected["vision.interp_weights"]),
        cos,
        sin,
        segments,
    )
    assert abs(np.asarray(got) - expected["vision.pos_embed"]).max() < 1e-6


def _kind(stage_id: str) -> str:
    from driftscope.families.qwen3_vl.emitter.stages import parse_stage

    return parse_stage(stage_id)[2]


def test_checkpoint_config_mismatch_is_named(tmp_path):
    spec = dataclasses.replace(VisionSpec.from_config(config()), depth=7)
    with pytest.raises(CheckpointError, match="blocks.6.norm1.weight"):
        load_vision_weights(checkpoint_dir(), spec)
    wrong_act = {**config(), "vision_config": {**config()["vision_config"], "hidden_act": "silu"}}
    with pytest.raises(CheckpointError, match="not supported"):
        VisionSpec.from_config(wrong_act)
    outside = {**config(), "vision_config": {**config()["vision_config"], "deepstack_visual_indexes": [1, 9]}}
    with pytest.raises(CheckpointError, match="outside"):
        VisionSpec.from_config(outside)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(checkpoint_dir() / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if "visual" not in k}, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="no vision tensors"):
        load_vision_weights(tmp_path, VisionSpec.from_config(config()))


def test_half_precision_contracts_drift_inside_the_default_contract():
    """f16-contract (F16 dot operands) and f16-state (also F16 residual stream and norms) are honoured:
    their StableHLO has F16 dot operands, and their outputs leave float32 agreement but stay within 0.08."""
    import jax
    from driftscope.compiled.graph import contract_for
    from driftscope.families.qwen3_vl.emitter import vision_tower
    from driftscope.families.qwen3_vl.geometry import pack_bucket
    from driftscope.precision import get_policy

    spec, _, vision_weights, _ = emitter_weights()
    c, expected = case("224"), reference("224")
    args = (vision_weights, c.pixel_values, *pack_bucket(c.grid_thw, spec.grid_side).graph_inputs().values())
    drift = {}
    for name in ("f16-contract", "f16-state"):
        contract = contract_for(get_policy(name))
        function = jax.jit(
            lambda w, *a, contract=contract: vision_tower(w, *a, spec=spec, contract=contract, taps=("vision.block.5",))
        )
        assert "xf16>" in function.lower(*args).as_text()
        out = {k: np.asarray(v) for k, v in function(*args).items()}
        drift[name] = {k: float(np.abs(v - expected[k]).max()) for k, v in out.items()}
        assert all(TOLERANCE < value < 0.08 for value in drift[name].values()), drift[name]
    assert drift["f16-state"]["vision.block.5"] > drift["f16-contract"]["vision.block.5"]
