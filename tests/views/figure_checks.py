"""What a rendered page's figures and tables must hold, read in headless Chromium at 1400x900 from the page alone
(issue 53 item 5): no tick label over another (the static figures' facts in their ``data-figure`` attribute, the
interactive ones' SVG), integer ticks on every axis of an integer quantity, each figure's panel titles unique, and a
long table scrolling in its own box with its header kept in view.

``check(driver, path)`` opens a page and returns the problems found (empty: the page reads)."""

from __future__ import annotations

import json
import re

from chromium import open_page

#: words that make an axis's quantity a count or an index: its ticks must be whole numbers
INTEGER = re.compile(
    r"\b(layer|block|step|head|token|tokens|channel|patch (row|column)|token (row|column)|probe|crop|failing elements|"
    r"valid patches|position|index|count)\b",
    re.I,
)
PAD = 0.5  # pixels two boxes may share (antialiasing) before they overlap

FACTS = """
return Array.from(document.querySelectorAll('img[data-figure]')).map(i => [i.alt, i.getAttribute('data-figure')]);
"""

PLOTLY = """
const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
return Array.from(document.querySelectorAll('div.js-plotly-plot')).map(plot => {
  const full = plot._fullLayout, axes = [];
  plot.querySelectorAll('g.cartesianlayer > g.subplot').forEach(sub => {
    const id = Array.from(sub.classList).find(c => c !== 'subplot');
    const names = id.match(/^(x\\d*)(y\\d*)$/);
    if (!names) return;
    [[names[1], 'xaxis', 'g.xaxislayer-above g[class$="tick"] text'],
     [names[2], 'yaxis', 'g.yaxislayer-above g[class$="tick"] text']]
      .forEach(([name, kind, selector]) => {
        const axis = full[kind + name.slice(1)];
        axes.push({name: id + ':' + kind, title: axis && axis.title ? axis.title.text || '' : '',
                   type: axis ? axis.type : '', values: axis && axis._vals ? axis._vals.map(v => v.x) : [],
                   labels: Array.from(sub.querySelectorAll(selector)).map(t => [t.textContent, box(t)])});
      });
  });
  const titles = (full.annotations || []).filter(a => a.xref === 'paper' && a.yref === 'paper').map(a => a.text);
  return {axes: axes, titles: titles};
});
"""

TABLES = """
return Array.from(document.querySelectorAll('div.driftscope-table'))
  .filter(b => b.querySelectorAll('tbody tr').length > 30)
  .map(b => {
    const style = getComputedStyle(b);
    const head = b.querySelector('thead th');
    const before = head.getBoundingClientRect().top - b.getBoundingClientRect().top;
    b.scrollTop = Math.min(400, b.scrollHeight);
    const scrolled = b.scrollTop;
    const after = head.getBoundingClientRect().top - b.getBoundingClientRect().top;
    const height = b.getBoundingClientRect().height;
    b.scrollTop = 0;
    return {rows: b.querySelectorAll('tbody tr').length, overflow: style.overflowY, scrolled: scrolled,
            before: before, after: after, height: height, viewport: window.innerHeight};
  });
"""


def overlaps(labels: list[tuple[str, list[float]]]) -> list[tuple[str, str]]:
    """Pairs of labels whose boxes (left, top, right, bottom) overlap by more than :data:`PAD` both ways."""
    found, ordered = [], sorted(labels, key=lambda item: item[1][0])
    for index, (text, a) in enumerate(ordered):
        for other, b in ordered[index + 1 :]:
            if b[0] >= a[2] - PAD:
                break
            if min(a[2], b[2]) - max(a[0], b[0]) > PAD and min(a[3], b[3]) - max(a[1], b[1]) > PAD:
                found.append((text, other))
    return found


def _number(text: str) -> float | None:
    cleaned = text.replace("\u2212", "-").replace(",", "").strip()
    try:
        return float(cleaned)
    except ValueError:
        return None


def static_problems(alt: str, facts: dict) -> list[str]:
    problems = []
    titles = [panel["title"] for panel in facts["panels"] if panel["title"]]
    if len(titles) != len(set(titles)):
        problems.append(f"{alt[:60]}: panel titles repeat: {sorted(t for t in set(titles) if titles.count(t) > 1)}")
    for panel in facts["panels"]:
        where = f"{alt[:50]} / {panel['title'][:40] or 'panel'}"
        for name in ("x", "y"):
            axis = panel[name]
            labels = [(tick["text"], tick["box"]) for tick in axis["ticks"]]
            problems += [f"{where}: {name} tick labels {a!r} and {b!r} overlap" for a, b in overlaps(labels)]
            if INTEGER.search(axis["label"] or "") and axis["scale"] == "linear":
                odd = [t["text"] for t in axis["ticks"] if (v := _number(t["text"])) is not None and v != round(v)]
                problems += [f"{where}: {name} axis '{axis['label']}' ticked {odd}"] if odd else []
        texts = [(text["text"], text["box"]) for text in panel["texts"]]
        problems += [f"{where}: texts {a!r} and {b!r} overlap" for a, b in overlaps(texts)]
    return problems


def plotly_problems(plot: dict, number: int) -> list[str]:
    problems = []
    titles = [t for t in plot["titles"] if t and t.strip()]
    if len(titles) != len(set(titles)):
        problems.append(f"interactive figure {number}: panel titles repeat: {titles}")
    for axis in plot["axes"]:
        where = f"interactive figure {number} {axis['name']}"
        problems += [f"{where}: tick labels {a!r} and {b!r} overlap" for a, b in overlaps(axis["labels"])]
        if INTEGER.search(axis["title"]) and axis["type"] == "linear":
            odd = [v for v in axis["values"] if isinstance(v, int | float) and v != round(v)]
            problems += [f"{where}: axis '{axis['title']}' ticked {odd}"] if odd else []
    return problems


def check(driver, path) -> list[str]:
    """Every problem of the page at ``path`` (a rendered notebook), in words."""
    open_page(driver, path.as_uri(), "document.querySelector('details') || true")
    problems = []
    for alt, raw in driver.execute_script(FACTS):
        problems += static_problems(alt or "a figure", json.loads(raw))
    for number, plot in enumerate(driver.execute_script(PLOTLY)):
        problems += plotly_problems(plot, number)
    for table in driver.execute_script(TABLES):
        if table["overflow"] not in ("auto", "scroll") or table["height"] > table["viewport"]:
            problems.append(f"a table of {table['rows']} rows does not scroll in its own box: {table}")
        elif table["scrolled"] <= 0 or abs(table["after"] - table["before"]) > 2:
            problems.append(f"a table of {table['rows']} rows loses its header when scrolled: {table}")
    return [f"{path.name}: {problem}" for problem in problems]
