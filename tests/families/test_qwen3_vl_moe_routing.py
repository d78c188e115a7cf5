"""Qwen3-VL-MoE: a token routed to another expert is a finding of its own (issue 32 item 1).

A candidate whose router favours one expert by a hair (``shift_router``, far inside the contract's tolerance on
the logits) sends the few tokens nearest the top-k boundary to that expert: the run's chosen-experts stage,
compared exactly, is the pair's first divergence, with exactly the entries the reference's own logits predict,
and the rerouted tokens carry that layer's expert-mixture error.
"""

from __future__ import annotations

import numpy as np
import yaml
from conftest import ROOT
from driftscope.families import get_family

NAME = "qwen3_vl_moe"


def _smallest_flip(logits: np.ndarray, top_k: int) -> tuple[int, float]:
    """(expert, shift): the expert and the smallest logit shift that routes at least one more token to it."""
    best = (0, np.inf)
    ordered = np.sort(logits, axis=-1)
    for expert in range(logits.shape[1]):
        outside = logits[:, expert] < ordered[:, -top_k]
        gaps = ordered[outside, -top_k] - logits[outside, expert]
        if gaps.size and gaps.min() < best[1]:
            best = (expert, float(gaps.min()))
    return best


def _choice(logits: np.ndarray, top_k: int) -> np.ndarray:
    return np.sort(np.argsort(-logits, axis=-1, kind="stable")[:, :top_k], axis=-1)


def test_a_token_routed_to_another_expert_is_the_first_divergence(tmp_path, runs):
    from driftscope.cli import main
    from driftscope.families.qwen3_vl_moe.routing import rerouted
    from driftscope.judge.rows import first_divergence
    from driftscope.run.report import Report

    family = get_family(NAME)
    _, oracle = runs(NAME, "transformers")
    layers = [int(s.split(".")[2]) for s in oracle.stage_ids() if s.endswith(".mlp.router")]
    top_k = np.asarray(oracle[f"text.layer.{layers[0]}.mlp.chosen"]).shape[1]
    flips = {i: _smallest_flip(np.asarray(oracle[f"text.layer.{i}.mlp.router"], np.float64), top_k) for i in layers}
    layer = min(flips, key=lambda i: flips[i][1])  # the sparse layer with a token nearest its routing boundary
    expert, gap = flips[layer]
    stage = f"text.layer.{layer}.mlp"
    logits = np.asarray(oracle[f"{stage}.router"], dtype=np.float64)
    shift = 1.5 * gap
    assert shift < 0.04, "the fixture should have a token near a routing boundary (default atol: 0.08)"
    shifted = logits.copy()
    shifted[:, expert] += shift
    expected = _choice(shifted, top_k)
    np.testing.assert_array_equal(_choice(logits, top_k), np.asarray(oracle[f"{stage}.chosen"]))
    moved = int((expected != np.asarray(oracle[f"{stage}.chosen"])).sum())
    assert moved >= 1

    patch = {
        "callable": "driftscope.hypotheses:shift_router",
        "kwargs": {"layer": layer, "expert": expert, "shift": shift},
    }
    params = tmp_path / "p.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "name": "moe-routing",
                "checkpoint": str(family.tiny.ensure()),
                "images": [str(image) for image in family.tiny.images],
                "runtimes": [
                    {"runtime": "transformers", "policy": "f32"},
                    {"runtime": "transformers", "policy": "f32", "label": "rerouted", "patch": patch},
                ],
                "contract": str(ROOT / "parameters" / "contracts" / "default.yaml"),
                "text": {"max_new_tokens": 4},
                "notebooks": [],
            }
        )
    )
    main(["run", str(params), "--out", str(tmp_path / "run"), "--no-gate"])
    report = Report.load(tmp_path / "run")
    pair = report.pair_keys()[0]
    rows = [row for row in report.rows if row.pair == pair]
    by_stage = {row.stage: row for row in rows}
    assert by_stage[f"{stage}.router"].status == "pass"  # the logits moved by a hair, inside the tolerance
    chosen = by_stage[f"{stage}.chosen"]
    assert chosen.status == "fail" and chosen.integer and chosen.failures == moved, chosen
    assert first_divergence(rows).stage == f"{stage}.chosen"
    reference, candidate = report.pair_tapsets(pair)
    np.testing.assert_array_equal(np.asarray(candidate[f"{stage}.chosen"]), expected)

    # the finding: which tokens went elsewhere, and that they carry the layer's expert-mixture error
    finding, *downstream = rerouted(reference, candidate)  # later layers may reroute in turn: their inputs moved
    assert all(later.layer > layer for later in downstream)
    moved_tokens = np.flatnonzero((expected != np.asarray(oracle[f"{stage}.chosen"])).any(axis=-1))
    assert finding.layer == layer and finding.tokens == tuple(moved_tokens) and finding.entries == moved
    assert finding.explained > 0.99, finding.sentence()  # the shift alone barely moves the other tokens' weights
