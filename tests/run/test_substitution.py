"""Which side caused the answer's divergence (substitution at the vision/text boundary) and the three-way verdict
with a half-precision peer, on planted defects against transformers f32 (tiny Qwen2.5-VL, 4 tokens)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from conftest import ROOT
from driftscope.capture.patches import parse_patch
from driftscope.capture.runtimes import get_runtime
from driftscope.judge.contract import Contract
from driftscope.judge.forced import FORCED, forced_pair
from driftscope.judge.three_way import half_peer, three_way
from driftscope.run.substitution import substitution

NAME = "qwen2_5_vl"
PATCHES = str(ROOT / "tests" / "planted_patches.py")
TOWER = {
    "callable": "driftscope.families.qwen2_5_vl.hypotheses:scale_block_output",
    "kwargs": {"block": 1, "factor": 8.0},
}
TEXT = {"callable": f"{PATCHES}:scale_text_layer", "kwargs": {"layer": 0, "factor": 4.0}}
SLOT = {"callable": f"{PATCHES}:cache_one_slot_off", "kwargs": {"layer": 1, "from_step": 1}}


@pytest.fixture(scope="module")
def forced(tiny, runs, tmp_path_factory):
    """(runtime, policy, patch) -> (runtime object, TapSet fed the oracle's greedy tokens)."""
    out, done = tmp_path_factory.mktemp("substitution"), {}
    checkpoint, inputs, plan = tiny(NAME)
    _, reference = runs(NAME, "transformers")
    fed = copy.deepcopy(inputs)
    fed.text.forced = np.asarray(reference["text.generate.tokens"], dtype=np.int64)

    def get(name: str, policy: str = "f32", patch: dict | None = None, label: str = ""):
        key = (name, policy, str(patch), label)
        if key not in done:
            runtime = get_runtime(name)(checkpoint, policy, parse_patch(patch), {"label": label or f"{name}:{policy}"})
            done[key] = (runtime, runtime.capture(fed, plan, out / f"run{len(done)}"))
            runtime.release()
        return done[key]

    return get


def _attribute(tiny, runs, forced, name, patch, tmp_path, log=lambda line: None):
    checkpoint, inputs, plan = tiny(NAME)
    reference_runtime, reference = runs(NAME, "transformers")
    runtime, candidate = forced(name, patch=patch)
    contract = Contract()
    pair = {"reference": "ref", "candidate": "cand", "forced": forced_pair(reference, candidate, contract)}
    assert pair["forced"]["first_divergence"] is not None or pair["forced"]["flips"], pair["forced"]
    tapsets = {"ref": reference, "cand": candidate}
    runtimes = {"ref": get_runtime("transformers")(checkpoint, "f32"), "cand": runtime}
    return substitution(pair, runtimes, inputs, tapsets, contract, plan, tmp_path, log)


@pytest.mark.parametrize("name", ["transformers", "mlx"])
def test_a_tower_side_defect_is_explained_by_the_tower(tiny, runs, forced, name, tmp_path):
    said: list[str] = []
    entry = _attribute(tiny, runs, forced, name, TOWER, tmp_path, said.append)
    assert entry["status"] == "done", entry
    # each of the two runs (minutes each on a large model) is announced before it starts, saying what it runs
    assert [line.split(": ", 1)[1].split(" (")[0] for line in said] == [
        "cand's text side on ref's image embeddings",
        "ref's text side on cand's image embeddings",
    ]
    assert all("teacher-forced tokens" in line for line in said)
    assert entry["verdict"] == "tower", entry
    assert entry["candidate_text_on_reference_tower"]["first_divergence"] is None
    assert entry["reference_text_on_candidate_tower"]["first_divergence"] is not None


@pytest.mark.parametrize("name", ["transformers", "mlx"])
def test_a_text_side_defect_is_explained_by_the_text_side(tiny, runs, forced, name, tmp_path):
    entry = _attribute(tiny, runs, forced, name, TEXT, tmp_path)
    assert entry["status"] == "done", entry
    assert entry["verdict"] == "text", entry
    assert entry["reference_text_on_candidate_tower"]["first_divergence"] is None


def test_agreeing_answers_need_no_substitution(tiny, runs, forced, tmp_path):
    checkpoint, inputs, plan = tiny(NAME)
    _, reference = runs(NAME, "transformers")
    pair = {"reference": "ref", "candidate": "cand", "forced": forced_pair(reference, reference, Contract())}
    entry = substitution(pair, {}, inputs, {"ref": reference, "cand": reference}, Contract(), plan, tmp_path)
    assert entry["status"] == "not_needed"


def test_three_way_a_bf16_candidate_costs_what_bf16_costs_and_a_defect_does_not(runs, forced):
    _, reference = runs(NAME, "transformers")
    _, peer = forced("mlx", "bf16", label="mlx:bf16")
    _, twin = forced("mlx", "bf16", label="mlx:bf16-b")
    _, defect = forced("mlx", "bf16", patch=TEXT, label="mlx:bf16-defect")
    tapsets = {"ref": reference, "mlx:bf16": peer, "mlx:bf16-b": twin, "mlx:bf16-defect": defect}
    assert half_peer(tapsets, "ref") == "mlx:bf16"
    result = three_way(tapsets, "ref", "mlx:bf16", Contract())
    same, planted = result["candidates"]["mlx:bf16-b"], result["candidates"]["mlx:bf16-defect"]
    # independent reference: the RMS of the stored forced-logit differences, computed here in full
    r = np.asarray(reference[FORCED], np.float64)
    expected = np.sqrt(np.mean((np.asarray(defect[FORCED], np.float64) - r) ** 2))
    np.testing.assert_allclose(planted["candidate_rmse"], expected, rtol=1e-9)
    assert same["ratio"] == pytest.approx(1.0, abs=0.05) and same["overlap"] > 0.9
    assert same["verdict"] == "half-precision"
    assert planted["ratio"] > 20 and planted["verdict"] == "something else", planted


def _cache_rms(tapset, reference, stage_id: str, layer: int) -> float:
    error = np.asarray(tapset[stage_id], np.float64)[layer] - np.asarray(reference[stage_id], np.float64)[layer]
    return float(np.sqrt(np.mean(error**2)))


def test_three_way_the_kv_cache_against_the_half_precision_peers_own_cache_errors(runs, forced, tmp_path):
    """The KV half of the three-way: a bf16 twin's cache costs what bf16 costs; a bf16 run whose layer-1 cache
    entries are written one slot late from decode step 1 on is something else from layer 1 (layer 0 stays what
    bf16 costs); a tower defect (every image row's embedding changed) from layer 0. Said in notebook 06's line
    for the candidate. (A decoder layer's output scaled is no cache defect: the next layer's keys and values come
    after its RMSNorm, which the scale leaves alone.)"""
    from driftscope.run.report import Report
    from driftscope.views.explain import answer_sentences, three_way_frame

    _, reference = runs(NAME, "transformers")
    _, peer = forced("mlx", "bf16", label="mlx:bf16")
    _, twin = forced("mlx", "bf16", label="mlx:bf16-b")
    _, slot = forced("mlx", "bf16", patch=SLOT, label="mlx:bf16-slot")
    _, tower = forced("mlx", patch=TOWER)
    tapsets = {"ref": reference, "mlx:bf16": peer, "mlx:bf16-b": twin, "mlx:bf16-slot": slot, "tower": tower}
    result = three_way(tapsets, "ref", "mlx:bf16", Contract())
    same, planted, towered = (result["candidates"][k]["cache"] for k in ("mlx:bf16-b", "mlx:bf16-slot", "tower"))
    assert same["verdict"] == "half-precision" and same["first_layer"] is None and same["ratio"] == pytest.approx(1)
    assert same["overlap"] == pytest.approx(1.0) and "KV cache's error is within what bfloat16 costs" in same["text"]
    assert planted["verdict"] == "something else" and planted["first_layer"] == 1, planted["text"]
    assert towered["verdict"] == "something else" and towered["first_layer"] == 0, towered["text"]
    stage = "text.cache.forced.keys"
    layers = planted["stages"][stage]["layers"]
    tolerance = Contract().tolerance(stage)
    for layer in (0, 1):  # independent reference: the RMS of the stored cache differences, layer by layer
        own, half = _cache_rms(slot, reference, stage, layer), _cache_rms(peer, reference, stage, layer)
        np.testing.assert_allclose([layers[layer]["candidate_rmse"], layers[layer]["peer_rmse"]], [own, half])
        assert layers[layer]["within"] == (own <= tolerance.peer_factor * half + tolerance.peer_floor)
    assert layers[0]["within"] and not layers[1]["within"]
    assert "its KV cache's error is something else from layer 1" in planted["text"]

    report = Report(tmp_path / "report.json", {"answer": {"reference": "ref", "three_way": result, "pairs": []}})
    pair = {"reference": "ref", "candidate": "mlx:bf16-slot", "first_difference": None}
    report.data["answer"]["pairs"] = [
        {**pair, "forced": forced_pair(reference, slot, Contract())},
        {**pair, "candidate": "mlx:bf16", "forced": forced_pair(reference, peer, Contract())},
    ]
    line, peer_line = answer_sentences(report)
    assert "three-way: the half-precision peer the other candidates are set against" in peer_line
    assert "three-way: mlx:bf16-slot's forced-logit error is" in line, line
    assert "and its KV cache's error is something else from layer 1 (keys: " in line and "mlx:bf16's)" in line, line
    frame = three_way_frame(report).set_index("candidate")
    assert frame.loc["mlx:bf16-b", "KV cache verdict"] == "within what bfloat16 costs"  # never "half-precision"
    assert frame.loc["mlx:bf16-slot", "KV cache verdict"] == "something else from layer 1"


@pytest.mark.parametrize("compiled", ["jax", pytest.param("iree", marks=pytest.mark.slow)])
def test_the_compiled_path_reads_substituted_embeddings_and_a_tower_defect_stays_the_towers(
    tiny, runs, forced, compiled, tmp_path
):
    """JAX (or IREE) as the reference of a pair whose candidate (MLX) has a planted tower defect: its text side
    must take the candidate's merged image embeddings (its substituted run's ``text.embeds.image`` is exactly
    those rows) and diverge on them, while MLX's text side on its tower agrees: the tower explains it."""
    from driftscope.taps.tapset import TapSet

    checkpoint, inputs, plan = tiny(NAME)
    _, reference = runs(NAME, compiled)
    runtime, candidate = forced("mlx", patch=TOWER)
    contract = Contract()
    pair = {"reference": compiled, "candidate": "cand", "forced": forced_pair(reference, candidate, contract)}
    assert pair["forced"]["first_divergence"] is not None or pair["forced"]["flips"], pair["forced"]
    runtimes = {compiled: get_runtime(compiled)(checkpoint, "f32"), "cand": runtime}
    assert runtimes[compiled].substitutes
    tapsets = {compiled: reference, "cand": candidate}
    entry = substitution(pair, runtimes, inputs, tapsets, contract, plan, tmp_path)
    assert entry["status"] == "done" and entry["verdict"] == "tower", entry
    substituted = TapSet(tmp_path / entry["reference_text_on_candidate_tower"]["tapset"])
    np.testing.assert_array_equal(
        np.asarray(substituted["text.embeds.image"]), np.asarray(candidate["text.embeds.image"], np.float32)
    )
    assert not np.array_equal(np.asarray(reference["text.embeds.image"]), np.asarray(candidate["text.embeds.image"]))
