"""``driftscope show`` in a terminal: plain text, no Markdown escapes, with each pair's cause and lineage (issue 51
item 7)."""

from __future__ import annotations

import pytest
from driftscope.core.markup import code, text
from driftscope.run.report import Report
from driftscope.views.cause import cause_text
from driftscope.views.terminal import plain, summary, summary_text


@pytest.mark.parametrize("value", ["mlx:f16", "a_b*c`d|e", "<script>x</script>", "``two``", "[0, 1]", "back\\slash"])
def test_plain_shows_what_the_markdown_renders(value):
    assert plain(code(value)) == value
    assert plain(code(value, in_table=True)) == value
    assert plain(text(value)) == value
    assert plain(f"**{text(value)}** at {code(value)}") == f"{value} at {value}"


def test_show_in_a_terminal_prints_each_pair_with_its_cause_and_lineage(rendered):
    _, out = rendered
    report = Report.load(out / "report.json")
    shown = summary_text(report)
    assert shown.splitlines()[0].startswith(f"cli-check: {report.verdict.upper()}  (commit ")
    first = report.data["first_divergence"]["mlx:bf16"]
    lineage = report.data["lineage"]["mlx:bf16"]
    block = shown.split("mlx:bf16 vs transformers:f32: fail\n")[1].split("\n\n")[0]
    assert f"first divergence {first['stage']}: {first['failures']}/{first['elements']} elements" in block
    assert f"suspected cause  {cause_text(report, 'mlx:bf16')}" in block
    assert f"lineage          {lineage['unit']} row {lineage['raster_row']} (raster order)" in block
    assert f"{lineage['stages'][0]['stage']} " in block and f"-> {lineage['stages'][-1]['stage']} " in block
    for markdown in ("**", "`", "\\_", "\\|", "&lt;"):
        assert markdown not in shown
    assert summary(report, "markdown").startswith("**Verdict: ")  # piped, or asked for: the Markdown summary
    assert summary(report, "auto") == summary(report, "markdown")  # pytest's stdout is not a terminal
