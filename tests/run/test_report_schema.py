"""A report is checked against its schema when it is loaded: one that was edited or written by something else
says which field is wrong, in every command (issue 30 item 13: ``show`` gave "internal error: AttributeError" for
a string verdict and "every compared stage is within the contract" for ``verdict.status: banana``)."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import ROOT
from driftscope.cli import main

CONTRACT = ROOT / "parameters" / "contracts" / "default.yaml"


@pytest.fixture
def run_copy(rendered, tmp_path):
    _, out = rendered
    target = tmp_path / "run"
    shutil.copytree(out, target, ignore=shutil.ignore_patterns("*.html", "*.ipynb"))
    return target


def edit(run, change) -> None:
    path = run / "report.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda d: d.update(verdict="pass"), "['verdict']: 'pass' is not of type 'object'"),
        (lambda d: d["verdict"].update(status="banana"), "['verdict']['status']: 'banana' is not one of"),
        (lambda d: d.pop("rows"), "the report: 'rows' is a required property"),
        (lambda d: d.update(status="finished"), "['status']: 'finished' is not one of"),
        (lambda d: d["rows"][3].update(stage=7), "['rows'][3]['stage']: 7 is not of type 'string'"),
    ],
)
def test_show_and_rejudge_name_what_is_wrong_with_a_report(run_copy, capsys, change, where):
    edit(run_copy, change)
    rejudge = ["rejudge", str(run_copy), "--contract", str(CONTRACT), "--out", str(run_copy / "again.json")]
    for command in (["show", str(run_copy)], rejudge):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "is not a valid driftscope report" in err and where in err, err
        assert "internal error" not in err and "Traceback" not in err


def test_rejudge_into_an_existing_directory_writes_its_report_json(run_copy, tmp_path, capsys):
    """``rejudge --out DIR`` gave "internal error: IsADirectoryError"."""
    target = tmp_path / "rejudged"
    target.mkdir()
    code = main(["rejudge", str(run_copy), "--contract", str(CONTRACT), "--out", str(target)])
    assert code in (0, 1), capsys.readouterr().err
    report = json.loads((target / "report.json").read_text())
    assert report["status"] == "complete" and report["rows"]
    assert main(["show", str(target / "report.json")]) == code
