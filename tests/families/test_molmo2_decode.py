"""Molmo2's compiled path decodes: the JAX emitter (XLA and IREE llvm-cpu) prefills, then runs one decode-step
graph against a fixed-capacity cache, and its greedy tokens and per-step top-2 margins equal transformers f32's on
the tiny fixture at 224 px; ``decode: false`` stops at the prefill."""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.capture.runtimes import get_runtime
from molmo2_support import MAX_NEW_TOKENS, TOLERANCE, capture, checkpoint, inputs, plan, scratch


@pytest.mark.parametrize("runtime", ["jax", "iree"])
def test_the_compiled_path_decodes_the_oracles_greedy_tokens(runtime):
    assert get_runtime(runtime).decodes_with("molmo2")
    reference, candidate = capture("transformers", "224"), capture(runtime, "224")
    tokens = np.asarray(candidate["text.generate.tokens"])
    assert tokens.shape == (MAX_NEW_TOKENS,)
    np.testing.assert_array_equal(tokens, reference["text.generate.tokens"])
    # each step's top-1 minus top-2 logit: the decode steps' logits, not only their argmax, agree
    margins, expected = np.asarray(candidate["text.generate.margins"]), np.asarray(reference["text.generate.margins"])
    assert np.max(np.abs(margins - expected)) < TOLERANCE, (margins, expected)


def test_decode_false_stops_at_the_prefill():
    engine = get_runtime("jax")(checkpoint(), "f32", options={"decode": False})
    tapset = engine.capture(inputs("224"), plan(), scratch() / "hub" / "224" / "jax-no-decode")
    engine.release()
    assert "text.logits.last" in tapset and "text.layer.0" in tapset
    assert not {"text.generate.tokens", "text.generate.margins"} & set(tapset.stage_ids())
