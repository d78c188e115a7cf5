"""Qwen3-VL-MoE's sparse MLP in JAX and compiled by IREE against the transformers f32 oracle (issue 32 item 1).

Each sparse layer of the tiny fixture, fed the oracle's own post-attention norm: the router's logits, the
routing weights, each chosen expert's output and the weighted sum within 1e-4 of transformers', the chosen
experts equal; the same graph lowered to StableHLO, compiled by iree-compile (llvm-cpu) and run by
iree.runtime gives the same.
"""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.families import get_family

NAME = "qwen3_vl_moe"
PIECES = ("mlp.router", "mlp.chosen", "mlp.weights", "mlp.experts", "mlp")


def _layers():
    from driftscope.families.checkpoints import open_checkpoint
    from driftscope.families.qwen3_vl_moe.jax.text import MoeSpec, load_moe_weights

    checkpoint = open_checkpoint(get_family(NAME).tiny.ensure())
    spec = MoeSpec.from_config(checkpoint.config)
    assert spec.layers and spec.experts == 4 and spec.top_k == 2
    return spec, {layer: load_moe_weights(checkpoint.path, spec, layer) for layer in spec.layers}


def _check(out: dict, oracle, layer: int) -> None:
    for piece in PIECES:
        expected = np.asarray(oracle[f"text.layer.{layer}.{piece}"])
        got = np.asarray(out[piece])
        if piece == "mlp.chosen":
            np.testing.assert_array_equal(got.astype(np.int64), expected, err_msg=piece)
        else:
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4, err_msg=piece)


def test_the_jax_sparse_mlp_matches_the_oracle(runs):
    import jax
    from driftscope.families.qwen3_vl_moe.jax.text import sparse_mlp
    from driftscope.taps.jax.layers import Contract

    _, oracle = runs(NAME, "transformers")
    spec, weights = _layers()
    run = jax.jit(lambda w, x: sparse_mlp(Contract(), w, x, spec))
    for layer, w in weights.items():
        _check(run(w, np.asarray(oracle[f"text.layer.{layer}.mlp.in"], np.float32)), oracle, layer)


@pytest.mark.parametrize("layer_position", [0, -1])
def test_the_iree_compiled_sparse_mlp_matches_the_oracle(runs, tmp_path, layer_position):
    import jax
    from driftscope.capture.iree import IreeModule, compile_graph
    from driftscope.families.qwen3_vl_moe.jax.text import sparse_mlp
    from driftscope.model.policies import get_policy
    from driftscope.taps.jax.graph import lower_function
    from driftscope.taps.jax.layers import Contract

    _, oracle = runs(NAME, "transformers")
    spec, weights = _layers()
    layer = spec.layers[layer_position]
    x = np.asarray(oracle[f"text.layer.{layer}.mlp.in"], np.float32)

    def sparse(w, x):
        return sparse_mlp(Contract(), w, x, spec)

    graph = lower_function(jax.jit(sparse), (weights[layer], x), get_policy("f32"))
    module = IreeModule(compile_graph(graph, cache_dir=tmp_path), graph.output_names)
    _check(module([*jax.tree_util.tree_leaves(weights[layer]), x]), oracle, layer)
