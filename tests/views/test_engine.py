"""The papermill engine the notebooks execute with (issue 38 item 3): the executed notebook is written when it
starts and once at the end, not before and after every cell, and holds what papermill's own engine writes; its two
pages, rendered at once, are the pages rendered one after the other."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import nbformat
import pytest

#: A cell that reports how many cells of the executed notebook on disk had started when it ran.
ON_DISK = (
    "import json\n"
    "cells = json.load(open(target, encoding='utf-8'))['cells']\n"
    "print(sum(1 for c in cells if c['metadata'].get('papermill', {}).get('start_time')), 'cells started on disk')"
)


def _notebook(path, *sources):
    parameters = nbformat.v4.new_code_cell('target = ""', metadata={"tags": ["parameters"]})
    cells = [nbformat.v4.new_markdown_cell("# a *page*"), parameters]
    cells += [nbformat.v4.new_code_cell(source) for source in sources]
    notebook = nbformat.v4.new_notebook(
        cells=cells,
        metadata={"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}},
    )
    nbformat.write(notebook, str(path))
    return path


def _joined(value):
    """A multi-line string as nbformat stores it (a list of lines), or a bundle of them, read as text."""
    if isinstance(value, dict):
        return {key: _joined(part) for key, part in value.items()}
    return "".join(value) if isinstance(value, list) else value


def _outputs(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    return [[_joined(o.get("text") or o.get("data")) for o in c.get("outputs", [])] for c in code]


def test_the_executed_notebook_is_written_at_the_start_and_the_end_only(tmp_path):
    """A cell reads the executed notebook from disk while it runs: papermill's engine has written it before and after
    each cell (the heading, the parameters, papermill's copy of them, the cell before and this one had started: 5),
    this engine
    only at the start (none had). The notebook written at the end says the same as papermill's, but for that count."""
    import papermill
    from driftscope.views.execution import execute, kernel_config, kernel_name

    source = _notebook(tmp_path / "probe.ipynb", "x = 6 * 7\nx", ON_DISK, "print('after', x)")
    theirs = tmp_path / "papermill.ipynb"
    papermill.execute_notebook(
        str(source),
        str(theirs),
        parameters={"target": str(theirs)},
        kernel_name=kernel_name(),
        progress_bar=False,
        config=kernel_config(),
    )
    out = tmp_path / "out"
    ours = execute("probe", out, {"target": str(out / "probe.ipynb")}, cwd=tmp_path, notebook_dir=tmp_path)

    expected, got = _outputs(theirs), _outputs(ours)
    assert expected[3] == ["5 cells started on disk\n"] and got[3] == ["0 cells started on disk\n"]
    assert got[:3] + got[4:] == expected[:3] + expected[4:] == [[], [], [{"text/plain": "42"}], ["after 42\n"]]
    cells = json.loads(ours.read_text(encoding="utf-8"))["cells"]
    assert [c["metadata"]["papermill"]["status"] for c in cells] == ["completed"] * 6
    assert all(c["metadata"]["papermill"]["duration"] is not None for c in cells if c["cell_type"] == "code")
    assert [c.get("execution_count") for c in cells if c["cell_type"] == "code"] == [1, 2, 3, 4, 5]


def test_a_failing_cell_leaves_the_executed_notebook_with_its_error(tmp_path):
    """The notebook stops at a failing cell: papermill's final write still happens (its error marker and the
    traceback in place), the cells after it pending."""
    from driftscope.views.execution import execute
    from papermill.exceptions import PapermillExecutionError

    _notebook(tmp_path / "fails.ipynb", "1 / 0", "print('never')")
    out = tmp_path / "out"
    with pytest.raises(PapermillExecutionError, match="ZeroDivisionError"):
        execute("fails", out, {}, cwd=tmp_path, notebook_dir=tmp_path)
    cells = json.loads((out / "fails.ipynb").read_text(encoding="utf-8"))["cells"]
    failed = next(c for c in cells if c["cell_type"] == "code" and _joined(c["source"]) == "1 / 0")
    assert failed["outputs"][0]["ename"] == "ZeroDivisionError"
    assert failed["metadata"]["papermill"]["status"] == "failed"
    assert cells[-1]["metadata"]["papermill"]["status"] == "pending" and not cells[-1]["outputs"]
    assert any("papermill-error-cell-tag" in c["metadata"].get("tags", []) for c in cells)  # papermill's marker


def test_the_pages_rendered_at_once_are_the_pages_rendered_in_turn(tmp_path):
    """``to_html`` renders the no-code page in a forked child beside the other: both are what rendering them one
    after the other in this process writes, byte for byte."""
    from driftscope.views.execution import execute
    from driftscope.views.pages import TEMPLATES, _page, to_html
    from driftscope.views.warm import Exporters

    _notebook(tmp_path / "page.ipynb", "print('shown')\n'a value'", "import math\nmath.pi")
    executed = execute("page", tmp_path / "out", {"target": "x"}, cwd=tmp_path, notebook_dir=tmp_path)
    pages = Exporters(TEMPLATES)
    html, nocode = to_html(executed, pages)
    notebook = nbformat.read(str(executed), as_version=4)
    for exclude, written in ((False, html), (True, nocode)):
        again = tmp_path / f"again{int(exclude)}.html"
        _page(notebook, executed, pages, exclude, again)
        assert written.read_text(encoding="utf-8") == again.read_text(encoding="utf-8")
    shown, bare = html.read_text(encoding="utf-8"), nocode.read_text(encoding="utf-8")
    assert "3.14159" in bare and "3.14159" in shown
    assert "given to this run" in shown and "given to this run" not in bare  # the parameters line: code only


FORKS = """
import json, os, sys
from pathlib import Path
from driftscope.views.pages import fork, succeeded
out = Path(sys.argv[1])
ran = fork(lambda: (out / "child").write_text(str(os.getpid())))
failed = fork(lambda: 1 / 0)
sys.modules["jax"] = sys  # a process that imported JAX: no fork
print(json.dumps({"ran": succeeded(ran), "failed": succeeded(failed), "with_jax": fork(lambda: None)}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the pages render at once on Linux only")
def test_the_no_code_page_is_rendered_by_a_child_that_says_if_it_failed(tmp_path):
    """In a fresh process (one without JAX or MLX): the work runs in another process, a child that raised says so
    (the parent then renders that page itself), and a process that imported JAX does not fork."""
    done = subprocess.run([sys.executable, "-c", FORKS, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"ran": True, "failed": False, "with_jax": None}
    assert int((tmp_path / "child").read_text()) != os.getpid()
