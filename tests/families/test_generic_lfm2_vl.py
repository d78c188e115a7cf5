"""LFM2-VL through the generic family, as the sweep runs it (transformers f32 vs mlx f32, strict): a hybrid text
model (convolution layers beside attention layers) and a vision tower whose mlx-vlm modules return their output
among other arrays. Both are the generic pipeline's to read right; with them read right, the model type passes."""

from __future__ import annotations

import pytest
from generic_sweep_support import investigate_sweep, rows, verdict


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    # the KV cache of every candidate (taken only where an answer is in question by default)
    return investigate_sweep("lfm2_vl", tmp_path_factory.mktemp("lfm2_vl"), forced="always")


def _sidecar(report, label: str) -> dict:
    from driftscope.taps.tapset import TapSet

    entry = next(entry for entry in report.data["runtimes"] if entry["label"] == label)
    return TapSet(report.folder / entry["tapset"]).meta


def test_the_kv_cache_holds_the_attention_layers_only_on_both_sides(report):
    """The tester's text model has one attention layer (``full_attn_idxs: [0]``) and one convolution layer, whose
    cache (transformers' ``LinearAttentionLayer``, mlx-vlm's ``ArraysCache``) holds no keys: the cache stages hold
    layer 0 alone, say so, and agree."""
    found = rows(report)
    for stage in ("text.cache.prefill.keys", "text.cache.prefill.values", "text.cache.forced.keys"):
        assert found[stage]["status"] == "pass", found[stage]
        assert found[stage]["reference_shape"][0] == 1  # one layer: the attention one
        assert found[stage]["reference_shape"] == found[stage]["candidate_shape"]
    for label in ("transformers:f32", "mlx:f32"):
        stages = _sidecar(report, label)["stages"]
        assert stages["text.cache.prefill.keys"]["decoder_layers"] == [0]
        assert "attention layers only" in stages["text.cache.prefill.keys"]["description"]


def test_a_tower_module_returning_its_hidden_states_is_read_at_its_output(report):
    """mlx-vlm's LFM2-VL encoder returns ``(embeddings, hidden_1, hidden_2)`` and its tower ``(hidden_states, x,
    last_hidden_state)``: the probe records where each returns its output (what the last module under it
    returned), and both stages pass where the first array (the embeddings) failed with relative RMS 0.95."""
    meta = report.data["plan_meta"]["generic"]["stages"]
    assert meta["vision.encoder"]["mlx_item"] == [2]
    assert meta["vision.output"]["mlx_item"] == [2]
    found = rows(report)
    for stage in ("vision.encoder", "vision.output"):
        assert found[stage]["status"] == "pass", found[stage]
        assert found[stage]["max_abs"] < 1e-5


def test_lfm2_vl_passes_at_every_aligned_stage(report):
    assert verdict(report) == "pass"
