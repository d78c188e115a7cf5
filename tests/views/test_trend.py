"""``driftscope diff A B --fail-on worse`` (views.trend): a run, or a stage judged in A, missing in B is a failure of
the comparison unless ``--allow-missing``, and so is a run of B that did not complete (issue 49 item 6); a factor
that judges nothing is refused (item 7); the stage-by-commit heat map draws exact zeros as such (issue 53 item 5). The
reports are written by hand: only what diff and the heat map read."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import pytest
from driftscope.cli import main


def report(root: Path, commit: str, name: str, errors: dict[str, float], status: str = "complete") -> None:
    rows = [
        {
            "stage": stage,
            "status": "pass",
            "pair": "mlx:f32",
            "reference": "transformers:f32",
            "candidate": "mlx:f32",
            "position": position,
            "max_abs": value,
        }
        for position, (stage, value) in enumerate(errors.items())
    ]
    data = {
        "schema_version": 1,
        "status": status,
        "name": name,
        "pid": 0,
        "verdict": {"status": "pass" if status == "complete" else "error", "per_candidate": {}, "reasons": []},
        "rows": rows,
        "pairs": [{"key": "mlx:f32", "reference": "transformers:f32", "candidate": "mlx:f32"}],
        "stage_plan": [{"id": stage} for stage in errors],
        "contract": {"default": {"atol": 0.08, "rtol": 0.08}},
        "parameters": {"name": name},
    }
    (root / commit / name).mkdir(parents=True)
    (root / commit / name / "report.json").write_text(json.dumps(data))


def diff(capsys, root: Path, *extra: str) -> tuple[int, str]:
    code = main(["diff", "a", "b", "--out-root", str(root), "--fail-on", "worse", *extra])
    return code, capsys.readouterr().out


def test_49_6_a_run_or_stage_missing_in_the_later_commit_fails_the_gate_unless_allowed(tmp_path, capsys):
    same = {"vision.block.0": 1e-5, "vision.block.1": 2e-5}
    report(tmp_path, "a", "one", same)
    report(tmp_path, "a", "two", same)
    report(tmp_path, "b", "one", same)
    code, out = diff(capsys, tmp_path)
    assert code == 1 and "MISSING two: no run in b" in out, out
    assert diff(capsys, tmp_path, "--allow-missing")[0] == 0
    report(tmp_path, "b", "two", {"vision.block.0": 1e-5})  # one stage judged in a is not judged in b
    code, out = diff(capsys, tmp_path)
    assert code == 1 and "MISSING two: 1 stage(s) judged in a are missing in b (e.g. mlx:f32 vision.block.1)" in out
    assert diff(capsys, tmp_path, "--allow-missing")[0] == 0
    (tmp_path / "b" / "two" / "report.json").unlink()
    (tmp_path / "b" / "two").rmdir()
    report(tmp_path, "b", "two", same, status="running")  # a run killed in b (pid 0: no such process)
    code, out = diff(capsys, tmp_path)
    assert code == 1 and "two: its run in b did not complete (dead)" in out, out
    report(tmp_path, "b", "three", same)  # a run new in b is no failure
    assert main(["diff", "a", "b", "--out-root", str(tmp_path)]) == 0  # without --fail-on: a report, exit 0


def test_49_7_a_diff_factor_past_any_scale_is_refused(tmp_path, capsys):
    report(tmp_path, "a", "one", {"vision.block.0": 1e-5})
    report(tmp_path, "b", "one", {"vision.block.0": 1e-1})  # 10000x worse
    assert diff(capsys, tmp_path)[0] == 1
    assert main(["diff", "a", "b", "--out-root", str(tmp_path), "--fail-on", "worse", "--factor", "1e300"]) == 2
    assert "judges nothing" in capsys.readouterr().err


def test_49_6_two_run_directories_of_one_run_name_are_not_one_run(tmp_path, capsys):
    """A run directory copied under another name in the earlier commit: keyed by the run's name, one of the two
    vanished from the comparison. Which is the run is not known: the comparison cannot be made (exit 2)."""
    import shutil

    same = {"vision.block.0": 1e-5}
    report(tmp_path, "a", "one", same)
    shutil.copytree(tmp_path / "a" / "one", tmp_path / "a" / "copy")
    report(tmp_path, "b", "one", same)
    code, out = diff(capsys, tmp_path)
    assert code == 2 and "two run directories hold a run named 'one': " in out


def test_53_5_the_trend_heatmap_draws_exact_zeros_white_not_at_1e_minus_12(tmp_path):
    """An exactly equal stage is its own colour (white, below the scale, counted in the colour bar's label), the
    scale spans only the measured nonzero errors, and a stage one commit did not capture is grey."""
    import math

    import numpy as np
    from driftscope.views.trend import stage_commit_heatmap

    report(tmp_path, "a", "demo", {"vision.patch_embed": 0.0, "vision.block.0": 1e-3, "vision.block.1": 1e-1})
    report(tmp_path, "b", "demo", {"vision.patch_embed": 0.0, "vision.block.0": 1e-2})
    figure = stage_commit_heatmap(tmp_path, ["a", "b"], "demo")
    axis = figure.axes[0]
    (image,) = axis.get_images()
    grid = np.ma.getdata(image.get_array())
    low, high = image.get_clim()
    assert (low, high) == (math.log10(1e-3), math.log10(1e-1))  # not stretched down to 1e-12 by the zeros
    assert np.all(grid[0] < low)  # the exact zeros: below the scale, drawn as the colour map's "under"
    assert image.cmap.get_under() == pytest.approx((1.0, 1.0, 1.0, 1.0))
    assert grid[1].tolist() == pytest.approx([-3.0, -2.0]) and np.isnan(grid[2, 1])  # b did not capture block 1
    assert image.cmap.get_bad() == pytest.approx(matplotlib.colors.to_rgba("#d9d9d9"))
    (bar,) = [a for a in figure.axes if a is not axis]
    assert "white: exactly equal, 2 cells" in bar.get_ylabel()
