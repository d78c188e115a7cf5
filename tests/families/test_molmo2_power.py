"""Molmo2's mutations on the tiny fixture (planted in mlx-vlm with its three defects patched): under the
float32 contract every one is first seen at the stage it declares, except the SiLU by division, which equals
x * sigmoid(x) to float32 round-off and says so (the default contract's power over the same fixture is
tests/families/test_families.py's); each declares itself blind, with the reason, where an input cannot reveal it."""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.families.molmo2.mutations import MUTATIONS
from driftscope.taps.stages import StagePlan
from molmo2_support import F32, capture, checkpoint, inputs, plan, scratch

EXPECTED = {
    "layers_after_truncation": "vision.selected.24",
    "layers_concatenated_reversed": "vision.selected.24",
    "pool_mean_over_all_slots": "pool.query",
    "padding_index_clamped": "pool.gathered",
    "silu_by_division": None,  # x / (1 + exp(-x)) equals x * sigmoid(x) to float32 round-off: explained
    "exact_gelu_vit": "vision.block.0.mlp.act",
    "causal_image_mask": "text.attention_mask",
}
#: Blind on the 224 px image, which takes one high-resolution crop (the low-resolution crop pixel for pixel).
BLIND_AT_224 = {"crops_reversed": "one high-resolution crop"}


@pytest.mark.slow  # eight mutated captures of the whole plan; the default contract's audit is test_families'
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
        capture=family_power_capture("molmo2"),
    )
    found = {entry["mutation"]: entry for entry in power["mutations"]}
    assert sorted(found) == sorted([*EXPECTED, *BLIND_AT_224]) == MUTATIONS.names()
    for name, reason in BLIND_AT_224.items():
        assert not found[name]["detected"] and reason in found[name]["blind_reason"], found[name]
    for name, stage in EXPECTED.items():
        entry = found[name]
        if stage is None:
            assert not entry["detected"] and "inside the contract" in entry["blind_reason"], entry
            assert max(row["max_abs"] for row in entry["rows"] if row["stage"].startswith("projector.")) < 1e-5
            continue
        assert entry["detected"] and entry["first_divergence"] == stage == entry["declared_stage"], entry


def test_each_mutation_says_why_an_input_cannot_reveal_it():
    full = plan()
    for name in EXPECTED:
        assert MUTATIONS.get(name).blind(inputs("224"), full) is None, name
    vision = StagePlan(full.family, [s for s in full if not s.id.startswith("text.")], full.depth, full.meta)
    assert "does not follow a prompt" in MUTATIONS.get("causal_image_mask").blind(inputs("224"), vision)
    one = StagePlan(full.family, list(full), full.depth, {**full.meta, "selected_layers": [24]})
    assert "one selected layer" in MUTATIONS.get("layers_concatenated_reversed").blind(inputs("224"), one)
    positive = StagePlan(full.family, list(full), full.depth, {**full.meta, "configured_layers": [24, 18]})
    assert "same layers" in MUTATIONS.get("layers_after_truncation").blind(inputs("224"), positive)
    unpadded = type(inputs("224"))(
        {**inputs("224").arrays, "pooling": np.maximum(inputs("224")["pooling"], 0)},
        [],
        [],
        inputs("224").image_tokens,
        inputs("224").facts,
    )
    for name in ("pool_mean_over_all_slots", "padding_index_clamped"):
        assert "no padding slots" in MUTATIONS.get(name).blind(unpadded, full)
    assert (np.asarray(inputs("224")["pooling"]) < 0).any()  # the 224 px image has padded pooling windows
    for name, reason in BLIND_AT_224.items():
        assert reason in MUTATIONS.get(name).blind(inputs("224"), full)
        assert MUTATIONS.get(name).blind(inputs("448"), full) is None, name
