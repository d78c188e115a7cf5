"""The pair's conclusion in words and its first divergence's worst token row followed back through the tower
(notebook 02's "Conclusion and the worst row's lineage")."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from driftscope.run.report import Report

from .notebook import coordinates, describe

SHOWN_SITES = 3  # a conclusion naming more introduced sites is said grouped by operator


def conclusion_markdown(report: Report, pair: str) -> str:
    """The pair's conclusion in words, and where its first divergence's worst token row sits (Markdown)."""
    from driftscope.core.markup import code, text

    conclusion = report.conclusion(pair)
    lineage = (report.data.get("lineage") or {}).get(pair)
    said = conclusion["text"] if conclusion else ""
    sites = conclusion.get("sites") or []
    if len(sites) > SHOWN_SITES:  # the first site's sentence, then every site grouped by operator, not 25 sentences
        from .finding import where_markdown

        said = said.split("; ", 1)[0]
        lines = [f"**{text(said)}**", f"All {len(sites)} sites, by operator: {where_markdown(report, pair)}."]
    else:
        lines = [f"**{text(said)}**" if conclusion else "No conclusion recorded for this pair."]
    added = ((report.data.get("narrowing") or {}).get(pair) or {}).get("added") or []
    if added:
        lines.append(f"Narrowing captured {len(added)} stages for this pair (e.g. {code(added[0])}).")
    if lineage:
        lines.append(
            f"The worst failing element of {code(lineage['stage'])} is at {code(coordinates(lineage['coords']))}: "
            f"{text(row_words(lineage))}, followed back below."
        )
    return "\n\n".join(lines)


def row_words(lineage: dict) -> str:
    """Which token row a lineage follows: ``"token row 264 (crops 0, patches 264; patch unit, raster order)"`` where
    the family's rows span several axes, else ``"token row 12 (merged unit, raster order)"``."""
    at = ", ".join(f"{axis} {index}" for axis, index in (lineage.get("row_at") or {}).items())
    unit = f"{lineage['unit']} unit, " if lineage.get("unit") else ""
    return f"token row {lineage['raster_row']} ({at + '; ' if at else ''}{unit}raster order)"


def row_lineage(report: Report, pair: str) -> Figure:
    """The first divergence's worst token row at every earlier captured stage: its worst element's excess over
    its tolerance (>= 1 fails) and its relative RMS error, in execution order; narrowed stages hollow."""
    lineage = (report.data.get("lineage") or {}).get(pair)
    figure = Figure(figsize=(11, 3.8), layout="constrained")
    axis = figure.subplots()
    if not lineage or not lineage["stages"]:
        axis.text(0.5, 0.5, f"no token row to follow for {pair}", ha="center", transform=axis.transAxes)
        axis.set_axis_off()
        return figure
    stages = lineage["stages"]
    added = set(((report.data.get("narrowing") or {}).get(pair) or {}).get("added") or [])
    from .axes import from_numbers, legend_markers, log_range, markers

    xs = np.arange(len(stages))
    # None (no finite value) is a marker along the top and 0 (exactly equal) one along the bottom, never a number
    excess = from_numbers(s["max_excess"] for s in stages)
    relative = from_numbers(s["relative_rms"] for s in stages)
    axis.plot(xs, excess.values, color="#d62728", linewidth=1.2, label="worst element: |a - e| / tolerance")
    axis.plot(xs, relative.values, color="#444444", linestyle="--", linewidth=1.0, label="row relative RMS error")
    hollow = [s["stage"] in added for s in stages]
    for drawn, color in ((excess, "#d62728"), (relative, "#444444")):
        faces = ["none" if narrowed else color for narrowed in hollow]
        axis.scatter(xs, drawn.values, s=22, zorder=3, edgecolors=color, facecolors=faces)
        markers(axis, xs, drawn, color)
    axis.axhline(1.0, color="black", linestyle=":", linewidth=1, label="tolerance")
    legend_markers(axis, [excess, relative])
    axis.set_yscale("log")
    axis.set_ylim(*log_range([excess.values, relative.values], 1.0))
    axis.set_xticks(xs, [s["stage"].split(".", 1)[-1] for s in stages], rotation=90, fontsize=7)
    axis.set_title(
        f"{pair}: {row_words(lineage)} of {lineage['stage']} back through the tower (hollow: captured by narrowing)",
        fontsize=9,
    )
    axis.legend(fontsize=8, loc="upper left")
    axis.grid(True, alpha=0.3)
    return describe(
        figure, f"{pair}: the first divergence's worst token row at every earlier stage, error over tolerance."
    )
