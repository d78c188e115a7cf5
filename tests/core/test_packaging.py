"""driftscope as a package a user installs where their model lives (issue 51 items 1 and 2): the wheel carries
what a run needs, installs into a fresh environment from the package index, and runs outside this repository;
the dependencies are loose bounds by platform and need, requirements.txt the exact pins, environment.yml its copy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_is_generated_from_requirements_txt():
    done = subprocess.run([sys.executable, "scripts/environment.py", "--check"], cwd=ROOT, capture_output=True)
    assert done.returncode == 0, done.stdout
    pins = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    listed = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"][-1]["pip"]
    assert listed == [pin for pin in pins if pin]


def test_the_dependencies_are_loose_bounds_by_platform_and_every_pin_belongs_to_one():
    dependencies, extras = PYPROJECT["dependencies"], PYPROJECT["optional-dependencies"]
    assert not [d for d in dependencies if "==" in d.split(";")[0]], "exact pins belong in requirements.txt"
    assert "mlx>=0.32; sys_platform == 'darwin'" in dependencies  # Metal on a Mac
    assert "mlx[cpu]>=0.32; sys_platform == 'linux'" in dependencies
    assert {"iree", "jax", "lab", "dask", "test"} <= set(extras)
    declared = {_name(d) for d in dependencies} | {_name(d) for group in extras.values() for d in group}
    pinned = {
        _name(line) for line in (ROOT / "requirements.txt").read_text().splitlines() if line.split("#")[0].strip()
    }
    assert pinned - declared == set(), "a pinned package no dependency or extra of pyproject.toml asks for"


def _wheel(tmp_path: Path) -> Path:
    """The wheel, built from a copy of the sources (a build writes into its source folder)."""
    source = tmp_path / "source"
    shutil.copytree(ROOT / "lib", source / "lib", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w"]
    done = subprocess.run([*command, str(tmp_path / "dist"), str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return next((tmp_path / "dist").glob("driftscope-*.whl"))


def _outside_env(home: Path, venv: Path) -> dict[str, str]:
    """The environment of a user's shell: the fresh venv first on PATH, nothing of this repository's set-up."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DRIFTSCOPE_", "VIRTUAL_ENV", "JUPYTER"))}
    env.pop("PYTHONPATH", None)
    env["PATH"] = os.pathsep.join([str(venv / "bin"), "/usr/bin", "/bin"])
    env["XDG_CACHE_HOME"] = str(home / "cache")  # the user cache folder (platformdirs on Linux)
    return env


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_venv_and_runs_outside_the_repository(tmp_path):
    """Build the wheel, install it into a fresh venv with its dependencies from the package index (pinned by
    constraints.txt: the repository's versions, so torch is the CPU wheel on this machine's disk), then, in a
    folder outside the repository: ``driftscope init`` on the tiny checkpoint, ``driftscope run`` of what it wrote,
    and notebook 01 rendered under ./outputs."""
    start = time.perf_counter()
    wheel = _wheel(tmp_path)
    shipped = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "driftscope/notebooks/01_stage_parity.ipynb",
        "driftscope/contracts/default.yaml",
        "driftscope/demo/images/shapes_448.png",
        "driftscope/views/templates/offline/index.html.j2",
    } <= shipped
    entry_points = next(name for name in shipped if name.endswith("entry_points.txt"))
    assert "[driftscope.runtimes]" in zipfile.ZipFile(wheel).read(entry_points).decode()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "-c", str(ROOT / "constraints.txt")]
    done = subprocess.run([*install, str(wheel)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    installed = time.perf_counter()
    work = tmp_path / "work"  # a user's own folder: no repository, no driftscope checkout around it
    work.mkdir()
    env = _outside_env(tmp_path, venv)

    def driftscope(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["driftscope", *args], cwd=work, env=env, capture_output=True, text=True)

    done = driftscope("init", str(TINY))
    assert done.returncode == 0, done.stderr
    params = work / f"{TINY.name}.yaml"
    written = params.read_text()
    assert "# - {runtime: iree, policy: f16-contract}  # not installed: install driftscope[iree]" in written
    done = driftscope("run", params.name)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = work / "outputs" / "nocommit" / TINY.name
    report = json.loads((out / "report.json").read_text())
    assert [r["label"] for r in report["runtimes"]] == ["transformers:f32", "mlx:f32", "mlx:f16"]
    assert report["verdict"]["status"] == "pass"
    assert (out / "01_stage_parity.html").stat().st_size > 100_000 and (out / "01_stage_parity.nocode.html").exists()
    assert (tmp_path / "cache" / "driftscope" / "reference").is_dir()  # caches in the user cache folder
    iree = yaml.safe_load(written) | {"name": "needs-iree", "runtimes": ["transformers:f32", "iree:f32"]}
    (work / "iree.yaml").write_text(yaml.safe_dump(iree))
    done = driftscope("run", "iree.yaml")
    assert done.returncode == 2
    assert "runtime 'iree' needs" in done.stderr and "install driftscope[iree]" in done.stderr
    print(f"wheel test: install {installed - start:.0f} s, init + run {time.perf_counter() - installed:.0f} s")


def test_the_readme_fits_a_screen_or_two_and_quotes_nothing_that_goes_stale():
    """Issue 51 items 5 and 6: the README is short; it and the architecture page state no measured time, test count
    or session (those are dated rows of docs/benchmarks.md), and the README keeps the family table's markers for
    the generator."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) <= 12_000
    begin, end = readme.index("<!-- families: begin -->"), readme.index("<!-- families: end -->")
    assert begin < end and "qwen2_5_vl" in readme[begin:end]  # filled by scripts/families_table.py
    stale = re.compile(r"\b\d+ min( \d+ s)?\b|\b\d+ (tests|passed)\b|\bsession \d+\b|\d+(\.\d+)?x\b")
    for page in (readme, (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")):
        assert stale.findall(page) == []
    benchmarks = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert "| what | figure | command | date | commit |" in benchmarks.split("\n\n")[2]  # the current table first
