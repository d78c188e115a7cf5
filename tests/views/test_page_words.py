"""Pages say values a reader can take, show only the sections the run has something for, and open notebook 06 with
one line per candidate (issue 53 items 6, 7 and 8)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from chromium import HEIGHT, chromium, needs_chromium, open_page
from conftest import TINY
from driftscope.run.report import Report


def _text(page) -> str:
    words = re.sub(r"<style.*?</style>|<script.*?</script>|<[^>]+>", " ", page.read_text(), flags=re.S)
    return re.sub(r"\s+", " ", words)


# ---- item 6: raw or wrong values ----------------------------------------------------------------------------


def test_undecodable_tokens_show_as_their_ids(rendered):
    """A random-weight model's tokens decode to bytes that are no whole character: each such token is shown as its
    id (decided here by the checkpoint's own tokenizer, token by token), never a literal \\ufffd."""
    from driftscope.views.answer import readable, texts_frame
    from tokenizers import Tokenizer

    _, out = rendered
    report = Report.load(out)
    tokenizer = Tokenizer.from_file(str(TINY / "tokenizer.json"))
    entry = report.data["answer"]["runtimes"]["transformers:f32"]
    assert "\ufffd" in entry["text"], "the fixture's answer must hold undecodable bytes"
    shown = readable(entry)
    assert "\ufffd" not in shown and "\\ufffd" not in shown
    for token in entry["tokens"]:
        alone = tokenizer.decode([token], skip_special_tokens=False)
        assert (f"⟨id {token}⟩" in shown) == ("\ufffd" in alone), (token, alone, shown)
    decoded = texts_frame(report)
    assert set(decoded[decoded["tokens"] != "does not decode (prefill only)"]["text"]) == {shown}  # the same tokens


def test_an_exact_stage_says_how_many_entries_differ_and_no_tolerance(rendered):
    from driftscope.views.curves import pair_series
    from driftscope.views.parity import stage_frame

    _, out = rendered
    report = Report.load(out)
    row = next(r for r in report.data["rows"] if r.get("integer") and r["pair"] == "mlx:bf16")
    row.update(status="fail", failures=89676, elements=100000, relative_rms=0.0, tolerance_used=5000.0)
    frame = stage_frame(report).set_index(["runtime pair", "stage"])
    said = frame.loc[(report.pair_title("mlx:bf16"), row["stage"])]
    assert np.isnan(said["tolerance used"]) and np.isnan(said["relative RMS"]) and np.isnan(said["cosine"])
    assert said["note"].startswith("exact stage: 89,676 of 100,000 entries differ")
    drawn = pair_series(report, "mlx:bf16", [row["stage"]], "tolerance_used")
    assert drawn.over[0] and np.isnan(drawn.values[0])  # a mark along the top, never 5e+03


def test_the_inputs_say_their_grids_and_their_words(tiny, tmp_path):
    from driftscope.views.parity import inputs_frame, inputs_markdown

    checkpoint, inputs, _ = tiny("molmo2")
    summary = inputs.summary()
    report = Report(tmp_path / "report.json", {"family": "molmo2", "inputs": {**summary, "text": {"prompt": "p"}}})
    grids = np.asarray(inputs.arrays["grids"]).reshape(-1, 4)
    assert list(inputs_frame(report)["grids"]) == [f"{a} x {b}, {c} x {d}" for a, b, c, d in grids.tolist()]
    said = inputs_markdown(report)
    assert "no expected words (`text.expect`)" in said and "expected words:" not in said


def test_the_pooling_claim_lists_per_image_counts_only_for_several_images():
    from conftest import ROOT
    from driftscope.families.molmo2.pages import geometry_claims

    image = ROOT / "fixtures" / "images" / "shapes_224.png"
    (one, _), (two, _) = geometry_claims([image]), geometry_claims([image, image])
    assert "per image" not in one.reason and re.search(r"\d+ pooled tokens pool fewer", one.reason)
    count = one.reason.split(" pooled")[0]
    assert f"(per image: {count}, {count})" in two.reason


def test_a_handful_of_failures_is_named_one_by_one():
    from driftscope.views.drill import where_markdown
    from driftscope.views.errormaps import StageDifference, collapsed_rows, failure_share

    expected = np.zeros((6, 5), dtype=np.float32)
    actual = expected.copy()
    actual[4, 2] = 1.0
    difference = StageDifference("vision.block.0", expected, actual, 1e-4, 1e-4, "raster", [(0, 6)])
    said = where_markdown(difference, failure_share(difference, 3), collapsed_rows(difference))
    assert "1 failure, at token 4, channel 2" in said and "carry" not in said


def test_an_exact_first_divergence_is_not_channel_mapped(rendered):
    from driftscope.views import drill, sections

    _, out = rendered
    report = Report.load(out)
    exact = next(s["id"] for s in report.data["stage_plan"] if s.get("integer") and not s["id"].startswith("inputs."))
    float_failures = [r.stage for r in report.rows if r.pair == "mlx:bf16" and r.failed and not r.integer]
    report.data["first_divergence"] = {"mlx:bf16": {**report.data["first_divergence"]["mlx:bf16"], "stage": exact}}
    pair, _, stage = drill.choose(report, None, None, None)
    assert (pair, stage) == ("mlx:bf16", float_failures[0])
    assert not sections.SECTIONS["maps"].applies(report, stage=exact)
    assert sections.SECTIONS["maps"].applies(report, stage=stage)


# ---- item 7: sections that do not apply ----------------------------------------------------------------------


def test_a_page_leaves_out_what_the_run_has_nothing_for_and_says_so(rendered, answer_page):
    _, out = rendered
    drill = (out / "02_layer_drilldown.nocode.html").read_text()
    assert not re.search(r"<h2[^>]*>\s*Quantized weights", drill)  # no quantized runtime: no section
    assert "No quantized runtime" not in drill
    said = _text(out / "02_layer_drilldown.nocode.html")
    assert "Not on this page, as this run has nothing for them: Quantized weights" in said
    assert "(no runtime of this run is quantized and it has no attribution)" in said
    answer = answer_page.read_text()
    report = Report.load(out)
    pairs = report.data["answer"]["pairs"]
    substituted = any((p.get("substitution") or {}).get("status") not in (None, "not_needed") for p in pairs)
    for title, has in (
        ("Which side caused it: substitution", substituted),
        ("First differing token (free-running)", any(p["first_difference"] is not None for p in pairs)),
        ("Teacher-forced: where the answer first diverges", any(p.get("forced") for p in pairs)),
    ):
        assert bool(re.search(rf"<h[23][^>]*>\s*{re.escape(title)}", answer)) == has, title
        assert (f"{title} (" in _text(answer_page)) != has, title  # left out: said once, with why


# ---- item 8: notebook 06's first screen ----------------------------------------------------------------------


@needs_chromium
def test_notebook_06_opens_with_one_line_per_candidate(rendered, answer_page):
    _, out = rendered
    pairs = Report.load(out).data["answer"]["pairs"]
    with chromium() as browser:
        open_page(browser, answer_page.as_uri(), "document.querySelector('details')")
        lines = browser.execute_script(
            "return Array.from(document.querySelectorAll('li')).filter(li => / vs /.test(li.innerText))"
            ".map(li => [li.innerText, li.getBoundingClientRect().bottom]);"
        )
    first = [text for text, bottom in lines if bottom <= HEIGHT]
    for pair in pairs:
        line = next(t for t in first if t.startswith(f"{pair['candidate']} vs {pair['reference']}:"))
        flips = (pair.get("forced") or {}).get("flips") or []
        if pair["first_difference"] is None and not flips:
            assert ": same answer (" in line, line
        else:
            step = flips[0]["step"] if flips else pair["first_difference"]
            assert f"differs at step {step} (" in line and " because " in line, line


def test_the_headline_says_where_an_answer_differs_its_label_and_why(tmp_path):
    from driftscope.views.answer_headline import headline_lines

    flips = [{"step": 2, "label": "near-tie", "reference_margin": 0.004, "allowed": 0.01}]
    pairs = [
        {"reference": "t", "candidate": "m", "first_difference": 2, "forced": {"flips": flips, "steps_compared": 8}},
        {"reference": "t", "candidate": "c", "first_difference": 0, "substitution": {"verdict": "tower"},
         "forced": {"flips": [{**flips[0], "step": 0, "label": "confident", "reference_margin": 2.0}]}},
        {"reference": "t", "candidate": "s", "first_difference": None, "forced": {"flips": [], "steps_compared": 8}},
    ]  # fmt: skip
    report = Report(tmp_path / "report.json", {"reference": "t", "answer": {"reference": "t", "pairs": pairs}})
    near, confident, same = headline_lines(report)
    assert "**differs at step 2** (near-tie: the reference's margin 0.004 is within the 0.01 its policy allows)" in near
    assert "because nothing upstream breaks the contract: the policy's rounding decides a near-tie" in near
    assert "**differs at step 0** (confident: the reference's margin 2 is beyond the 0.01" in confident
    assert "because substitution says the tower's output explains it" in confident
    assert "**same answer** (8 tokens; every teacher-forced step within the contract)" in same


def test_a_first_divergence_in_no_block_drills_into_no_block(rendered):
    """A first divergence outside every block (a text layer, the merger) chooses no block: the page says so and
    captures no tower block's substages, which would say nothing about it (and cost two loads of each model)."""
    import driftscope.views.drill as drill
    from driftscope.errors import ParameterError

    _, out = rendered
    report = Report.load(out)
    outside = next(
        r.stage for r in report.rows if r.pair == "mlx:bf16" and not r.integer and drill.block_of(r.stage) is None
    )
    report.data["first_divergence"] = {"mlx:bf16": {**report.data["first_divergence"]["mlx:bf16"], "stage": outside}}
    pair, layers, stage = drill.choose(report, None, None, None)
    assert (pair, layers, stage) == ("mlx:bf16", [], outside)
    assert f"**block(s)** none (`{outside}` is in no block)" in drill.focus_markdown(report, pair, layers, stage)
    said = drill.substages(report, pair, layers)
    assert isinstance(said, str) and said.startswith("No block is chosen")
    assert "set `layers` to a block and" in drill.recapture_hint(pair, layers)
    with pytest.raises(ParameterError, match="no block is chosen") as refused:
        drill.recapture(report, pair, layers, "driftscope.hypotheses:scale_block_output")
    assert "`layers = [0]`" in refused.value.fix
    # where the replay names an operator in a block, the hint and the refusal name that block
    report.data["conclusions"] = {pair: {"stage": "vision.block.2.attn.qkv", "kind": "operator"}}
    assert "`layers = [2]`" in drill.recapture_hint(pair, layers, report)
    with pytest.raises(ParameterError, match="no block is chosen") as refused:
        drill.recapture(report, pair, layers, "driftscope.hypotheses:scale_block_output")
    assert "`layers = [2]`" in refused.value.fix
    assert drill.choose(report, None, [3], None)[1] == [3]  # asked for: kept
