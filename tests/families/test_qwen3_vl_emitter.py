"""The JAX Qwen3-VL emitter beyond f32 parity (tests/families/test_qwen3_vl_agreement.py): its half-precision
contracts are honoured, the GELU form follows the config, and a checkpoint that disagrees with its config
is refused with the tensor named."""

from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np
import pytest
from driftscope.errors import CheckpointError
from driftscope.families.qwen3_vl.jax.weights import VisionSpec, load_vision_weights
from qwen3_vl_support import TOLERANCE, capture, checkpoint, config, inputs


@cache
def _weights():
    spec = VisionSpec.from_config(config())
    return spec, load_vision_weights(checkpoint().path, spec)


def _tower(spec, policy: str, taps: tuple[str, ...]):
    import jax
    from driftscope.families.qwen3_vl.geometry import pack_bucket
    from driftscope.families.qwen3_vl.jax.model import vision_tower
    from driftscope.model.policies import get_policy
    from driftscope.taps.jax.graph import contract_for

    _, weights = _weights()
    case = inputs("224")
    args = (weights, case["pixel_values"], *pack_bucket(case["grid_thw"], spec.grid_side).graph_inputs().values())
    contract = contract_for(get_policy(policy))
    function = jax.jit(lambda w, *a: vision_tower(w, *a, spec=spec, contract=contract, taps=taps))
    return function.lower(*args).as_text(), {k: np.asarray(v) for k, v in function(*args).items()}


@pytest.mark.slow
def test_half_precision_contracts_drift_inside_the_default_contract():
    """f16-contract (F16 dot operands) and f16-state (also F16 residual stream and norms) are honoured:
    their StableHLO has F16 dot operands, and their outputs leave float32 agreement but stay within 0.08."""
    spec, _ = _weights()
    expected = capture("transformers", "224")
    drift = {}
    for name in ("f16-contract", "f16-state"):
        text, out = _tower(spec, name, ("vision.block.5",))
        assert "xf16>" in text
        drift[name] = {k: float(np.abs(v - expected[k]).max()) for k, v in out.items()}
        assert all(TOLERANCE < value < 0.08 for value in drift[name].values()), drift[name]
    assert drift["f16-state"]["vision.block.5"] > drift["f16-contract"]["vision.block.5"]


def test_the_block_activation_follows_the_config():
    """With exact GELU (what the config would say for an erf checkpoint) the blocks' act leaves f32 agreement
    with this tanh checkpoint, while fc1 before it still agrees."""
    spec, _ = _weights()
    _, out = _tower(
        dataclasses.replace(spec, hidden_act="gelu"), "f32", ("vision.block.0.mlp.fc1", "vision.block.0.mlp.act")
    )
    expected = capture("transformers", "224")
    assert abs(out["vision.block.0.mlp.act"] - expected["vision.block.0.mlp.act"]).max() > TOLERANCE
    assert abs(out["vision.block.0.mlp.fc1"] - expected["vision.block.0.mlp.fc1"]).max() < TOLERANCE


def test_checkpoint_config_mismatch_is_named(tmp_path):
    spec = dataclasses.replace(VisionSpec.from_config(config()), depth=7)
    with pytest.raises(CheckpointError, match="blocks.6.norm1.weight"):
        load_vision_weights(checkpoint().path, spec)
    wrong_act = {**config(), "vision_config": {**config()["vision_config"], "hidden_act": "silu"}}
    with pytest.raises(CheckpointError, match="not supported"):
        VisionSpec.from_config(wrong_act)
    outside = {**config(), "vision_config": {**config()["vision_config"], "deepstack_visual_indexes": [1, 9]}}
    with pytest.raises(CheckpointError, match="outside"):
        VisionSpec.from_config(outside)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(checkpoint().path / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if "visual" not in k}, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="no vision tensors"):
        load_vision_weights(tmp_path, VisionSpec.from_config(config()))
