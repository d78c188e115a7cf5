"""What a rendered figure's picture holds, for a reader that cannot look at pixels: every panel's title and axis
labels, each tick's value and its label's box, and each text drawn in a panel (block names, annotations) with its
box, in the PNG's own pixels (top-left origin). The notebooks' PNGs carry it as output metadata (``figure``), and
the rendered pages as the ``data-figure`` attribute of the ``<img>``, so a test can check a page's figures (no tick
label over another, integer ticks on integer axes, panel titles unique) from the page alone (an interactive figure's
ticks and titles are in the page's own SVG).
"""

from __future__ import annotations

import json

from matplotlib.figure import Figure


def _box(artist, renderer, height: float) -> list[float] | None:
    if not artist.get_visible() or not artist.get_text().strip():
        return None
    extent = artist.get_window_extent(renderer)
    return [round(v, 1) for v in (extent.x0, height - extent.y1, extent.x1, height - extent.y0)]


def _ticks(axis, renderer, height: float) -> dict:
    low, high = sorted(axis.get_view_interval())
    shown = []
    for tick in axis.get_major_ticks():
        location = float(tick.get_loc())
        if not low - 1e-9 <= location <= high + 1e-9 or not tick.label1.get_visible():
            continue
        box = _box(tick.label1, renderer, height)
        if box is not None:
            shown.append({"value": location, "text": tick.label1.get_text(), "box": box})
    return {"label": axis.get_label_text(), "scale": axis.get_scale(), "ticks": shown}


def figure_facts(figure: Figure, drawn: bool = False) -> dict:
    """The facts of ``figure`` as drawn (its layout resolved): ``{"title", "panels": [{"title", "colorbar", "x", "y",
    "texts"}]}``, boxes in the figure's own pixels (before ``bbox_inches="tight"`` trims the PNG: positions are
    comparable with each other, not with the page). ``drawn``: the figure was just drawn (saved as the page's PNG),
    so its layout is read as it is (saving marks it stale without changing it) instead of laid out again."""
    if not drawn:
        figure.draw_without_rendering()
    renderer = figure._get_renderer()
    height = figure.bbox.height
    panels = []
    for axes in figure.axes:
        texts = [
            {"text": text.get_text(), "box": box}
            for text in axes.texts
            if (box := _box(text, renderer, height)) is not None
        ]
        panels.append(
            {
                "title": axes.get_title(),
                "colorbar": hasattr(axes, "_colorbar"),
                "x": _ticks(axes.xaxis, renderer, height),
                "y": _ticks(axes.yaxis, renderer, height),
                "texts": texts,
            }
        )
    title = figure._suptitle.get_text() if getattr(figure, "_suptitle", None) else ""
    return {"title": title, "panels": panels}


def facts_json(figure: Figure, drawn: bool = False) -> str:
    """:func:`figure_facts` as compact JSON ("" when the figure cannot be laid out)."""
    try:
        return json.dumps(figure_facts(figure, drawn), separators=(",", ":"), default=float)
    except Exception:  # noqa: BLE001 - facts are for checking a page; a figure that cannot give them still shows
        return ""
