"""Notebook 06's KV-cache map and margin plot and notebook 07's probes are interactive like 01's curves and 02's
channel map (issue 53 item 9): plotly figures carrying the report's numbers, one tick per layer and per probe, one
title per pair, inlined in the rendered page within its size budget."""

from __future__ import annotations

import numpy as np
from driftscope.run.report import Report


def test_the_cache_map_is_the_reports_errors_one_tick_per_layer(rendered):
    from driftscope.views.interactive_more import cache_map_figure

    _, out = rendered
    report = Report.load(out)
    shown = cache_map_figure(report)
    pairs = [p for p in report.data["answer"]["pairs"] if p.get("cache")]
    titles = [a.text for a in shown.figure.layout.annotations]
    assert titles == [f"{p['candidate']} vs {p['reference']}" for p in pairs] and len(set(titles)) == len(titles)
    for trace, pair in zip(shown.figure.data, pairs, strict=True):
        keys = pair["cache"]["stages"]["text.cache.forced.keys"]["layers"]
        first = np.array([head["rel_linf"] for head in keys[0]["heads"]])
        heads = len(first)
        z = np.asarray(trace.z, dtype=float)
        assert np.allclose(z[0, :heads], np.where(first > 0, np.log10(np.maximum(first, 1e-8)), np.nan), equal_nan=True)
    assert shown.figure.layout.yaxis.dtick == 1 and shown.figure.layout.yaxis.tickformat == "d"
    assert shown.fallback is not None  # the static picture a page over its budget shows


def test_the_margin_plot_is_each_runtimes_margins(rendered):
    from driftscope.views.interactive_more import margins_figure

    _, out = rendered
    report = Report.load(out)
    shown = margins_figure(report)
    runtimes = report.data["answer"]["runtimes"]
    assert [t.name for t in shown.figure.data] == list(runtimes)
    for trace, entry in zip(shown.figure.data, runtimes.values(), strict=True):
        assert list(trace.y) == entry["margins"] and list(trace.customdata) == entry["tokens"]
    assert shown.figure.layout.xaxis.dtick == 1


def test_the_probes_are_interactive_one_tick_per_probe():
    from driftscope.views.precision import probes_figure, probes_frame

    probes = [
        {"index": i, "phase": phase, "f32": f32, "operators": len(f32), "passed": ok, "tolerance_used": used,
         "worst_stage": "vision.block.17.norm2", "recaptured": 3, "seconds": 1.0}
        for i, (phase, f32, ok, used) in enumerate(
            [("baseline", [], False, 40.0), ("all", ["vision.block.{b}.norm2"], True, 0.3),
             ("kind", ["vision.block.{b}.norm2"], True, 0.31)]
        )
    ]  # fmt: skip
    entry = {"candidate": "mlx:f16", "probes": probes}
    shown = probes_figure(entry)
    (trace,) = shown.figure.data
    assert list(trace.x) == [0, 1, 2] and list(trace.y) == [40.0, 0.3, 0.31]
    assert [c[3] for c in trace.customdata] == ["fail", "pass", "pass"]
    assert shown.figure.layout.xaxis.dtick == 1 and shown.figure.layout.yaxis.type == "log"
    assert list(probes_frame(entry).columns[:4]) == ["probe", "phase", "status", "tolerance used"]  # in view


def test_the_answer_page_draws_them_interactively(answer_page):
    page = answer_page.read_text()
    assert page.count('class="driftscope-plotly"') >= 2  # the KV-cache map and the margins
    assert page.count("window.PlotlyConfig") == 1  # plotly.js inlined once: the page opens offline
