"""``driftscope trend`` names its own options in its errors (``--from``/``--to``), notebook 05 its parameters
(``rev_a``/``rev_b``): each user is told what they can pass (issue 34, item 8)."""

from __future__ import annotations

import pytest
from driftscope.cli import main
from driftscope.errors import ParameterError
from driftscope.views.history import choose


def commits(root, *names):
    for name in names:
        (root / name / "demo").mkdir(parents=True)
        (root / name / "demo" / "report.json").write_text("{}")  # only its presence counts here
    return root


def test_trend_with_one_commit_suggests_from_and_to(tmp_path, capfd):
    root = commits(tmp_path / "outputs", "aaaa11112222")
    assert main(["trend", "--out-root", str(root)]) == 2
    err = capfd.readouterr().err
    assert "need runs of two commits" in err
    assert "--from and --to" in err and "rev_a" not in err and "rev_b" not in err


def test_trend_without_an_older_commit_suggests_from(tmp_path, capfd):
    root = commits(tmp_path / "outputs", "aaaa11112222", "bbbb11112222")  # unknown to git: ordered by name
    assert main(["trend", "--out-root", str(root), "--to", "aaaa11112222"]) == 2
    err = capfd.readouterr().err
    assert "no commit before aaaa11112222" in err and "(or pass --from)" in err and "rev_a" not in err


def test_notebook_05_keeps_its_parameter_names(tmp_path):
    root = commits(tmp_path / "outputs", "aaaa11112222")
    with pytest.raises(ParameterError, match="rev_a and rev_b"):
        choose(root, tmp_path)
