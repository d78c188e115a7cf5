"""The JAX Molmo2 emitter against transformers f32, stage by stage, and compiled through IREE."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
from driftscope.families.molmo2.emitter import FINAL, Molmo2Spec, forward, load_weights, vision_features
from driftscope.families.molmo2.emitter.layers import Contract, bicubic_matrix, resize_positions
from driftscope.families.molmo2.emitter.stages import run_blockwise, substage_function
from molmo2_support import checkpoint_dirs, config, max_abs, reference_taps, shapes_inputs

SIZES = [224, pytest.param(448, marks=pytest.mark.slow)]


@functools.cache
def spec_and_weights():
    spec = Molmo2Spec.from_config(config("hub"))
    return spec, load_weights(checkpoint_dirs()["hub"], spec)


@functools.cache
def jax_taps(size: int) -> dict[str, np.ndarray]:
    spec, weights = spec_and_weights()
    inputs = shapes_inputs(size)
    out = run_blockwise(
        weights,
        inputs.pixel_values,
        inputs.pooling,
        inputs.input_ids,
        inputs.mm_token_type_ids,
        spec=spec,
        contract=Contract(),
    )
    return {name: np.asarray(value) for name, value in out.items()}


def test_spec_resolves_the_hub_layers_against_the_declared_depth():
    spec, weights = spec_and_weights()
    assert spec.selected_layers == (24, 18) and spec.execution_depth == 25
    assert "vit.layers.24.mlp.fc2.weight" in weights and "vit.layers.25.norm1.weight" not in weights
    assert weights["text.embed.weight"].shape == (640, 64)


@pytest.mark.parametrize("size", SIZES)
def test_every_stage_matches_transformers_f32(size):
    ours, reference = jax_taps(size), reference_taps(size)
    assert sorted(ours) == sorted(reference)
    worst = {stage: max_abs(ours[stage], reference[stage]) for stage in reference}
    assert all(ours[s].shape == reference[s].shape for s in reference)
    failing = {stage: error for stage, error in worst.items() if not error < 1e-4}
    assert not failing, failing
    np.testing.assert_array_equal(ours["pool.valid_counts"], reference["pool.valid_counts"])
    tokens = {224: 392, 448: 725}[size]
    assert ours[FINAL].shape == (tokens, 64) and ours["pool.gathered"].shape == (tokens, 4, 64)
    assert ours["text.embeds.image"].shape == (tokens, 64)


def test_selected_layers_are_concatenated_in_configured_order():
    ours = jax_taps(224)
    np.testing.assert_array_equal(ours["vision.concatenated"][..., :32], ours["vision.block.24"])
    np.testing.assert_array_equal(ours["vision.concatenated"][..., 32:], ours["vision.block.18"])


@pytest.mark.slow  # compiles the 25 unrolled blocks at once (~10 s)
def test_whole_graph_equals_the_blockwise_runner():
    spec, weights = spec_and_weights()
    inputs = shapes_inputs(224)
    whole = jax.jit(functools.partial(forward, spec=spec, contract=Contract(), taps=("vision.block.3.mlp.act",)))
    out = whole(weights, inputs.pixel_values, inputs.pooling, inputs.input_ids, inputs.mm_token_type_ids)
    blockwise = jax_taps(224)
    for stage in ("vision.block.3.mlp.act", FINAL, "text.logits.last"):
        assert max_abs(out[stage], blockwise[stage]) < 1e-5, stage


def test_substage_functions_replay_their_stage():
    spec, weights = spec_and_weights()
    taps = jax_taps(224)
    w = {k[len("vit.layers.7.") :]: v for k, v in weights.items() if k.startswith("vit.layers.7.")}
    s = "vision.block.7."
    inputs = {
        "norm1": (taps["vision.block.6"],),
        "attn.context": (taps[s + "attn.q"], taps[s + "attn.k"], taps[s + "attn.v"]),
        "residual1": (taps["vision.block.6"], taps[s + "attn.out"]),
        "mlp.act": (taps[s + "mlp.fc1"],),
        "mlp.fc2": (taps[s + "mlp.act"],),
    }
    for kind, args in inputs.items():
        assert max_abs(substage_function(kind, spec, Contract())(w, *args), taps[s + kind]) < 1e-5, kind


def test_without_mm_token_type_ids_the_mask_is_causal_and_the_logits_move():
    spec, weights = spec_and_weights()
    inputs = shapes_inputs(224)
    causal = run_blockwise(
        weights, inputs.pixel_values, inputs.pooling, inputs.input_ids, None, spec=spec, contract=Contract()
    )
    assert max_abs(causal["text.logits.last"], jax_taps(224)["text.logits.last"]) > 1e-2


@pytest.mark.parametrize("source,target", [(27, 27), (27, 14), (27, 40), (5, 8)])
def test_bicubic_positions_match_torch(source, target):
    import torch

    table = np.random.default_rng(0).standard_normal((source * source, 6)).astype(np.float32)
    ours = np.asarray(resize_positions(table, source, (target, target)))
    grid = torch.from_numpy(table).reshape(1, source, source, 6).permute(0, 3, 1, 2)
    theirs = torch.nn.functional.interpolate(grid, size=(target, target), mode="bicubic", align_corners=False)
    expected = theirs[0].permute(1, 2, 0).reshape(-1, 6).numpy()
    np.testing.assert_allclose(ours, expected, atol=1e-5)  # torch's coefficients are float32
    assert np.allclose(bicubic_matrix(source, target).sum(axis=1), 1.0, atol=1e-6)


@pytest.mark.slow
def test_iree_vision_pooling_projector_matches_jax(tmp_path):
    """Lowered with weights and index tensors as arguments, compiled for llvm-cpu, run by iree.runtime."""
    from driftscope.compiled.graph import lower_function
    from driftscope.compiled.iree import IreeModule, compile_graph
    from driftscope.precision import get_policy

    spec, weights = spec_and_weights()
    vision = {k: v for k, v in weights.items() if not k.startswith("text.")}
    inputs = shapes_inputs(224)
    pooling = inputs.pooling.astype(np.int32)  # JAX without x64 lowers index tensors as i32
    taps = ("vision.block.0", "vision.selected.18", "pool.valid_counts", "pool.query", "pool.output")
    jitted = jax.jit(functools.partial(vision_features, spec=spec, contract=Contract(), taps=taps))
    jitted.__name__ = "molmo2_vision_features"
    graph = lower_function(jitted, (vision, inputs.pixel_values, pooling), get_policy("f32"))
    assert "stablehlo" in graph.text and graph.output_names == sorted(set(taps) | {FINAL})
    artifact = compile_graph(graph, "llvm-cpu", cache_dir=tmp_path)
    module = IreeModule(artifact, graph.output_names)
    arguments = [vision[name] for name in sorted(vision)] + [inputs.pixel_values, pooling]
    out = module(arguments)
    expected = jax_taps(224)
    for name in graph.output_names:
        assert out[name].shape == expected[name].shape, name
        assert max_abs(out[name], expected[name]) < 1e-4, (name, max_abs(out[name], expected[name]))
    np.testing.assert_array_equal(out["pool.valid_counts"], expected["pool.valid_counts"])
    # the index tensors are arguments: other pooling indices give other features from the same module
    shuffled = pooling[::-1].copy()
    moved = module([vision[name] for name in sorted(vision)] + [inputs.pixel_values, shuffled])
    np.testing.assert_allclose(moved[FINAL], out[FINAL][::-1], atol=1e-5)
