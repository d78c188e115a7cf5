"""A notebook run with no output directory never replaces another run's report, and a finished run is not
executed again when its rendered notebooks are newer than its report (issue 19 items 2 and 16)."""

from __future__ import annotations

import os
import shutil

from conftest import write_params
from driftscope.cli import main
from driftscope.run import investigation
from driftscope.run.outdirs import INTERACTIVE, interactive_out_dir
from driftscope.run.params import load_parameters
from driftscope.run.report import Report


def test_an_interactive_run_of_other_parameters_writes_beside_the_run_it_would_replace(
    tmp_path, monkeypatch, rendered, capsys
):
    """The issue's case: a run of the same name with other parameters (``../parameters/demo_shapes.yaml`` from
    ``notebooks/``) went into the demo's directory and replaced its report."""
    _, out = rendered
    monkeypatch.setattr(investigation, "project_root", lambda source=None: tmp_path)
    theirs = load_parameters(out.parent / "p.yaml")
    default = investigation.default_out_dir(theirs)
    assert default == tmp_path / "outputs" / "nocommit" / "cli-check"
    default.mkdir(parents=True)
    shutil.copy(out / "report.json", default / "report.json")
    before = (default / "report.json").read_bytes()
    assert interactive_out_dir(theirs, default, log=lambda m: None) == default  # the same run: reused there
    ours = load_parameters(write_params(tmp_path / "q.yaml", "cli-check", ["transformers:f32", "mlx:f32"]))
    assert ours.digest != theirs.digest
    capsys.readouterr()
    report = investigation.investigate(ours, None, reuse=True)
    elsewhere = tmp_path / "outputs" / INTERACTIVE / "nocommit" / f"cli-check-{ours.digest}"
    assert report.directory == elsewhere and report.status == "complete"
    assert (default / "report.json").read_bytes() == before
    assert f"holds another run's report: this one writes to {elsewhere}" in capsys.readouterr().out
    # run again from the notebook: it finds its own finished run there and reuses it
    again = investigation.investigate(ours, None, reuse=True)
    assert again.directory == elsewhere and again.data["created"] == report.data["created"]


def test_an_unreadable_report_is_left_alone_too(tmp_path):
    default = tmp_path / "outputs" / "abc" / "run"
    default.mkdir(parents=True)
    (default / "report.json").write_text("{ not json")
    params = load_parameters(write_params(tmp_path / "p.yaml", "run", ["transformers:f32", "mlx:f32"]))
    said = []
    chosen = interactive_out_dir(params, default, log=said.append)
    assert chosen == tmp_path / "outputs" / INTERACTIVE / "abc" / f"run-{params.digest}"
    assert "unreadable" in said[0]
    assert interactive_out_dir(params, tmp_path / "outputs" / "abc" / "new", log=said.append).name == "new"


def test_a_rendered_run_is_not_executed_again_unless_asked(rendered_copy, capsys):
    """``driftscope run`` of a finished run whose notebooks rendered after its report reuses them untouched;
    a report newer than its pages (written again) makes them stale."""
    from driftscope.views.run_state import rendered_current

    code, out = rendered_copy  # the run is executed again and its report's time changed: a copy of the shared one
    params_path = out.parent / "p.yaml"
    pages = sorted(out.glob("0*.*html")) + sorted(out.glob("0*.ipynb"))
    assert len(pages) == 9
    stamps = {page: page.stat().st_mtime_ns for page in pages}
    capsys.readouterr()
    assert main(["run", str(params_path), "--out", str(out)]) == code
    said = capsys.readouterr()
    assert "reusing the finished run" in said.out + said.err
    assert {page: page.stat().st_mtime_ns for page in pages} == stamps
    params = load_parameters(params_path)
    assert rendered_current(out, params)
    report = out / "report.json"
    written = report.stat()
    newest = max(page.stat().st_mtime for page in pages)
    try:
        os.utime(report, (newest + 10, newest + 10))
        assert not rendered_current(out, params)
    finally:
        os.utime(report, ns=(written.st_atime_ns, written.st_mtime_ns))
    assert rendered_current(out, params) and Report.load(out).status == "complete"


def test_notebooks_03_and_05_run_with_their_defaults_from_the_notebooks_folder(tmp_path):
    """Item 2: in ``notebooks/`` (where the lab's kernel runs) 03's default image resolves at the repository
    root, and 05 with nothing to compare (a fresh clone) says so instead of raising."""
    import json

    from conftest import ROOT
    from driftscope.views.execution import execute
    from driftscope.views.pages import to_html

    empty = tmp_path / "outputs"
    empty.mkdir()
    for name, parameters in (("03_window_geometry", {}), ("05_commit_trend", {"out_root": str(empty)})):
        executed = execute(name, tmp_path / name, parameters, cwd=ROOT / "notebooks", log_output=False)
        cells = json.loads(executed.read_text())["cells"]
        outputs = [o for c in cells if c["cell_type"] == "code" for o in c["outputs"]]
        assert not [o for o in outputs if o["output_type"] == "error"], name
        if name == "05_commit_trend":
            page = to_html(executed)[1].read_text()
            assert "Nothing to compare yet" in page and "need runs of two commits" in page
