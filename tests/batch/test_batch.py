"""Per-commit batches, the evidence index, commit diffs, the CI gate, Dask scale-out, and a real browser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from xml.etree import ElementTree

import pytest
import yaml
from chromium import chromium, open_page
from conftest import ROOT, TINY
from driftscope.batch.runner import run_batch
from driftscope.cli import main
from driftscope.errors import ParameterError
from driftscope.views.trend import diff_commits, resolve_commit_dir

CHECKER = ROOT / "fixtures" / "images" / "checkerboard_140.png"
SHAPES_336 = ROOT / "fixtures" / "images" / "shapes_336.png"
NO_OP = """def perturb(model):
    return model
"""
PERTURB = """from driftscope.families.hypotheses import scale_block_output


def perturb(model):
    return scale_block_output(model, block=5, factor=1.5)
"""
LOOSE = "name: loose\ndefault: {atol: 0.1, rtol: 0.1}\n"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def _params(name: str, patch: str | None = None, image: Path | str = CHECKER, **extra) -> dict:
    mlx = {"runtime": "mlx", "policy": "f32"}
    if patch:
        mlx["patch"] = patch
    return {
        "name": name,
        "checkpoint": str(TINY),
        "images": [str(image)],
        "runtimes": ["transformers:f32", mlx],
        "stages": {"blocks": True},
        "replay": False,
        "notebooks": ["01_stage_parity"],
        **extra,
    }


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def two_commits(tmp_path_factory, tiny_checkpoint_dir):
    """A repository whose parameter file is the same in both commits (repository-relative paths, the
    checkpoint git-ignored); commit B's hypothesis patch perturbs MLX block 5 and its contract is looser."""
    repo = tmp_path_factory.mktemp("params-repo")
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "ci@example.invalid")
    _git(repo, "config", "user.name", "ci")
    (repo / ".gitignore").write_text("fixtures/checkpoints/\n")
    (repo / "fixtures" / "checkpoints").mkdir(parents=True)
    (repo / "fixtures" / "checkpoints" / "tiny").symlink_to(TINY)
    (repo / "images").mkdir()
    shutil.copy(CHECKER, repo / "images" / "probe.png")
    shutil.copy(CHECKER, repo / "images" / "later.png")
    (repo / "contracts").mkdir()
    (repo / "contracts" / "run.yaml").write_text("name: run\ndefault: {atol: 0.08, rtol: 0.08}\n")
    (repo / "perturb.py").write_text(NO_OP)
    params = _params("shapes", "perturb.py:perturb", "images/probe.png", contract="contracts/run.yaml")
    _write(repo / "shapes.yaml", dict(params, checkpoint="fixtures/checkpoints/tiny"))
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "A")
    commit_a = _git(repo, "rev-parse", "--short=12", "HEAD")
    (repo / "perturb.py").write_text(PERTURB)
    (repo / "contracts" / "run.yaml").write_text(LOOSE)
    shutil.copy(SHAPES_336, repo / "images" / "later.png")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "B: perturb block 5, loosen the contract")
    commit_b = _git(repo, "rev-parse", "--short=12", "HEAD")
    out_root = tmp_path_factory.mktemp("outputs")
    results = {}
    for commit in (commit_a, commit_b):
        results[commit] = run_batch([repo / "shapes.yaml"], commit=commit, out_root=out_root, log=lambda m: None)
    return repo, out_root, commit_a, commit_b, results


def test_both_commits_get_their_directories_index_and_junit(two_commits):
    repo, out_root, a, b, results = two_commits
    for commit in (a, b):
        directory = out_root / commit
        for name in (
            "index.html",
            "junit.xml",
            "shapes/report.json",
            "shapes/01_stage_parity.html",
            "shapes/01_stage_parity.nocode.html",
        ):
            assert (directory / name).exists(), (commit, name)
    assert results[a].code == 0 and results[b].code == 1
    junit = ElementTree.parse(out_root / b / "junit.xml").getroot()
    assert junit.get("tests") == "1" and junit.get("failures") == "1"
    assert junit.find("testcase").find("failure") is not None
    index = (out_root / b / "index.html").read_text()
    assert "vision.block.5" in index and 'href="shapes/01_stage_parity.html"' in index
    assert "data:image/png;base64," in index and "http" not in index.split("<body>")[1]  # self-contained
    report = json.loads((out_root / b / "shapes" / "report.json").read_text())
    assert report["runtimes"][1]["patch"]["target"] == "perturb.py:perturb"
    assert not list(Path(tempfile.gettempdir()).glob(f"driftscope-{a}-*"))  # the worktrees are gone
    assert _git(repo, "worktree", "list").count("\n") == 0


def test_commit_runs_are_reused_and_keep_repository_relative_parameters(two_commits):
    """Items 7 and 10: a second batch of the same commit reuses the run (no temporary path in its identity);
    JUnit reports the original duration, the run name as classname, the commit as a property."""
    repo, out_root, a, _, results = two_commits
    stamp = (out_root / a / "shapes" / "report.json").stat().st_mtime_ns
    result = run_batch([repo / "shapes.yaml"], commit=a, out_root=out_root, log=lambda m: None)
    assert result.summaries[0]["reused"] and (out_root / a / "shapes" / "report.json").stat().st_mtime_ns == stamp
    saved = (out_root / a / "shapes" / "parameters.yaml").read_text()
    report = json.loads((out_root / a / "shapes" / "report.json").read_text())
    assert report["parameters"]["checkpoint"] == "fixtures/checkpoints/tiny"
    assert report["parameters"]["images"] == ["images/probe.png"]
    assert "driftscope-" not in saved and tempfile.gettempdir() not in json.dumps(report["parameters"])
    case = ElementTree.parse(out_root / a / "junit.xml").getroot().find("testcase")
    original = results[a].summaries[0]["seconds"]
    assert original > 1 and float(case.get("time")) == pytest.approx(original, abs=0.01)
    assert case.get("classname") == "shapes" and case.get("name") == "shapes"
    assert {p.get("name"): p.get("value") for p in case.iter("property")}["commit"] == a


def test_commit_runs_todays_parameter_file_and_the_index_keeps_the_other_runs(two_commits):
    """Items 6 and 3: a parameter file that only exists today runs in commit A's tree (A's image), named by
    its run name; A's index and JUnit then list both of A's runs."""
    repo, out_root, a, _, _ = two_commits
    later = _write(repo / "later.yaml", dict(_params("later-run", image="images/later.png"), notebooks=[]))
    later.write_text(later.read_text().replace(str(TINY), "fixtures/checkpoints/tiny"))
    result = run_batch([later], commit=a, out_root=out_root, log=lambda m: None)
    summary = result.summaries[0]
    assert summary["verdict"] == "pass" and not summary["error"], summary
    report = json.loads((out_root / a / "later-run" / "report.json").read_text())
    assert report["inputs"]["image_sizes"] == [[140, 140]]  # A's later.png; today's is 336x336
    junit = ElementTree.parse(out_root / a / "junit.xml").getroot()
    assert sorted(case.get("name") for case in junit.iter("testcase")) == ["later-run", "shapes"]
    index = (out_root / a / "index.html").read_text()
    assert "<b>later-run</b>" in index and "<b>shapes</b>" in index and "2 run(s): 2 pass" in index
    assert [e["name"] for e in result.entries] == ["later-run", "shapes"] and result.code == 0


def test_diff_lists_the_contract_first_and_stages_in_execution_order(two_commits, capsys):
    repo, out_root, a, b, _ = two_commits
    diff = diff_commits(resolve_commit_dir(out_root, a), resolve_commit_dir(out_root, b[:8]))
    run = diff["runs"]["shapes"]
    worse = {c["stage"] for c in run["stages"] if c["change"] == "worse"}
    assert {"vision.block.5", "vision.block.6", "vision.block.7", "vision.merger"} <= worse
    assert not any(
        c["stage"] in ("vision.block.0", "vision.block.4") for c in run["stages"] if c["change"] != "unchanged"
    )
    assert run["first_divergence"] == [{"pair": "mlx:f32", "before": None, "after": "vision.block.5"}]
    assert run["verdict"] == {"before": "pass", "after": "fail"}
    assert [(c["scope"], c["change"]) for c in run["contract"]] == [("default", "looser")]
    assert run["parameters"] == []  # the same parameter file in both commits
    plan = [s["id"] for s in json.loads((out_root / b / "shapes" / "report.json").read_text())["stage_plan"]]
    listed = [c["stage"] for c in run["stages"]]
    assert listed == [stage for stage in plan if stage in listed]
    assert main(["diff", a, b, "--out-root", str(out_root)]) == 0
    text = capsys.readouterr().out
    assert "first divergence of mlx:f32: None -> vision.block.5" in text and "worse" in text
    contract_line = next(i for i, line in enumerate(text.splitlines()) if "CONTRACT looser" in line)
    first_stage = next(i for i, line in enumerate(text.splitlines()) if line.strip().startswith("worse"))
    assert contract_line < first_stage
    assert main(["diff", a, b, "--out-root", str(out_root), "--fail-on", "worse"]) == 1
    assert main(["diff", a, a, "--out-root", str(out_root), "--fail-on", "worse"]) == 0
    for factor in ("nan", "inf", "-1", "0"):  # issue 30 item 3: each made a 1000x worse stage exit 0
        assert main(["diff", a, b, "--out-root", str(out_root), "--fail-on", "worse", "--factor", factor]) == 2
        assert "must be" in capsys.readouterr().err


@pytest.fixture(scope="module")
def good_run(tmp_path_factory, tiny_checkpoint_dir):
    """``good``: a passing run, executed once by a batch of its own; (its parameter file, its directory). A
    batch whose output root holds a copy reuses it (the tests below pair it with runs that cannot execute;
    fresh passing runs execute in ``two_commits`` and in test_hostile_input's test 8). No notebook: the tests
    read its verdict and reuse, and every page of a batch run is rendered in ``two_commits``."""
    base = tmp_path_factory.mktemp("good-run")
    good = _write(base / "good.yaml", _params("good", notebooks=[]))
    result = run_batch([good], out_root=base / "out", log=lambda m: None)
    assert result.summaries[0]["verdict"] == "pass" and not result.summaries[0]["reused"], result.summaries
    return good, base / "out" / result.commit / result.summaries[0]["dir"]


def _seeded(out_root: Path, good_run) -> Path:
    """``good_run``'s parameter file, its finished run copied under ``out_root`` (reused by the next batch)."""
    good, directory = good_run
    shutil.copytree(directory, out_root / directory.parent.name / directory.name)
    return good


def test_runs_that_cannot_execute_never_show_green(tmp_path, good_run):
    """Items 4 and 11: a missing image and a missing notebook are 'could not run' in the summary, the
    index, the JUnit and the exit code alike; with --jobs each run says when it starts and ends."""
    from driftscope.batch.evidence import write_index
    from driftscope.core.storage import OutputRoot
    from driftscope.run.runrecord import commit_entries, exit_code

    good = _seeded(tmp_path / "out", good_run)
    bad = _write(tmp_path / "bad.yaml", _params("bad", image=tmp_path / "missing.png"))
    nobook = _write(tmp_path / "nobook.yaml", _params("nobook", notebooks=["99_no_such_notebook"]))
    lines = []
    result = run_batch([bad, good, nobook], jobs=2, out_root=tmp_path / "out", log=lines.append)
    by_name = {s["name"]: s for s in result.summaries}
    assert by_name["good"]["verdict"] == "pass" and not by_name["good"]["error"] and by_name["good"]["reused"]
    assert by_name["bad"]["status"] == "error" and "missing.png" in by_name["bad"]["error"]
    assert by_name["nobook"]["verdict"] == "error", by_name["nobook"]  # refused at its parameters: nothing ran
    assert "99_no_such_notebook" in by_name["nobook"]["error"]
    assert result.code == exit_code(result.summaries) == 2
    directory = tmp_path / "out" / result.commit
    report = json.loads((directory / "bad" / "report.json").read_text())
    assert report["status"] == "error" and report["stopped_at"] == "inputs"
    junit = ElementTree.parse(directory / "junit.xml").getroot()
    assert junit.get("errors") == "2" and junit.get("failures") == "0"
    index = (directory / "index.html").read_text()
    assert "3 run(s): 1 pass, 0 fail, 2 could not run; exit code 2" in index
    assert index.count('<tr class="pass">') == 1 and index.count('<tr class="error">') == 2
    for name in ("good", "bad", "nobook"):
        start = next(i for i, line in enumerate(lines) if line.startswith(f"  start {name}"))
        done = next(i for i, line in enumerate(lines) if line.startswith(f"  done  {name}:"))
        assert start < done
    assert re.search(r"done  good: pass in \d+\.\ds", "\n".join(lines))
    assert lines[-1].startswith(f"batch: 3 run(s) for {result.commit}: 1 pass, 0 fail, 2 could not run")
    # run again, its finished report is not reused as a pass: its notebook still could not run
    again = run_batch([nobook], out_root=tmp_path / "out", log=lambda m: None)
    assert not again.summaries[0]["reused"] and "99_no_such_notebook" in again.summaries[0]["error"]
    assert again.code == 2
    # a verdict nobody could judge counts as 'could not run', in the headline and in the exit code
    shutil.copytree(directory / "good", directory / "unjudged")
    data = json.loads((directory / "unjudged" / "report.json").read_text())
    data.pop("verdict")
    data["name"] = "unjudged"
    (directory / "unjudged" / "report.json").write_text(json.dumps(data))
    (directory / "unjudged" / "run.json").unlink()
    entries = commit_entries(OutputRoot(tmp_path / "out"), result.commit)
    write_index(OutputRoot(tmp_path / "out"), result.commit, entries)
    assert (
        "4 run(s): 1 pass, 0 fail, 3 could not run (1 with verdict unknown); exit code 2"
        in (directory / "index.html").read_text()
    )
    assert exit_code(entries) == 2


def test_a_run_whose_process_died_is_dead_and_could_not_run(tmp_path, good_run, monkeypatch):
    """Issue 30 item 6: a run killed by SIGSEGV was "0 could not run", "1 still running elsewhere", exit 1. (A patch
    that crashes its own process costs its candidate only, issue 49 item 12: this one kills the run's process.)
    The killed run leaves nothing in the temporary folder: its scratch was in its own output folder."""
    from driftscope.run.runrecord import exit_code

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # the batch's worker processes and their children read it

    crash = f"{ROOT / 'tests' / 'hostile_patches.py'}:kill_the_run"
    good = _seeded(tmp_path / "out", good_run)
    crashed = _write(tmp_path / "crash.yaml", _params("crash", patch=crash))
    result = run_batch([good, crashed], jobs=2, out_root=tmp_path / "out", log=lambda message: None)
    by_name = {s["name"]: s for s in result.summaries}
    assert by_name["crash"]["status"] == "error" and "killed by signal 11" in by_name["crash"]["error"]
    assert result.code == exit_code(result.summaries) == 2
    report = json.loads((tmp_path / "out" / result.commit / "crash" / "report.json").read_text())
    assert report["status"] == "error" and report["error"]["type"] == "RunLost"
    index = (tmp_path / "out" / result.commit / "index.html").read_text()
    assert "2 run(s): 1 pass, 0 fail, 1 could not run; exit code 2" in index
    assert "still running" not in index and index.count('<tr class="error">') == 1
    assert not [p.name for p in scratch.iterdir() if p.name.startswith("driftscope-isolated-")]


def test_two_parameter_files_with_one_run_name_are_refused(tmp_path, capsys):
    one = _write(tmp_path / "one.yaml", _params("same"))
    two = _write(tmp_path / "two.yaml", _params("same", image=SHAPES_336))
    with pytest.raises(ParameterError, match="share a run name") as err:
        run_batch([one, two], out_root=tmp_path / "out", log=lambda m: None)
    assert str(one) in str(err.value) and str(two) in str(err.value)
    assert main(["batch", str(one), str(two), "--out-root", str(tmp_path / "out")]) == 2
    assert "give each parameter file its own 'name'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # the Dask path runs by default in test_worker (a remote cluster) and test_executor (Ctrl-C)
def test_a_two_run_batch_through_a_local_dask_cluster(tmp_path, tiny_checkpoint_dir):
    from distributed import LocalCluster

    files = []
    for name, image in (("one", CHECKER), ("two", ROOT / "fixtures" / "images" / "shapes_336.png")):
        files.append(_write(tmp_path / f"{name}.yaml", _params(name, image=image)))
    lines = []
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        result = run_batch(files, scheduler=cluster.scheduler_address, out_root=tmp_path / "out", log=lines.append)
    assert sorted(s["name"] for s in result.summaries) == ["one", "two"]
    assert all(s["verdict"] == "pass" for s in result.summaries)
    directory = tmp_path / "out" / result.commit
    for name in ("one", "two"):
        assert (directory / name / "01_stage_parity.html").exists()
        assert any(line.startswith(f"  start {name} on ") for line in lines), lines
    assert (directory / "index.html").exists()


def test_an_unreachable_scheduler_still_replaces_the_index_and_junit(tmp_path):
    """Item 2: the executor's own failure writes the evidence (every run 'could not run') and exits 2."""
    import dask
    import distributed  # noqa: F401 - imported first inside dask.config.set, its config defaults would leave with it

    good = _write(tmp_path / "good.yaml", _params("good"))
    directory = tmp_path / "out" / "nocommit"
    directory.mkdir(parents=True)
    (directory / "index.html").write_text("previous batch: all green")
    (directory / "junit.xml").write_text('<testsuite tests="1" failures="0" errors="0"/>')
    with dask.config.set({"distributed.comm.timeouts.connect": "2s"}):
        result = run_batch([good], scheduler="tcp://127.0.0.1:9", out_root=tmp_path / "out", log=lambda m: None)
        command = ["batch", str(good), "--scheduler", "tcp://127.0.0.1:9", "--out-root", str(tmp_path / "out")]
        assert main(command) == 2
    assert result.code == 2 and "cannot reach the Dask scheduler" in result.problem
    index = (directory / "index.html").read_text()
    assert "previous batch" not in index and "could not run" in index and "did not finish" in index
    junit = ElementTree.parse(directory / "junit.xml").getroot()
    assert junit.get("errors") == "1" and "Dask scheduler" in junit.find("testcase/error").get("message")


def test_reviewers_pages_in_headless_chromium(two_commits):
    """The index and a rendered notebook load their figures with no console errors; screenshots kept."""
    repo, out_root, _, b, _ = two_commits
    shots = ROOT / "outputs" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    with chromium(1400, 1000, window=True, console_log=True) as driver:
        for page, shot in (
            (out_root / b / "index.html", "index.png"),
            (out_root / b / "shapes" / "01_stage_parity.html", "01_stage_parity.png"),
        ):
            open_page(driver, page.as_uri())
            images = driver.execute_script("return Array.from(document.images).map(i => [i.complete, i.naturalWidth]);")
            assert images and all(done and width > 0 for done, width in images), (page, images)
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            assert not errors, errors
            assert driver.save_screenshot(str(shots / shot))
    assert (shots / "index.png").stat().st_size > 10_000


def test_commit_trend_notebook_renders_the_diff_and_heatmap(two_commits, tmp_path):
    from driftscope.views.execution import execute
    from driftscope.views.pages import to_html

    _, out_root, a, b, _ = two_commits
    executed = execute(
        "05_commit_trend", tmp_path, {"out_root": str(out_root), "rev_a": a, "rev_b": b}, cwd=ROOT, log_output=False
    )
    notebook = json.loads(executed.read_text())
    outputs = [o for cell in notebook["cells"] if cell["cell_type"] == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1
    html = to_html(executed)[0].read_text()
    assert "mlx:f32: none -&gt; vision.block.5" in html and "worse" in html  # no raw None


def test_trend_renders_notebook_05_for_a_parameter_file_in_git_history_order(two_commits, tmp_path, monkeypatch, capfd):
    """``driftscope trend`` (issue 19 item 14): commits ordered by git history, never by directory times; the
    run a parameter file names; its HTML written; and quietly (item 15): no papermill chatter and no kernel
    warning about unencrypted TCP at the default verbosity."""
    import os

    from driftscope.views.history import commit_dirs

    repo, out_root, a, b, _ = two_commits
    # the older commit's directory is the most recently touched one: the order must not follow times
    os.utime(out_root / a, (4_000_000_000, 4_000_000_000))
    os.utime(out_root / b, (1_000_000_000, 1_000_000_000))
    assert [d.name for d in commit_dirs(out_root, repo)] == [a, b]
    monkeypatch.chdir(repo)
    out = tmp_path / "trend"
    capfd.readouterr()
    assert main(["trend", "shapes.yaml", "--out-root", str(out_root), "--out", str(out)]) == 0
    said = capfd.readouterr()
    printed = said.out + said.err
    assert "trend of shapes" in printed and "rendered" in printed
    assert not re.search(r"(?i)papermill|executing notebook|input notebook|without encryption|TqdmWarning", printed)
    html = (out / "05_commit_trend.html").read_text()
    assert f"commit <code>{a}</code> -&gt; <code>{b}</code> (in git-history order" in html
    assert "Run <code>shapes</code>" in html and (out / "05_commit_trend.nocode.html").exists()
    with pytest.raises(ParameterError, match="output root"):
        from driftscope.views.history import from_parameters

        from_parameters("shapes.yaml", None, tmp_path / "nowhere")


@pytest.mark.parametrize("out_root", ["memory://driftscope", "relative/outputs"])
def test_an_output_root_the_workers_would_not_share_is_refused(tmp_path, out_root):
    """Issue 30 item 7: ``--scheduler tcp://... --out-root memory://driftscope`` exited 0 with "1 pass" and kept
    nothing (each worker's memory filesystem vanished)."""
    good = _write(tmp_path / "good.yaml", _params("good"))
    with pytest.raises(ParameterError, match="--out-root") as err:
        run_batch([good], scheduler="tcp://127.0.0.1:1", out_root=out_root, log=lambda m: None, timeout=1)
    assert "worker" in err.value.problem and ("s3://" in err.value.fix or "absolute" in err.value.fix)
    assert main(["batch", str(good), "--scheduler", "tcp://127.0.0.1:1", "--out-root", out_root]) == 2
