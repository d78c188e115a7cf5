"""Issue 34 item 4 beyond the stage curves: the replay, lineage, attribution, teacher-forced margin, KV-cache and
magnitude figures draw an exact zero as "exactly equal" (a marker, a white cell, a count) and a missing value as
"no finite value", never as a number at a 1e-9 floor. Reports are written here (no run); each expectation is
read back from what matplotlib holds."""

from __future__ import annotations

import numpy as np
from driftscope.run.report import Report
from driftscope.views import axes as honest
from driftscope.views.errormaps import StageDifference

PAIR = "mlx:bf16"


def _report(tmp_path, **data) -> Report:
    plan = [{"id": f"vision.block.{b}", "block": b} for b in range(4)]
    return Report(tmp_path / "report.json", {"name": "planted", "stage_plan": plan, **data})


def _plotted(axis) -> np.ndarray:
    """Every finite y value a line of ``axis`` draws in data coordinates (markers along an edge excluded)."""
    values = [
        np.asarray(line.get_ydata(), float) for line in axis.get_lines() if line.get_transform() == axis.transData
    ]
    values += [_scattered(axis)]
    joined = np.concatenate(values) if values else np.zeros(0)
    return joined[np.isfinite(joined)]


def _scattered(axis) -> np.ndarray:
    """The y values of the panel's scatter points."""
    from matplotlib.collections import PathCollection

    points = [np.asarray(c.get_offsets(), float) for c in axis.collections if isinstance(c, PathCollection)]
    points = [p[:, 1] for p in points if p.size]
    return np.concatenate(points) if points else np.zeros(0)


def _edge_markers(axis, marker: str) -> list[float]:
    """The x positions of ``marker`` drawn along an edge of the panel (x in data, y in the panel's height)."""
    return [
        float(x)
        for line in axis.get_lines()
        if line.get_marker() == marker and line.get_transform() != axis.transData
        for x in line.get_xdata()
    ]


def test_numbers_become_values_exact_markers_and_no_finite_value():
    drawn = honest.from_numbers([0.0, None, 2e-3, float("inf"), 5.0])
    assert drawn.exact.tolist() == [True, False, False, False, False]
    assert drawn.over.tolist() == [False, True, False, True, False]
    assert np.isnan(drawn.values[[0, 1, 3]]).all() and drawn.values[[2, 4]].tolist() == [2e-3, 5.0]


def test_the_replay_curve_marks_an_exact_block_instead_of_a_floor(tmp_path):
    from driftscope.views.drill import introduced_curve

    labels = [
        {"stage": f"vision.block.{b}", "label": label, "accumulated_relative_rms": acc, "op_local_relative_rms": op}
        for b, (label, acc, op) in enumerate(
            [("clean", 0.0, 0.0), ("clean", 1e-6, 0.0), ("introduced", 0.2, 0.19), ("inherited", 0.3, 1e-5)]
        )
    ]
    axis = introduced_curve(_report(tmp_path, replay={PAIR: {"labels": labels}}), PAIR).axes[0]
    plotted = _plotted(axis)
    assert plotted.min() >= 1e-6 and 1e-9 not in plotted  # the zeros are not points
    assert sorted(_edge_markers(axis, honest.EXACT_MARKER)) == [0.0, 0.0, 1.0]  # block 0 twice, block 1 op-local
    bottom, top = axis.get_ylim()
    assert bottom < 1e-6 and top >= 0.3 * honest.HEADROOM * 0.999


def test_the_row_lineage_draws_a_missing_excess_along_the_top(tmp_path):
    from driftscope.views.lineage import row_lineage

    stages = [
        {"stage": "vision.block.0", "max_excess": 0.0, "relative_rms": 0.0},
        {"stage": "vision.block.1", "max_excess": None, "relative_rms": None},
        {"stage": "vision.block.2", "max_excess": 3.0, "relative_rms": 0.04},
    ]
    lineage = {PAIR: {"stages": stages, "raster_row": 7, "stage": "vision.block.2"}}
    axis = row_lineage(_report(tmp_path, lineage=lineage), PAIR).axes[0]
    plotted = _plotted(axis)
    assert 1e9 not in plotted and 1e-6 not in plotted and 1e-9 not in plotted
    assert _edge_markers(axis, honest.OVER_MARKER) == [1.0, 1.0]
    assert _edge_markers(axis, honest.EXACT_MARKER) == [0.0, 0.0]
    bottom, top = axis.get_ylim()
    assert bottom < 0.04 and top >= 3.0 * honest.HEADROOM * 0.999  # the tolerance line (1) and every point inside


def _forced_pair(margins: list[float], errors: list[float]) -> dict:
    steps = [
        {"reference_margin": m, "allowed": 0.01, "error_top1": e, "error_top2": 0.0}
        for m, e in zip(margins, errors, strict=True)
    ]
    flips = [{"step": 1, "label": "near-tie", "reference_margin": 0.0}]
    return {"candidate": PAIR, "reference": "transformers:f32", "forced": {"steps": steps, "flips": flips}}


def test_a_tie_and_an_error_free_step_are_markers_on_the_margin_plot(tmp_path):
    from driftscope.views.forced import forced_margin_plot

    pair = _forced_pair([0.5, 0.0, 0.3], [1e-4, 0.0, 2e-3])
    axis = forced_margin_plot(_report(tmp_path, answer={"pairs": [pair]})).axes[0]
    plotted = _plotted(axis)
    assert 1e-9 not in plotted and set(plotted) >= {0.5, 0.3, 1e-4, 2e-3}
    assert sorted(_edge_markers(axis, honest.EXACT_MARKER)) == [1.0, 1.0]  # the tie's margin and its zero error
    assert [text.get_text() for text in axis.texts] == ["near-tie"]
    bottom, top = axis.get_ylim()
    assert bottom < 1e-4 and top >= 0.5 * honest.HEADROOM * 0.999


def test_an_exactly_equal_cache_head_is_white_and_counted(tmp_path):
    from driftscope.views.cache import cache_heatmap

    def stage(values):
        heads = lambda row: [{"head": h, "rel_linf": v, "first_position": None} for h, v in enumerate(row)]  # noqa: E731
        return {"layers": [{"layer": i, "heads": heads(row)} for i, row in enumerate(values)]}

    cache = {"stages": {"text.cache.forced.keys": stage([[0.0, 1e-3], [2e-5, 0.0]]),
                        "text.cache.forced.values": stage([[0.0, 0.0], [1e-2, 1e-4]])}}  # fmt: skip
    pair = {"candidate": PAIR, "reference": "transformers:f32", "cache": cache}
    figure = cache_heatmap(_report(tmp_path, answer={"pairs": [pair]}))
    shown = np.ma.getdata(figure.axes[0].images[0].get_array()).astype(float)
    assert np.isnan(shown).sum() == 4  # the four exact zeros: no colour
    assert np.allclose(shown[~np.isnan(shown)], np.log10([1e-3, 2e-5, 1e-2, 1e-4]))
    assert "exactly equal (4 layer-heads)" in figure.get_suptitle()  # said above the panels (a colour bar's label
    # long enough to say it was cut off at the figure's edge)


def test_the_attribution_figure_marks_an_exact_reference(tmp_path):
    from driftscope.views.quant import attribution_figure

    rows = [
        {"stage": f"vision.block.{b}", "errors": {"transformers:f32": e32, "mlx:q4-dequant": eq}, "closer": closer}
        for b, (e32, eq, closer) in enumerate([(0.02, 0.0, "mlx:q4-dequant"), (0.03, 1e-4, "mlx:q4-dequant")])
    ]
    attribution = {"rows": rows, "references": ["transformers:f32", "mlx:q4-dequant"], "candidate": "mlx:q4",
                   "verdict": "the quantization explains it"}  # fmt: skip
    axis = attribution_figure(_report(tmp_path, attribution=attribution)).axes[0]
    plotted = _plotted(axis)
    assert 1e-9 not in plotted and plotted.min() == 1e-4
    assert _edge_markers(axis, honest.EXACT_MARKER) == [0.0]


def test_the_magnitude_scatter_counts_exact_elements_instead_of_a_floor():
    from driftscope.views.drill import magnitude_scatter

    expected = np.linspace(-1, 1, 40, dtype=np.float32).reshape(8, 5)
    actual = expected.copy()
    actual[1, 2] += 0.5  # fails
    actual[3, 4] += 1e-3
    figure = magnitude_scatter(StageDifference("vision.block.0", expected, actual, 0.08, 0.08, "raster", [(0, 8)]))
    axis = figure.axes[0]
    scattered = _scattered(axis)
    assert np.allclose(sorted(scattered), [1e-3, 0.5], rtol=1e-3)  # the 38 zeros are not at a floor
    assert "38 exactly equal, not drawn" in axis.get_title()
