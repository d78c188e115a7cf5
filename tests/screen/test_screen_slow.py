"""Slow (minutes here): the screen as a user runs it. ``driftscope screen`` stopped with SIGINT mid-screen and run
again captures only the inputs it lacks and ranks as an uninterrupted screen does; the top-ranked input's full
investigation (notebooks rendered) names the un-reorder, ``vision.merger`` (restored to raster) failing while
``vision.merger.window`` (the same tokens before it) passes, and the page links to its notebook."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from driftscope.screen.report import load_screen
from driftscope.screen.runner import screen
from screen_support import INVOLUTION, NOT_INVOLUTION, ROOT, image_folder, planted_parameters

pytestmark = pytest.mark.slow


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "driftscope.cli", "screen", *args]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT / "lib")}


def _complete(out: Path) -> int:
    count = 0
    for sidecar in (out / "taps").glob("*/*.json"):
        if sidecar.name.endswith(".error.json"):
            continue
        try:
            count += bool(json.loads(sidecar.read_text()).get("complete"))
        except ValueError:
            pass
    return count


def test_sigint_then_rerun_captures_only_the_missing_inputs_and_ranks_the_same(tmp_path):
    params, images = planted_parameters(tmp_path), image_folder(tmp_path / "images")
    out = tmp_path / "out"
    args = _cli(str(params), "--images", images, "--no-investigate", "--out", str(out))
    process = subprocess.Popen(args, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 400
    while _complete(out) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process.poll() is None, process.stdout.read()
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output
    assert "run the same command again to resume" in output
    kept = _complete(out)
    assert 2 <= kept < 8 and not (out / "screen.json").exists()
    again = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.search(rf"\({8 - kept} to capture\)", again.stdout), again.stdout
    fresh = screen(params, images, investigate=False, out=tmp_path / "fresh", log=lambda m: None)
    resumed = load_screen(out)
    assert resumed["ranking"] == [entry["key"] for entry in fresh.ranking]
    labels = [entry["label"] for entry in resumed["inputs"]]
    assert set(labels[:2]) == set(NOT_INVOLUTION) and set(labels[2:]) == set(INVOLUTION)


def test_the_top_investigation_names_the_unreorder_and_the_page_links_it(tmp_path):
    params = planted_parameters(tmp_path, notebooks=["01_stage_parity"])
    images = image_folder(tmp_path / "images", (INVOLUTION[1], NOT_INVOLUTION[0]))
    result = subprocess.run(
        _cli(str(params), "--images", images, "--top", "1", "--out", str(tmp_path / "out")),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = load_screen(tmp_path / "out")
    (investigation,) = data["investigations"]
    assert investigation["key"] == data["ranking"][0] and data["inputs"][0]["label"] == NOT_INVOLUTION[0]
    assert investigation["verdict"] == "fail" and investigation["first_divergence"] == {"mlx-planted": "vision.merger"}
    run = tmp_path / "out" / investigation["dir"]
    report = json.loads((run / "report.json").read_text())
    rows = {row["stage"]: row["status"] for row in report["rows"] if row["stage"].startswith("vision.merger")}
    assert rows["vision.merger.window"] == "pass" and rows["vision.merger"] == "fail"  # the un-reorder itself
    assert report["inputs"] and (run / "01_stage_parity.nocode.html").exists()
    page = (tmp_path / "out" / "index.html").read_text()
    assert f'href="runs/{investigation["key"]}/01_stage_parity.nocode.html"' in page


def test_on_a_dask_cluster_each_worker_loads_each_runtime_once_and_ranks_as_locally(tmp_path):
    from distributed import LocalCluster
    from driftscope.screen.distributed import shares

    params, images = planted_parameters(tmp_path), image_folder(tmp_path / "images")
    assert [len(share) for share in shares(list(range(5)), 2)] == [3, 2] and shares([1], 4) == [[1]]
    ticks = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None) as c:
        spread = screen(
            params,
            images,
            investigate=False,
            scheduler=c.scheduler_address,
            out=tmp_path / "dask",
            log=lambda m: None,
            advance=lambda label, item: ticks.append((label, item.key)),
        )
    assert spread.captured == 8
    local = screen(params, images, investigate=False, out=tmp_path / "local", log=lambda m: None)
    assert [e["key"] for e in spread.ranking] == [e["key"] for e in local.ranking]
    for dask_entry, local_entry in zip(spread.ranking, local.ranking, strict=True):
        assert dask_entry["score"] == pytest.approx(local_entry["score"], rel=1e-6, abs=1e-9)
    loads = {}
    for sidecar in (tmp_path / "dask" / "taps").glob("*/*.json"):
        meta = json.loads(sidecar.read_text())
        loads.setdefault(meta["label"], set()).add(meta["timings"]["load_s"])
    assert all(len(times) <= 2 for times in loads.values())  # one load per runtime and worker (2 workers)
