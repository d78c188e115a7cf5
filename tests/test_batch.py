"""Per-commit batches, the evidence index, commit diffs, the CI gate, Dask scale-out, and a real browser."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from xml.etree import ElementTree

import pytest
import yaml
from conftest import ROOT, TINY
from driftscope.batch import exit_code, run_batch
from driftscope.cli import main
from driftscope.views.trend import diff_commits, resolve_commit_dir

CHECKER = ROOT / "fixtures" / "images" / "checkerboard_140.png"
PERTURB = """from driftscope.hypotheses import scale_block_output


def perturb(model):
    return scale_block_output(model, block=5, factor=1.5)
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def _params(name: str, patch: str | None = None, image: Path = CHECKER) -> dict:
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
    }


@pytest.fixture(scope="module")
def two_commits(tmp_path_factory, tiny_checkpoint_dir):
    """A repository of parameters; commit B adds a hypothesis patch that perturbs MLX block 5."""
    repo = tmp_path_factory.mktemp("params-repo")
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "ci@example.invalid")
    _git(repo, "config", "user.name", "ci")
    (repo / "shapes.yaml").write_text(yaml.safe_dump(_params("shapes")))
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "A")
    commit_a = _git(repo, "rev-parse", "--short=12", "HEAD")
    (repo / "perturb.py").write_text(PERTURB)
    (repo / "shapes.yaml").write_text(yaml.safe_dump(_params("shapes", "perturb.py:perturb")))
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "B: perturb block 5")
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
    assert exit_code(results[a][0]) == 0 and exit_code(results[b][0]) == 1
    junit = ElementTree.parse(out_root / b / "junit.xml").getroot()
    assert junit.get("tests") == "1" and junit.get("failures") == "1"
    assert junit.find("testcase").find("failure") is not None
    index = (out_root / b / "index.html").read_text()
    assert "vision.block.5" in index and 'href="shapes/01_stage_parity.html"' in index
    assert "data:image/png;base64," in index and "http" not in index.split("<body>")[1]  # self-contained
    report = json.loads((out_root / b / "shapes" / "report.json").read_text())
    assert report["runtimes"][1]["patch"]["target"] == "perturb.py:perturb"


def test_a_finished_run_is_not_overwritten_unless_forced(two_commits):
    repo, out_root, a, _, _ = two_commits
    stamp = (out_root / a / "shapes" / "report.json").stat().st_mtime_ns
    summaries, _ = run_batch([repo / "shapes.yaml"], commit=a, out_root=out_root, log=lambda m: None)
    assert summaries[0]["skipped"] and (out_root / a / "shapes" / "report.json").stat().st_mtime_ns == stamp


def test_diff_names_the_changed_stages(two_commits, capsys):
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
    assert main(["diff", a, b, "--out-root", str(out_root)]) == 0
    text = capsys.readouterr().out
    assert "first divergence of mlx:f32: None -> vision.block.5" in text and "worse" in text


def test_a_run_that_cannot_execute_does_not_stop_the_others(tmp_path, tiny_checkpoint_dir):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(_params("good")))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_params("bad", image=tmp_path / "missing.png")))
    summaries, directory = run_batch([bad, good], out_root=tmp_path / "out", log=lambda m: None)
    by_name = {s["name"]: s for s in summaries}
    assert by_name["good"]["verdict"] == "pass"
    assert by_name["bad"]["status"] == "error" and "missing.png" in by_name["bad"]["error"]
    assert exit_code(summaries) == 2
    report = json.loads((directory / "bad" / "report.json").read_text())
    assert report["status"] == "error" and report["stopped_at"] == "inputs"
    junit = ElementTree.parse(directory / "junit.xml").getroot()
    assert junit.get("errors") == "1"


def test_a_two_run_batch_through_a_local_dask_cluster(tmp_path, tiny_checkpoint_dir):
    from distributed import LocalCluster

    files = []
    for name, image in (("one", CHECKER), ("two", ROOT / "fixtures" / "images" / "shapes_336.png")):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(_params(name, image=image)))
        files.append(path)
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        summaries, directory = run_batch(
            files, scheduler=cluster.scheduler_address, out_root=tmp_path / "out", log=lambda m: None
        )
    assert sorted(s["name"] for s in summaries) == ["one", "two"]
    assert all(s["verdict"] == "pass" for s in summaries)
    for name in ("one", "two"):
        assert (directory / name / "01_stage_parity.html").exists()
    assert (directory / "index.html").exists()


def test_reviewers_pages_in_headless_chromium(two_commits):
    """The index and a rendered notebook load their figures with no console errors; screenshots kept."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    repo, out_root, _, b, _ = two_commits
    options = webdriver.ChromeOptions()
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    options.binary_location = "/usr/bin/chromium"
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    shots = ROOT / "outputs" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        for page, shot in (
            (out_root / b / "index.html", "index.png"),
            (out_root / b / "shapes" / "01_stage_parity.html", "01_stage_parity.png"),
        ):
            driver.get(page.as_uri())
            images = driver.execute_script("return Array.from(document.images).map(i => [i.complete, i.naturalWidth]);")
            assert images and all(done and width > 0 for done, width in images), (page, images)
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            assert not errors, errors
            assert driver.save_screenshot(str(shots / shot))
    finally:
        driver.quit()
    assert (shots / "index.png").stat().st_size > 10_000


def test_commit_trend_notebook_renders_the_diff_and_heatmap(two_commits, tmp_path):
    from driftscope.render import execute, to_html

    _, out_root, a, b, _ = two_commits
    executed = execute(
        "05_commit_trend", tmp_path, {"out_root": str(out_root), "rev_a": a, "rev_b": b}, cwd=ROOT, log_output=False
    )
    notebook = json.loads(executed.read_text())
    outputs = [o for cell in notebook["cells"] if cell["cell_type"] == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1
    html = to_html(executed)[0].read_text()
    assert "mlx:f32: None -&gt; vision.block.5" in html and "worse" in html
