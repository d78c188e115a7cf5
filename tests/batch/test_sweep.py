"""The sweep (issue 48 item 3): every model type the generic family has a tester for, investigated as one command,
whose table the README shows. The default suite sweeps the model types no fix test already runs; ``-m slow``
sweeps them all and checks every row against docs/sweep.json."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

RECORDED = json.loads((ROOT / "docs" / "sweep.json").read_text())["rows"]
BY_TYPE = {row["model_type"]: row for row in RECORDED}
#: the model types the default suite sweeps here: the ones that pass (the failing ones have a fix test each)
PASSING = [row["model_type"] for row in RECORDED if row["verdict"] == "pass"]


def _compare(row, recorded) -> None:
    assert row.verdict == recorded["verdict"], (row.model_type, row.conclusion)
    assert row.first_divergence == recorded["first_divergence"], row.model_type
    assert row.fixed == recorded["fixed"] and row.fixed_divergence == recorded["fixed_divergence"], row.model_type


def test_the_recorded_sweep_names_every_model_type_the_generic_family_has_a_tester_for():
    from driftscope.families.generic.testers import model_types

    assert sorted(BY_TYPE) == sorted(model_types())
    for row in RECORDED:  # each passes, or names where it first diverges and the fix that closes it
        assert row["verdict"] == "pass" or (row["first_divergence"] and row["fixed_by"]), row


def test_the_readme_family_table_is_drawn_from_the_registry_and_the_recorded_sweep():
    done = subprocess.run(
        [sys.executable, "scripts/families_table.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_sweep_command_writes_its_table_and_the_runs_agree_with_the_record(tmp_path):
    from driftscope.cli import main

    assert main(["sweep", *PASSING, "--out", str(tmp_path)]) == 0
    table = (tmp_path / "sweep.md").read_text()
    assert all(f"`{model_type}` | pass" in table for model_type in PASSING)
    from driftscope.batch.sweep import SweepRow

    for data in json.loads((tmp_path / "sweep.json").read_text())["rows"]:
        _compare(SweepRow(**data), BY_TYPE[data["model_type"]])


def test_a_model_type_without_a_tester_is_refused_naming_those_it_has(tmp_path, capsys):
    from driftscope.cli import main

    assert main(["sweep", "no_such_type", "--out", str(tmp_path)]) == 2
    assert "no tester checkpoint for no_such_type" in capsys.readouterr().err


@pytest.mark.slow
def test_every_model_type_sweeps_as_recorded(tmp_path):
    from driftscope.batch.sweep import run_sweep

    for row in run_sweep([], tmp_path, docs=False, log=lambda message: None):
        _compare(row, BY_TYPE[row.model_type])
