"""Qwen3-VL-MoE: a token routed to another expert is a finding of its own (issue 32 item 1).

A candidate whose router favours one expert by a hair (``shift_router``, far inside the contract's tolerance on
the logits) sends the few tokens nearest the top-k boundary to that expert: the run's chosen-experts stage,
compared exactly, is the pair's first divergence, with exactly the entries the reference's own logits predict,
and the rerouted tokens carry that layer's expert-mixture error.
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from conftest import ROOT
from driftscope.families import get_family

NAME = "qwen3_vl_moe"


def problems(page: str) -> list[str]:
    """The clean-text checker of rendered pages (``tests/views/clean_text.py``) on ``page``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("clean_text", ROOT / "tests" / "views" / "clean_text.py")
    checker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checker)
    return checker.problems(page)


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


@pytest.fixture(scope="module")
def rerouted_run(tmp_path_factory, runs):
    """A run of the oracle against itself with the router of its sparse layer nearest a routing boundary shifted
    by 1.5x the smallest logit gap: (run directory, layer, expected choice, moved entries, the oracle's TapSet)."""
    tmp_path = tmp_path_factory.mktemp("rerouted")
    from driftscope.cli import main

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
    return tmp_path / "run", layer, expected, moved, oracle


def test_a_token_routed_to_another_expert_is_the_first_divergence(rerouted_run):
    from driftscope.families.qwen3_vl_moe.pages import rerouted
    from driftscope.judge.rows import first_divergence
    from driftscope.run.report import Report

    run, layer, expected, moved, oracle = rerouted_run
    stage = f"text.layer.{layer}.mlp"
    report = Report.load(run)
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


def test_the_pages_router_section_names_the_rerouted_tokens_and_their_share_of_the_error(rerouted_run):
    """Notebook 01's and 02's router section (``views/choices.py``): one row per rerouted layer, the first one the
    shifted layer with its tokens, entries and the share of its error; words only (the clean-text checker); a
    model without a router gets no section."""
    from driftscope.families.qwen3_vl_moe.pages import rerouted
    from driftscope.run.report import Report
    from driftscope.views.choices import choice_items, choice_rows

    run, layer, expected, moved, oracle = rerouted_run
    report = Report.load(run)
    found = rerouted(*report.pair_tapsets(report.pair_keys()[0]))
    rows, lines = choice_rows(report)
    assert lines == [] and len(rows) == len(found) >= 1
    first = rows[0]
    tokens = int(np.asarray(oracle[f"text.layer.{layer}.mlp.chosen"]).shape[0])
    assert first["text layer"] == layer and first["where"] == "first rerouted layer"
    assert (
        first["tokens rerouted"] == f"{len(found[0].tokens)} of {tokens}" and first["chosen entries differing"] == moved
    )
    assert first["share of the layer's error"] == f"{found[0].explained:.0%}"
    assert first["positions"].startswith(str(found[0].tokens[0]))
    assert all(row["where"] == "inputs already moved" for row in rows[1:])
    heading, frame = choice_items(report)
    page = f"<div>{heading.data}</div>{frame.data}"
    assert "## Router choices" in heading.data and not problems(page), problems(page)

    # the same pair against itself: the line says every token chose the reference's experts
    layers = sum(s.endswith(".mlp.chosen") for s in oracle.stage_ids())
    report.data["pairs"] = [{**report.data["pairs"][0], "candidate": report.data["pairs"][0]["reference"]}]
    rows, lines = choice_rows(report)
    assert rows == [] and lines[0].endswith(f"every token chose the reference's experts in {layers} sparse layers")


def test_a_model_without_a_router_has_no_router_section():
    from types import SimpleNamespace

    from driftscope.views.choices import choice_items

    for family in ("qwen2_5_vl", "qwen3_vl", "molmo2"):
        assert choice_items(SimpleNamespace(data={"family": family})) == [], family


@pytest.mark.slow
def test_the_rendered_pages_show_the_router_section_in_words(rerouted_run, tmp_path):
    """Notebooks 01 and 02 executed on the rerouted run: the router section is on both pages, and the pages pass
    the clean-text checker."""
    from driftscope.run.report import Report
    from driftscope.views.execution import execute
    from driftscope.views.pages import to_html

    run = rerouted_run[0]
    params = {"params_path": Report.load(run).data["parameters_file"], "out_dir": str(run), "reuse": True}
    for name in ("01_stage_parity", "02_layer_drilldown"):
        to_html(execute(name, tmp_path, params, cwd=ROOT, log_output=False))
        page = (tmp_path / f"{name}.nocode.html").read_text(encoding="utf-8")
        assert "Router choices" in page and "first rerouted layer" in page, name
        assert not problems(page), (name, problems(page))
