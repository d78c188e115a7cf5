"""An error is said once, with its fix, the traceback folded below it (issue 34 item 3): in the kernel the lab
runs (a mistyped parameter file), in a failed run's HTML read in Chromium (no 40-line traceback on top, no page
prose about a run that never happened), and in the command line's summary (one ``fix:`` line, not five)."""

from __future__ import annotations

import re

import nbformat
import pytest
from chromium import chromium, needs_chromium, open_page
from conftest import ROOT
from driftscope.views.failure import NOT_RUN, fold_errors, split, summary_lines


def _run_cells(sources: list[str], cwd) -> list:
    """Execute ``sources`` in a fresh kernel of the project (as the lab does); the executed cells."""
    from driftscope.views.execution import kernel_name
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    NotebookClient(
        notebook, kernel_name=kernel_name(), allow_errors=True, resources={"metadata": {"path": cwd}}
    ).execute()
    return notebook.cells


def test_a_mistyped_parameter_file_in_the_kernel_is_one_message_with_its_fix(tmp_path):
    cells = _run_cells(
        [
            "from driftscope.views import notebook\nnotebook.setup()",
            "from driftscope.run.params import load_parameters\nload_parameters('parameters/demo_shape.yaml')",
        ],
        str(ROOT / "notebooks"),
    )
    outputs = cells[1].outputs
    assert [o.output_type for o in outputs] == ["error", "display_data"]
    error, folded = outputs
    assert error.ename == "ParameterError"  # the cell still fails: papermill and the CLI see it
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in error.traceback]
    assert len(lines) == 2, lines  # the message and its fix, nothing else
    assert lines[0].startswith("ParameterError: parameter file parameters/demo_shape.yaml does not exist")
    assert lines[1].startswith("  fix: pass an absolute path") and "parameters/demo_q4.yaml" in lines[1]
    html = folded.data["text/html"]
    assert html.startswith("<details class='driftscope-traceback'>") and "<details open" not in html
    assert "Traceback (" in html and "load_parameters" in html  # the whole traceback, folded


def test_any_error_in_an_executed_notebook_is_folded_when_rendered():
    """An error the kernel did not fold (any type, a kernel before this one): its message first, traceback
    folded; papermill's banners gone; the cells that never ran replaced by one line."""
    banner = {"tags": ["papermill-error-cell-tag"]}
    trace = ["\x1b[0;31m----\x1b[0m", "Traceback (most recent call last)", *[f"  frame {i}" for i in range(30)]]
    trace.append("\x1b[0;31mKeyError\x1b[0m: 'tolerance'")
    failing = nbformat.v4.new_code_cell("boom()")
    failing.outputs = [nbformat.v4.new_output("error", ename="KeyError", evalue="'tolerance'", traceback=trace)]
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("An Exception was encountered", metadata=banner),
            nbformat.v4.new_markdown_cell("# Title"),
            nbformat.v4.new_markdown_cell("Execution using papermill encountered an exception", metadata=banner),
            failing,
            nbformat.v4.new_markdown_cell("Every runtime ran on the same processor output"),
            nbformat.v4.new_code_cell("progress"),
        ]
    )
    shown = fold_errors(notebook)
    assert [c.source for c in shown.cells] == ["# Title", "boom()", NOT_RUN]
    error, folded = shown.cells[1].outputs
    assert [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in error.traceback] == ["KeyError: 'tolerance'"]
    assert "Traceback (33 lines)" in folded.data["text/html"] and "frame 29" in folded.data["text/html"]
    assert len(notebook.cells) == 6  # the executed notebook itself is left as it is
    assert fold_errors(shown).cells[1].outputs == shown.cells[1].outputs  # folded once


def test_fixes_are_said_once():
    assert split("a problem\n  fix: do x\n  fix: do x\n  fix: or y") == ("a problem", ["do x", "or y"])
    lines = summary_lines(
        {
            "investigation": "HypothesisPatchError: patch raised\n  fix: fix the patch",
            "01_stage_parity": "the investigation stopped (HypothesisPatchError at capture:mlx:f32); rendered",
            "02_layer_drilldown": "not run: the investigation stopped at capture:mlx:f32",
            "04_negative_controls": "KeyError: 'x'",
        },
        "capture:mlx:f32",
        "HypothesisPatchError",
    )
    assert lines == [
        "could not run: investigation: HypothesisPatchError (stopped at capture:mlx:f32; its message and fix are "
        "above)",
        "could not run: 04_negative_controls: KeyError: 'x'",
        "notebooks: 01_stage_parity rendered with the investigation's error; 02_layer_drilldown not run",
    ]


def test_the_command_line_says_the_error_and_its_fix_once(crashed):
    code, printed, _ = crashed
    assert code == 2
    assert printed.count("fix:") == 1, printed
    assert printed.count("planted crash") == 1, printed
    assert "could not run: investigation: HypothesisPatchError (stopped at capture:mlx:f32" in printed
    assert "notebooks: 01_stage_parity rendered with the investigation's error; 02_layer_drilldown not run" in printed


@needs_chromium
@pytest.mark.parametrize("kind", ["html", "nocode.html"])
def test_a_failed_runs_page_opens_with_the_message_and_its_fix(crashed, kind):
    _, _, out = crashed
    with chromium(1400, 900) as browser:
        open_page(browser, (out / f"01_stage_parity.{kind}").as_uri())
        shown = browser.execute_script(
            """
            const error = document.querySelector('.jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]')
              || Array.from(document.querySelectorAll('pre')).find(p => p.innerText.includes('InvestigationFailed'));
            const folded = Array.from(document.querySelectorAll('details.driftscope-traceback'));
            return {text: document.body.innerText, errorTop: error && error.getBoundingClientRect().top,
              errorText: error && error.innerText, folded: folded.map(d => [d.open, d.innerText.length]),
              foldedTop: folded.length && folded[0].getBoundingClientRect().top};
            """
        )
    text = shown["text"]
    assert shown["errorText"].startswith("InvestigationFailed: the investigation this run waited for stopped")
    assert "planted crash" in shown["errorText"] and shown["errorText"].count("fix:") == 1
    assert 0 < shown["errorTop"] < 900 and shown["errorTop"] < shown["foldedTop"] < 900  # message, then the fold
    assert [opened for opened, _ in shown["folded"]] == [False]  # the traceback, closed
    assert text.count("fix:") == 1 and text.count("planted crash") == 1
    assert "Traceback (most recent call last)" not in text  # folded, so not shown
    assert "An Exception was encountered" not in text and "Execution using papermill" not in text
    assert "Every runtime of the parameter file ran" not in text and NOT_RUN.strip("*") in text
