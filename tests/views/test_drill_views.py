"""Notebooks 02 and 04, their figures on the rendered run (issue 19 items 10, 11): the magnitude scatter draws
every failing element on top of the passing ones; the spatial map's colour bar is the opaque heatmap's scale, and
its grid the per-patch RMS error computed here from the TapSets; each power panel labelled and starred."""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.run.report import Report
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
    stages = plotted_stages(report)
    for axis, mutation in zip(panels, detected, strict=True):
        assert axis.get_xlabel() and axis.get_ylabel()
        first = mutation["first_divergence"]
        stars = [line for line in axis.get_lines() if line.get_marker() == "*"]
        if first in stages:
            (star,) = stars
            row = next(r for r in mutation["rows"] if r["stage"] == first)
            assert np.asarray(star.get_xdata()).ravel()[0] == stages.index(first)
            assert np.asarray(star.get_ydata()).ravel()[0] == pytest.approx(row["tolerance_used"])
        else:
            assert not stars and any(f"first divergence: {first}" in t.get_text() for t in axis.texts)
