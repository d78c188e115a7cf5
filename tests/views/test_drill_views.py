"""Notebooks 02 and 04, their figures on the rendered run (issue 19 items 10, 11): the magnitude scatter draws
every failing element on top of the passing ones; the spatial map's colour bar is the opaque heatmap's scale, and
its grid the per-patch RMS error computed here from the TapSets; each power panel labelled and starred."""

from __future__ import annotations

import re

import numpy as np
import pytest
from driftscope.run.report import Report
from driftscope.views.axes import OVER_AT
from driftscope.views.drill import magnitude_scatter, spatial_map
from driftscope.views.errormaps import patch_error_grid, stage_difference


def test_the_scatter_draws_every_failing_element_on_top(rendered):
    _, out = rendered
    report = Report.load(out)
    first = report.data["first_divergence"]["mlx:bf16"]
    difference = stage_difference(report, first["stage"], "mlx:bf16")
    figure = magnitude_scatter(difference)
    (axis,) = figure.axes
    passing, failing = axis.collections[:2]
    assert failing.get_zorder() > passing.get_zorder()
    assert len(failing.get_offsets()) == int(difference.failing.sum()) == first["failures"]
    # the red points are exactly the failing elements: (|e|, |a - e|) of each, computed here
    expected = np.abs(difference.expected).ravel()[difference.failing.ravel()]
    diffs = difference.diff.ravel()[difference.failing.ravel()]
    shown = np.asarray(failing.get_offsets())
    assert np.allclose(np.sort(shown[:, 0]), np.sort(np.maximum(expected, 1e-6)))
    assert np.allclose(np.sort(shown[:, 1]), np.sort(diffs))
    assert np.all(diffs > difference.atol + difference.rtol * expected)


def test_the_spatial_maps_colour_bar_is_the_scale_of_its_heatmaps(rendered):
    _, out = rendered
    report = Report.load(out)
    stage = report.data["first_divergence"]["mlx:bf16"]["stage"]
    figure = spatial_map(report, stage, "mlx:bf16")
    grid = patch_error_grid(report, stage, "mlx:bf16")
    heatmaps = [image for axis in figure.axes for image in axis.images if image.get_array().shape == grid.shape]
    assert len(heatmaps) == 2
    (bar,) = [axis for axis in figure.axes if axis.get_label() == "<colorbar>"]
    # the bar is drawn from the opaque heatmap, not from the translucent overlay (whose colours it would not show)
    (opaque,) = [heatmap for heatmap in heatmaps if heatmap.get_alpha() in (None, 1.0)]
    assert opaque.colorbar is not None and opaque.colorbar.ax is bar
    limits = bar.get_ylim()
    for heatmap in heatmaps:
        assert np.array_equal(np.asarray(heatmap.get_array()), grid)
        assert heatmap.norm.vmin == limits[0] == grid.min() and heatmap.norm.vmax == limits[1] == grid.max()
    # the grid is each patch's RMS error, every token once: its root mean square is the stage's RMS error
    sides = report.pair_tapsets("mlx:bf16")  # the run's TapSets with the stages narrowing added to this pair
    reference, candidate = (np.asarray(side[stage], dtype=np.float64) for side in sides)
    assert grid.size == reference.shape[0]
    assert np.sqrt(np.mean(grid**2)) == pytest.approx(np.sqrt(np.mean((candidate - reference) ** 2)), rel=1e-6)


def test_every_power_panel_labels_its_axes_and_marks_the_first_divergence(rendered):
    """Notebook 04 (item 11): one panel per detected mutation, both axes labelled, its first divergence starred
    at the mutation's own value there (or named, for an exact stage off the axis)."""
    from driftscope.views.curves import plotted_stages
    from driftscope.views.plots import mutation_curves

    _, out = rendered
    report = Report.load(out)
    detected = [m for m in report.data["power"]["mutations"] if m["detected"]]
    figure = mutation_curves(report)
    panels = [axis for axis in figure.axes if axis.get_title()]
    assert len(panels) == len(detected) > 0
    stages = [t.get_text() for t in panels[-1].get_xticklabels()]
    plan = plotted_stages(report)
    firsts = [m["first_divergence"] for m in detected if m["first_divergence"] not in plan]
    axis_stages = [s["id"] for s in report.data["stage_plan"] if s["id"] in set(plan) | set(firsts)]
    assert len(stages) == len(axis_stages)  # an exact stage that is a mutation's first divergence is on the axis
    for axis, mutation in zip(panels, detected, strict=True):
        assert axis.get_xlabel() and axis.get_ylabel()
        first = mutation["first_divergence"]
        (star,) = [line for line in axis.get_lines() if line.get_marker() == "*"]
        row = next(r for r in mutation["rows"] if r["stage"] == first)
        assert np.asarray(star.get_xdata()).ravel()[0] == axis_stages.index(first)
        y = np.asarray(star.get_ydata()).ravel()[0]
        if row["tolerance_used"] is not None and np.isfinite(row["tolerance_used"]):
            assert y == pytest.approx(row["tolerance_used"])  # on the mutation's own value there
        else:  # an exact stage (an index) has no share of a tolerance: on the "fails with no value" row, at the top
            assert star.get_transform() == axis.get_xaxis_transform() and y == OVER_AT


def test_the_spatial_map_ticks_whole_patches(rendered):
    _, out = rendered
    report = Report.load(out)
    stage = report.data["first_divergence"]["mlx:bf16"]["stage"]
    figure = spatial_map(report, stage, "mlx:bf16")
    grid_axis = next(axis for axis in figure.axes if axis.get_xlabel() == "patch column")
    for ticks in (grid_axis.get_xticks(), grid_axis.get_yticks()):
        assert len(ticks) and np.all(np.asarray(ticks) == np.round(ticks))


def test_the_explorer_recomputes_what_the_pickers_choose(rendered):
    """Item 9 (JupyterLab): the pair, block, stage and channel pickers drive the curve, the channel map and the
    channel's profile; each shows the TapSets' values (checked here with numpy), no cell edited."""
    from driftscope.views.explore import STATIC, explore
    from driftscope.views.interactive import WIDGET_MIME

    _, out = rendered
    report = Report.load(out)
    first = report.data["first_divergence"]["mlx:bf16"]["stage"]
    explorer = explore(report)
    assert (explorer.pair.value, explorer.stage.value) == ("mlx:bf16", first)
    bundle = explorer._repr_mimebundle_()
    assert WIDGET_MIME in bundle and bundle["text/plain"] == STATIC
    block = next(b for b in sorted(set(explorer._blocks.values())) if b != explorer.block.value)
    explorer.block.value = block  # the stage list follows the block
    assert explorer.stage.options and all(explorer._blocks[s] == block for s in explorer.stage.options)
    explorer.pair.value = "mlx:f32"
    stage = explorer.stage.value
    reference, candidate = (np.asarray(side[stage], dtype=np.float64) for side in report.pair_tapsets("mlx:f32"))
    diff = np.abs(candidate - reference).reshape(reference.shape[0], -1)
    (heatmap,) = explorer.figures["map"].figure.data
    cells = np.asarray(heatmap.customdata)
    tokens, channels = cells[..., 0].astype(int), cells[..., 1].astype(int)
    assert np.allclose(cells[..., 4], diff[tokens, channels], rtol=1e-3, atol=1e-12)
    explorer.channel.value = 3
    profile = explorer.figures["channel"].figure.data[2]  # |a - e| of channel 3 along the tokens
    assert np.allclose(np.asarray(profile.y, dtype=np.float64), diff[:, 3], rtol=1e-5, atol=1e-12)
    assert "mlx:f32" in explorer.note.value and stage in explorer.note.value
    # issue 53 item 9: the chosen pair's curve stands out (the others faded), and the pickers wrap on a narrow page
    curve = explorer.figures["curve"].figure
    chosen = [t for t in curve.data if t.legendgroup == "mlx:f32"]
    assert chosen and all(t.opacity == 1.0 for t in chosen) and any(t.line.width == 3 for t in chosen)
    assert all(t.opacity < 0.5 for t in curve.data if t.legendgroup not in (None, "mlx:f32"))
    pickers = explorer.box.children[0]
    assert pickers.layout.flex_flow == "row wrap" and pickers.layout.max_width == "100%"
    widths = [float(w.layout.width.removesuffix("em")) for w in pickers.children]
    assert sum(widths) * 14 <= 1400  # em at the lab's 14 px: the four fit one row of a 1400 px page


def test_the_recapture_cell_shows_the_hint_without_a_patch_and_the_trial_with_one(rendered, tmp_path):
    """Notebook 02's last cell (``drill.recapture``): how to try a patch when none is set; with one, the block
    captured again, in words and a table row per stage whose patched status is the trial's (the output fails)."""
    import shutil

    from driftscope.views.drill import recapture, recapture_hint

    _, out = rendered
    run = tmp_path / "run"  # the trial writes recapture/ into the run it is given: a copy, not the session's run
    shutil.copytree(out, run, ignore=shutil.ignore_patterns("*.html", "*.ipynb"))
    report = Report.load(run)
    (hint,) = recapture(report, "mlx:f32", [2], None)
    assert hint.data == recapture_hint("mlx:f32", [2], report)
    patch = {"callable": "driftscope.hypotheses:scale_block_output", "kwargs": {"block": 2, "factor": 1.5}}
    words, table = recapture(report, "mlx:f32", [2], patch)
    assert "scale_block_output" in words.data and "fail" in words.data
    rows = re.findall(r"<tr>(.*?)</tr>", table.data, flags=re.S)[1:]  # the header row first
    last = re.findall(r"<td[^>]*>(.*?)</td>", rows[-1], flags=re.S)
    assert len(rows) > 10 and last[0] == "vision.block.2" and "fail" in last
