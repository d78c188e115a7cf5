"""The Qwen3-VL vision tower lowered to StableHLO (weights as arguments), compiled by iree-compile
(llvm-cpu) and run by iree.runtime, against the same function on JAX f32 and against transformers f32."""

from __future__ import annotations

import numpy as np
from qwen3_vl_support import TOLERANCE, case, checkpoint_dir, config, reference

TAPS = ("vision.positioned", "vision.block.0.attn.context", "vision.block.3", "vision.deepstack.1.norm")


def test_iree_llvm_cpu_matches_jax_and_transformers_f32(tmp_path):
    import jax
    from driftscope.compiled.graph import contract_for, lower_function
    from driftscope.compiled.iree import IreeModule, compile_graph
    from driftscope.families.qwen3_vl.emitter import VisionSpec, load_vision_weights, vision_tower
    from driftscope.families.qwen3_vl.geometry import pack_bucket
    from driftscope.precision import get_policy

    spec, policy = VisionSpec.from_config(config()), get_policy("f32")
    weights = load_vision_weights(checkpoint_dir(), spec)
    c = case("224")
    bucket = pack_bucket(c.grid_thw, spec.grid_side)

    def qwen3_vl_vision_f32(weights, pixel_values, interp_indices, interp_weights, positions, segments):
        return vision_tower(
            weights, pixel_values, interp_indices, interp_weights, positions, segments,
            spec=spec, contract=contract_for(policy), taps=TAPS,
        )  # fmt: skip

    jitted = jax.jit(qwen3_vl_vision_f32, keep_unused=True)
    args = (weights, c.pixel_values, *bucket.graph_inputs().values())
    graph = lower_function(jitted, args, policy)
    signature = graph.text.split("func.func public @main(")[1].split("->")[0]
    assert signature.count("%arg") == len(weights) + 5  # every weight is an argument, not a constant
    expected_outputs = sorted(
        TAPS + ("vision.merger", "vision.deepstack.0", "vision.deepstack.1", "vision.deepstack.2")
    )
    assert graph.output_names == expected_outputs
    artifact = compile_graph(graph, "llvm-cpu", tmp_path / "cache")
    out = IreeModule(artifact, graph.output_names)(jax.tree_util.tree_leaves(args))
    expected = {k: np.asarray(v) for k, v in jitted(*args).items()}
    for name in graph.output_names:
        assert out[name].shape == expected[name].shape
        assert np.abs(out[name] - expected[name]).max() < TOLERANCE, name
        assert np.abs(out[name] - reference("224")[name]).max() < TOLERANCE, name
    assert np.abs(expected["vision.merger"]).max() > 0.5  # a real output, not zeros
