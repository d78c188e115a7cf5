"""Past the vision tower: merged embeddings, M-RoPE, text layers, prefill logits, greedy tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import ROOT, SHAPES, TINY
from driftscope.run.investigation import investigate
from driftscope.run.params import parse_parameters

RUNTIMES = ["transformers:f32", "mlx:f32", "jax:f32", "iree:f32"]
#: a text-side planted defect that flips the answer: MLX's decoder layer 0 output doubled (the tower untouched)
PLANTED = "mlx-planted"
PLANTED_RUNTIME = {
    "runtime": "mlx",
    "label": PLANTED,
    "patch": {"callable": str(ROOT / "tests" / "planted_patches.py") + ":scale_text_layer", "kwargs": {"factor": 2.0}},
}


def _data(runtimes, **extra):
    return {
        "name": "answer",
        "checkpoint": str(TINY),
        "images": [str(SHAPES)],
        "runtimes": runtimes,
        "stages": {"blocks": True},
        "replay": False,
        "text": {"max_new_tokens": 16, "expect": ["square", "circle"]},
        **extra,
    }


def _params(runtimes, **extra):
    return parse_parameters(_data(runtimes, **extra), "test")


@pytest.fixture(scope="module")
def answered(tmp_path_factory, tiny_checkpoint_dir):
    import yaml
    from driftscope.cli import main
    from driftscope.run.report import Report

    out = tmp_path_factory.mktemp("answer")
    params = out / "answer.yaml"
    params.write_text(yaml.safe_dump(_data([*RUNTIMES, PLANTED_RUNTIME], notebooks=["06_answer_parity"])))
    assert main(["run", str(params), "--out", str(out / "run"), "--no-gate"]) == 0
    return Report.load(out / "run" / "report.json"), out / "run"


def test_every_runtime_agrees_on_the_prefill_top1_and_on_16_greedy_tokens(answered):
    report, _ = answered
    rows = {(r.candidate, r.stage): r for r in report.rows}
    for label in RUNTIMES[1:]:
        logits = rows[(label, "text.logits.last")]
        assert logits.status == "pass" and logits.max_abs < 1e-4, label
        assert logits.extra["top1_agree"] and logits.extra["top5_overlap"] == 1.0, label
        for stage in (
            "text.input_ids",
            "text.position_ids",
            "text.rope_deltas",
            "text.rope_delta",
            "text.embeds.text_slots_changed",
        ):
            assert rows[(label, stage)].status == "pass" and rows[(label, stage)].failures == 0, (label, stage)
        assert rows[(label, "text.embeds.image")].max_abs < 1e-4
        assert rows[(label, "text.layer.1.last")].max_abs < 1e-4
    answer = report.data["answer"]
    tokens = {label: entry["tokens"] for label, entry in answer["runtimes"].items()}
    assert set(tokens) == {*RUNTIMES, PLANTED}  # the compiled path decodes too: its own decode graph and cache
    assert len(tokens["transformers:f32"]) == 16
    top1 = {label: entry["prefill_top1"] for label, entry in answer["runtimes"].items()}
    for label in RUNTIMES[1:]:
        assert tokens[label] == tokens["transformers:f32"], label
        pair = next(p for p in answer["pairs"] if p["candidate"] == label)
        assert pair["identical"] and pair["first_difference"] is None, label
        assert top1[label] == top1["transformers:f32"] == tokens["transformers:f32"][0], label
        # every step's top-1 minus top-2 logit, against transformers' cached decode: positions, cache and mask
        margins = rows[(label, "text.generate.margins")]
        assert margins.status == "pass" and margins.max_abs < 1e-4, label


def test_oracle_positions_equal_the_geometry_library(answered):
    from driftscope.families.qwen2_5_vl.geometry import mrope_positions

    report, out = answered
    oracle = report.tapset("transformers:f32")
    ids = np.asarray(oracle["text.input_ids"])
    expected, delta = mrope_positions((ids == 6).astype(int).tolist(), report.data["inputs"]["grid_thw"])
    assert np.array_equal(np.asarray(oracle["text.position_ids"]), expected)
    assert int(np.asarray(oracle["text.rope_deltas"])[0]) == delta


def test_perturbed_image_embeddings_fail_after_the_tower_and_change_the_answer(tmp_path, tiny_checkpoint_dir):
    patch = {"callable": "driftscope.hypotheses:perturb_image_embeddings", "kwargs": {"scale": -2.0}}
    report = investigate(_params(["transformers:f32", {"runtime": "mlx", "patch": patch}]), tmp_path)
    rows = {r.stage: r for r in report.rows}
    assert all(row.status == "pass" for stage, row in rows.items() if stage.startswith(("vision.", "inputs.")))
    assert report.data["first_divergence"]["mlx:f32"]["stage"] == "text.embeds.image"
    assert rows["text.embeds.text"].status == "pass" and rows["text.embeds.text_slots_changed"].failures == 0
    pair = report.data["answer"]["pairs"][0]
    assert not pair["identical"] and pair["first_difference"] is not None
    assert pair["reference_token"] != pair["candidate_token"]
    assert pair["margins_around"][0]["step"] <= pair["first_difference"]


def test_text_slots_that_a_runtime_changes_are_counted():
    from driftscope.families.qwen_shared.text import put_text_inputs
    from driftscope.inputs.text_inputs import TextInputs
    from driftscope.taps.sink import StageSink

    puts = {}

    class Sink:
        def put(self, stage_id, value, **_):
            puts[stage_id] = np.asarray(value)

    inputs = type("I", (), {"text": TextInputs(np.array([1, 6, 6, 2, 3]), 6, "p")})()
    rows = np.arange(20, dtype=np.float32).reshape(5, 4)
    embeds = rows.copy()
    embeds[1:3] = -1.0  # image slots: replaced, as they must be
    embeds[4, 0] += 1.0  # a text slot that should not have changed
    put_text_inputs(inputs, Sink(), embeds, rows, np.zeros((3, 5)), np.zeros(1))
    assert puts["text.embeds.text_slots_changed"].tolist() == [1]
    assert puts["text.embeds.image"].shape == (2, 4) and puts["text.embeds.text"].shape == (3, 4)
    assert StageSink  # the sink interface the runtimes use


def test_answer_parity_notebook_renders(answered):
    from driftscope.views.pages import to_html

    report, out = answered
    executed = out / "06_answer_parity.ipynb"
    notebook = json.loads(executed.read_text())
    outputs = [o for cell in notebook["cells"] if cell["cell_type"] == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    html = to_html(executed)[0].read_text()
    # every pair passes here: "Stages after the tower" says so per pair (it showed "first vision divergence None")
    # (and the planted defect's pair: its tower is untouched)
    assert html.count("every vision stage passes") == len(RUNTIMES) and "Stages after the tower" in html
    assert "text.logits.last" in html and "top-5 overlap" in html and "top5_overlap" not in html


def test_the_answer_table_has_every_runtimes_prefill_and_says_the_weights_are_random(answered):
    """Issue 19 item 13: IREE and JAX (which do not decode) still show their prefill top-1 and agreement, each
    checked against the argmax of that runtime's own captured logits; a random-weight fixture is said plainly;
    the page shows no raw None."""
    import re

    from driftscope.views.answer import random_weights_note, texts_frame

    report, out = answered
    frame = texts_frame(report).set_index("runtime")
    assert list(frame.index) == [*RUNTIMES, PLANTED]
    reference_top1 = int(np.argmax(np.asarray(report.tapset("transformers:f32")["text.logits.last"]).ravel()))
    for label in RUNTIMES:
        own = int(np.argmax(np.asarray(report.tapset(label)["text.logits.last"]).ravel()))
        assert frame.loc[label, "prefill top-1"] == own, label
        agrees = "reference" if label == RUNTIMES[0] else ("yes" if own == reference_top1 else "no")
        assert frame.loc[label, "top-1 agrees"] == agrees, label
    for label in ("jax:f32", "iree:f32"):
        assert frame.loc[label, "tokens"] == frame.loc["transformers:f32", "tokens"] != "does not decode (prefill only)"
        assert 0 < frame.loc[label, "top-5 overlap"] <= 1
    assert random_weights_note(report).startswith("**This checkpoint has random weights**")
    page = (out / "06_answer_parity.nocode.html").read_text()
    assert "This checkpoint has random weights" in page
    words = re.sub(r"<style.*?</style>|<script.*?</script>|<[^>]+>", " ", page, flags=re.S)
    assert not re.search(r"\bNone\b", words)


def test_every_candidate_is_teacher_forced_and_the_notebook_says_where_its_answer_diverges(answered, tmp_path):
    """Issue 33 items 1-3: each decoding candidate was fed the reference's tokens; its forced logits match the
    oracle's at every step (f32), no step breaks a top-k tolerance, no flip; rejudging recomputes them."""
    from driftscope.judge.contract import Contract
    from driftscope.run.rejudge import rejudge
    from driftscope.views.forced import forced_frame

    report, out = answered
    reference = np.asarray(report.tapset("transformers:f32")["text.generate.tokens"])
    rows = {(r.candidate, r.stage): r for r in report.rows}
    for pair in [p for p in report.data["answer"]["pairs"] if p["candidate"] != PLANTED]:
        forced = pair["forced"]
        candidate = report.tapset(pair["candidate"])
        np.testing.assert_array_equal(np.asarray(candidate["text.forced.tokens"]), reference)
        assert forced["fed_reference_tokens"] is True and forced["steps_compared"] == 16, pair["candidate"]
        assert forced["first_divergence"] is None and forced["flips"] == [], pair["candidate"]
        assert rows[(pair["candidate"], "text.forced.logits")].max_abs < 1e-4
    frame = forced_frame(report).set_index("pair")
    assert set(frame.drop(f"{PLANTED} vs transformers:f32")["first divergence (teacher-forced)"]) == {"none"}
    page = (out / "06_answer_parity.nocode.html").read_text()
    assert "Teacher-forced: where the answer first diverges" in page and "Top-k tolerance maps" in page
    tight = Contract.from_dict({"stages": [{"pattern": "text.forced.top5", "atol": 0.0, "rtol": 0.0}]})
    again = rejudge(out / "report.json", tight, tmp_path / "tight.json")
    assert any(p["forced"]["first_divergence"] is not None for p in again.data["answer"]["pairs"])
    assert report.data["answer"]["pairs"][0]["forced"]["first_divergence"] is None  # the run's own is unchanged


def test_the_page_says_where_a_planted_text_defect_diverges_and_that_the_text_side_explains_it(answered):
    """Issue 33's "Done when" on a demo-like run: MLX's text layer 0 doubled (planted_patches.scale_text_layer).
    Substitution must blame the text side (the defect is there, the tower is untouched) and the KV cache must
    agree at every layer (layer 0's keys and values read its unchanged input, layer 1's its doubled output
    through an RMSNorm, which a scale does not change), and notebook 06's per-candidate line carries the step,
    flips, cache and verdict report.json holds."""
    import html as markup
    import importlib.util
    import re

    report, out = answered
    pair = next(p for p in report.data["answer"]["pairs"] if p["candidate"] == PLANTED)
    forced, cache, substitution = pair["forced"], pair["cache"], pair["substitution"]
    assert forced["fed_reference_tokens"] is True and forced["first_divergence"] is not None
    assert forced["flips"], "the planted defect must flip the teacher-forced answer"
    assert substitution["verdict"] == "text", substitution
    assert substitution["candidate_text_on_reference_tower"]["first_divergence"] is not None
    assert substitution["reference_text_on_candidate_tower"]["first_divergence"] is None
    assert cache["status"] == "pass" and cache["first_layer"] is None, cache
    page = (out / "06_answer_parity.nocode.html").read_text()
    words = markup.unescape(re.sub(r"<style.*?</style>|<script.*?</script>|<[^>]+>", "", page, flags=re.S))
    words = words.split("Progress log")[0]  # the page itself, not the run's log

    def said_for(pair_title: str) -> str:  # the pair's line under "Per candidate, in detail"
        return next(x for x in words.splitlines() if x.startswith(f"{pair_title}:") and "teacher-forced, the" in x)

    line = said_for(f"{PLANTED} vs transformers:f32")
    by = ", ".join(key.rsplit(".", 1)[1] for key in forced["first_divergence_by"])
    assert f"the answer first diverges at step {forced['first_divergence']} ({by})" in line, line
    flips = forced["flips"]
    for flip in flips[:3]:
        assert f"step {flip['step']} {flip['label']} (reference margin {flip['reference_margin']:.3g}" in line, line
    confident = sum(1 for flip in flips if flip["label"] == "confident")
    assert f"{len(flips)} flip{'s' if len(flips) > 1 else ''} ({confident} confident" in line, line
    assert len(flips) <= 3 or f"and {len(flips) - 3} more" in line, line
    assert "every layer's KV cache agrees" in line, line
    first = pair["first_difference"]
    assert ("free-running tokens identical" if first is None else f"first token differs at step {first}") in line
    assert "substitution: the text side explains it" in line, line
    clean = said_for("mlx:f32 vs transformers:f32")
    assert "agrees at all 16 steps; no flip" in clean and "every layer's KV cache agrees" in clean, clean
    assert "substitution not needed" in clean, clean
    assert not re.search(r"\bnot_needed\b", words)
    # every pattern the page checker of issue 34 item 6 knows (bare True/False, nan, snake_case headers, ...)
    spec = importlib.util.spec_from_file_location("clean_text", ROOT / "tests" / "views" / "clean_text.py")
    checker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checker)
    assert checker.problems(page) == []


def test_the_drilldown_of_a_text_side_first_divergence_renders(answered):
    """A failing run also renders notebook 02 on its first divergence; the planted defect's is a text stage,
    whose rows are the prompt's tokens: the per-patch map says so instead of failing the notebook."""
    from driftscope.views.errormaps import patch_error_grid

    report, out = answered
    first = report.data["first_divergence"][PLANTED]["stage"]
    assert first.startswith("text."), first
    assert patch_error_grid(report, first, PLANTED) is None
    executed = json.loads((out / "02_layer_drilldown.ipynb").read_text())
    outputs = [o for cell in executed["cells"] if cell["cell_type"] == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert "No per-patch map" in (out / "02_layer_drilldown.nocode.html").read_text()
