"""Issue 34 items 4, 5 and 9 on a report written here (no run): what the figures draw is what the rows say.

A stage a pair did not compare is a gap, never a value; an exactly equal stage is the "=" marker, never 1e-9; a
failure without a finite value (an exact stage, shapes that differ) a marker along the top; the y range keeps the
tolerance line and every failing point inside with headroom; every first divergence is starred, an exact stage's
(``text.attention_mask``) included; counts have integer ticks; a long stage axis is grouped by block. The plotly
forms carry the same values with hover text, and a page over its size budget falls back to the PNGs.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from driftscope.run.report import Report
from driftscope.views import axes as honest
from driftscope.views.curves import error_curves, plotted_stages
from driftscope.views.errormaps import StageDifference
from driftscope.views.plots import mutation_curves

PAIRS = ("mlx:bf16", "mlx:f32")
BLOCKS, SUBSTAGES = 7, ("norm1", "attn.q", "attn.out", "residual1", "mlp.down")


def _plan() -> list[dict]:
    stages = [{"id": "vision.patch_embed", "block": None}]
    for block in range(BLOCKS):
        stages += [{"id": f"vision.block.{block}.{s}", "block": block, "substage": s} for s in SUBSTAGES]
        stages.append({"id": f"vision.block.{block}", "block": block})
    stages += [{"id": "text.attention_mask", "block": None, "integer": True}, {"id": "text.norm", "block": None}]
    return stages


def _row(stage: str, pair: str, status: str, used: float | None, max_abs: float | None, failures: int = 0):
    return {"stage": stage, "reference": "transformers:f32", "candidate": pair, "pair": pair, "position": 0,
            "status": status, "failures": failures, "max_abs": max_abs, "tolerance_used": used, "rms": max_abs,
            "atol": 0.08, "rtol": 0.08, "max_coords": [3, 1], "max_reference_value": 0.5,
            "max_candidate_value": 0.5 + (max_abs or 0.0)}  # fmt: skip


def _values(stage: str, pair: str) -> tuple[str, float | None, float | None, int]:
    """Each stage's (status, tolerance used, max_abs, failures): the planted cases named in the tests."""
    if pair == "mlx:f32":
        if stage == "vision.block.2.attn.q":
            return "missing", None, None, 0  # not captured by mlx:f32: a gap
        if stage == "vision.patch_embed":
            return "pass", 0.0, 0.0, 0  # exactly equal
        return "pass", 1e-4, 1e-5, 0
    if stage == "text.attention_mask":
        return "fail", math.inf, 1.0, 3  # the exact stage differs: bf16's first divergence
    if stage == "vision.block.3.residual1":
        return "fail", 4.5, 0.4, 1500
    return "pass", 0.3, 0.02, 0


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Report:
    plan = _plan()
    rows = [_row(s["id"], pair, *_values(s["id"], pair)) for pair in PAIRS for s in plan]
    data = {
        "name": "planted",
        "reference": "transformers:f32",
        "stage_plan": plan,
        "rows": rows,
        "pairs": [{"key": p, "candidate": p, "reference": "transformers:f32"} for p in PAIRS],
        "first_divergence": {"mlx:bf16": {"stage": "text.attention_mask"}, "mlx:f32": None},
        "verdict": {"status": "fail", "per_candidate": {"mlx:bf16": "fail", "mlx:f32": "pass"}},
        "power": {"mutations": [_mutation(plan)]},
    }
    return Report(tmp_path_factory.mktemp("planted") / "report.json", data)


def _mutation(plan: list[dict]) -> dict:
    """A mutation that resizes differently: every stage's shapes differ, except the ones it never captured."""
    rows = []
    for s in plan:
        if s["id"].startswith("vision.block.4."):
            rows.append({"stage": s["id"], "status": "missing", "max_abs": None, "tolerance_used": None})
        elif s["id"] == "vision.patch_embed":
            rows.append({"stage": s["id"], "status": "pass", "max_abs": 0.0, "tolerance_used": 0.0})
        else:
            rows.append({"stage": s["id"], "status": "shape_mismatch", "max_abs": None, "tolerance_used": None})
    return {"mutation": "resize_bounds", "detected": True, "first_divergence": "vision.block.0.norm1", "rows": rows}


def _curve(axis, report, pair):
    (line,) = [line for line in axis.get_lines() if line.get_label() == report.pair_title(pair)]
    return np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)


def _markers(axis, marker):
    return [line for line in axis.get_lines() if line.get_marker() == marker and len(line.get_xdata())]


def test_a_stage_not_compared_is_a_gap_and_exact_equality_its_own_marker(report):
    stages = plotted_stages(report)
    figure = error_curves(report, metrics=("tolerance_used", "max_abs", "failures"))
    top = figure.axes[0]
    xs, ys = _curve(top, report, "mlx:f32")
    missing, exact = stages.index("vision.block.2.attn.q"), stages.index("vision.patch_embed")
    assert np.isnan(ys[missing]) and np.isnan(ys[exact])  # neither is a value on the curve
    assert np.all(ys[np.isfinite(ys)] == pytest.approx(1e-4))  # every compared stage: its own share
    assert np.nanmin(np.concatenate([_curve(a, report, p)[1] for a in figure.axes[:2] for p in PAIRS])) >= 1e-5
    (equal,) = [m for m in _markers(top, honest.EXACT_MARKER)]
    assert list(equal.get_xdata()) == [exact] and list(equal.get_ydata()) == [honest.EXACT_AT]
    assert equal.get_transform() == top.get_xaxis_transform()  # along the bottom, not at a fake value
    assert any("exactly equal" in str(t.get_text()) for t in top.get_legend().get_texts())


def test_the_range_keeps_headroom_and_every_first_divergence_is_starred(report):
    stages = plotted_stages(report)
    assert "text.attention_mask" in stages  # an exact stage that is a first divergence is on the axis
    figure = error_curves(report, metrics=("tolerance_used", "max_abs"))
    top = figure.axes[0]
    bottom, ceiling = top.get_ylim()
    assert ceiling >= honest.HEADROOM * 4.5 and bottom < 1e-4  # the worst failing share (4.5) and the line inside
    (over,) = _markers(top, honest.OVER_MARKER)
    assert list(over.get_xdata()) == [stages.index("text.attention_mask")]  # fails with no finite share
    for axis in figure.axes[:2]:
        stars = _markers(axis, "*")
        assert [float(s.get_xdata()[0]) for s in stars] == [stages.index("text.attention_mask")]
    (star,) = _markers(figure.axes[1], "*")
    assert float(star.get_ydata()[0]) == 1.0  # max |a - e| of the mask: its own value


def test_counts_have_integer_ticks(report):
    figure = error_curves(report, metrics=("failures",))
    axis = figure.axes[0]
    labels = [t.get_text() for t in axis.get_yticklabels() if t.get_text()]
    assert labels[:4] == ["0", "1", "10", "100"] and all(re.fullmatch(r"[\d,]+", label) for label in labels)
    _, ys = _curve(axis, report, "mlx:bf16")
    assert np.nanmax(ys) == 1500 and axis.get_ylim()[1] > 1500 * 2
    few = error_curves(_few_failures(report), metrics=("failures",)).axes[0]
    ticks = few.get_yticks()
    assert np.all(ticks == np.round(ticks)) and few.get_yscale() == "linear"


def _few_failures(report: Report) -> Report:
    data = dict(report.data)
    data["rows"] = [dict(r, failures=min(r["failures"], 2)) for r in report.data["rows"]]
    return Report(report.path, data)


def test_a_long_stage_axis_is_grouped_by_block(report):
    stages = plotted_stages(report)
    assert len(stages) > honest.GROUPED_AT
    figure = error_curves(report, metrics=("tolerance_used",))
    labels = [t.get_text() for t in figure.axes[0].get_xticklabels()]
    assert labels[stages.index("vision.block.3.attn.q")] == "attn.q" and labels[stages.index("vision.block.3")] == "out"
    names = [t.get_text() for t in figure.axes[0].texts]
    assert [f"block {b}" for b in range(BLOCKS)] == names


def test_a_mutation_that_changes_shapes_is_not_drawn_as_agreement(report):
    figure = mutation_curves(report)
    (axis,) = [a for a in figure.axes if a.get_title()]
    stages = [t.get_text() for t in axis.get_xticklabels()]
    (line,) = [line for line in axis.get_lines() if line.get_label() == "resize_bounds"]
    assert np.all(np.isnan(np.asarray(line.get_ydata(), float)))  # no stage has a value to draw
    (over,) = [m for m in _markers(axis, honest.OVER_MARKER) if m.get_color() == "#d62728"]  # the mutation's
    (equal,) = [m for m in _markers(axis, honest.EXACT_MARKER) if m.get_color() == "#d62728"]
    plan = plotted_stages(report)
    never = {plan.index(s) for s in plan if s.startswith("vision.block.4.")}
    assert never and not never & set(over.get_xdata()) and not never & set(equal.get_xdata())  # gaps
    assert len(stages) == len(plan) and 0 < len(over.get_xdata()) == len(plan) - len(never) - 1


def test_the_channel_map_ticks_whole_indices_and_leaves_exact_elements_white():
    from driftscope.views.drill import channel_map

    expected = np.linspace(-1, 1, 6 * 5, dtype=np.float32).reshape(6, 5)
    actual = expected.copy()
    actual[2, 3] += 0.5
    actual[4, 1] += 0.01
    figure = channel_map(StageDifference("vision.block.0", expected, actual, 0.08, 0.08, "raster", [(0, 6)]))
    axis = figure.axes[0]
    shown = axis.images[0].get_array()
    assert np.ma.count_masked(shown) + np.isnan(np.ma.getdata(shown)).sum() >= 28  # the equal ones, not colours
    assert np.all(np.asarray(axis.get_xticks()) == np.round(axis.get_xticks()))
    assert "exactly equal (28 elements)" in figure.axes[-1].get_ylabel()


def test_the_interactive_curve_hovers_with_the_rows_values(report):
    from driftscope.views.interactive import error_curves_figure

    shown = error_curves_figure(report, metrics=("tolerance_used", "failures"), static=False)
    stages = plotted_stages(report)
    traces = [t for t in shown.figure.data if t.name == report.pair_title("mlx:bf16") and t.mode == "lines+markers"]
    assert len(traces) == 2
    share = traces[0]
    at = stages.index("vision.block.3.residual1")
    assert share.y[at] == 4.5 and share.customdata[at][0] == "vision.block.3.residual1"
    assert list(share.customdata[at][1:5]) == ["mlx:bf16 vs transformers:f32", "0.4", "4.5", "1500"]
    assert share.customdata[at][5] == "(3, 1): expected 0.5, actual 0.9"
    for word in ("max |a - e|", "tolerance used", "worst element"):
        assert word in share.hovertemplate
    gap = stages.index("vision.block.2.attn.q")
    (f32,) = [t for t in shown.figure.data if t.name == report.pair_title("mlx:f32") and t.mode == "lines+markers"][:1]
    assert f32.y[gap] is None and f32.customdata[gap][5].startswith("not compared") and f32.connectgaps is False
    stars = [t for t in shown.figure.data if t.marker.symbol == "star"]
    assert [t.x[0] for t in stars] == [stages.index("text.attention_mask")] * 2
    equal = [t for t in shown.figure.data if t.name.endswith("exactly equal")]
    assert [list(t.x) for t in equal] == [[stages.index("vision.patch_embed")]]


def test_the_interactive_map_keeps_each_cells_worst_element():
    from driftscope.views import interactive

    rng = np.random.default_rng(3)
    expected = rng.normal(size=(300, 200)).astype(np.float32)
    actual = expected + rng.normal(scale=1e-3, size=expected.shape).astype(np.float32)
    actual[123, 45] += 2.0
    difference = StageDifference("vision.block.1", expected, actual, 0.08, 0.08, "raster", [(0, 300)])
    shown = interactive.channel_map_figure(difference, fallback=False)
    (heatmap,) = shown.figure.data
    cells = np.asarray(heatmap.customdata)
    assert cells.shape[0] * cells.shape[1] <= interactive.MAP_CELLS * 1.1
    diff = np.abs(actual.astype(np.float64) - expected)
    tokens, channels = cells[..., 0].astype(int), cells[..., 1].astype(int)
    assert np.allclose(cells[..., 4], diff[tokens, channels], rtol=1e-3)  # the hover's |a - e| is that element's
    step_t, step_c = int(heatmap.y[1] - heatmap.y[0]), int(heatmap.x[1] - heatmap.x[0])
    for i, j in ((0, 0), (123 // step_t, 45 // step_c), (5, 7)):
        block = diff[i * step_t : (i + 1) * step_t, j * step_c : (j + 1) * step_c]
        assert cells[i, j, 4] == pytest.approx(block.max(), rel=1e-3)  # the block's worst element, not a mean
    assert (tokens[123 // step_t, 45 // step_c], channels[123 // step_t, 45 // step_c]) == (123, 45)


def test_a_page_over_its_budget_shows_the_pictures(report, monkeypatch):
    from driftscope.core.validation import draft_2020_12

    draft_2020_12()  # nbformat validates with jsonschema: imported first without its optional IRI grammar (slow)
    import nbformat
    from driftscope.views import interactive
    from driftscope.views.explore import STATIC
    from IPython.core.formatters import format_display_data

    shown = interactive.error_curves_figure(report, metrics=("tolerance_used",))
    data, metadata = format_display_data(shown)
    widget = {interactive.WIDGET_MIME: {"model_id": "x"}, "text/html": f"<p>{STATIC}</p>", "text/plain": STATIC}
    cell = nbformat.v4.new_code_cell(
        "x",
        outputs=[
            nbformat.v4.new_output("display_data", data=data, metadata=metadata),
            nbformat.v4.new_output("display_data", data=widget),
        ],
    )
    notebook = nbformat.v4.new_notebook(cells=[cell])
    page, inline = interactive.page_ready(notebook)
    figure, words = page.cells[0].outputs
    assert inline and interactive.MARK in figure["data"]["text/html"] and interactive.WIDGET_MIME not in words["data"]
    monkeypatch.setattr(interactive, "PAGE_BUDGET", 1024)
    page, inline = interactive.page_ready(notebook)
    figure = page.cells[0].outputs[0]
    assert not inline and set(figure["data"]) == {"image/png", "text/plain"}  # the static PNG with its alt text
    assert figure["metadata"]["image/png"]["alt"].startswith("Interactive: Error per stage")
