"""Runtimes and families plug in through entry points, the built-in ones too (issue 51 item 3).

The plugin is a real package (``numpy_tower_plugin/``: a NumPy reference of the Qwen2.5-VL tower registered under
``driftscope.runtimes``), built and installed by pip into a folder of its own, then named in a parameter file and
judged against transformers' float32 tower, an independent implementation, under the strict contract.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, SHAPES, TINY
from driftscope.capture.runtimes import RUNTIMES
from driftscope.core.registry import Registry
from driftscope.errors import RegistryError
from driftscope.families import FAMILIES
from driftscope.families.base import Family

PLUGIN = Path(__file__).parent / "numpy_tower_plugin"


def test_the_built_in_runtimes_and_families_are_entry_points_of_driftscope_itself():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    installed = {group: {p.name: p.value for p in entry_points(group=group)} for group in declared}
    for group, points in declared.items():
        assert points.items() <= installed[group].items(), f"{group}: run `make setup` (pip install -e .)"
    assert set(declared["driftscope.runtimes"]) == {"transformers", "mlx", "jax", "iree", "tapfile"}
    for name in declared["driftscope.runtimes"]:
        assert RUNTIMES.get(name).name == name
    import driftscope.families as package

    folders = {  # every folder of families/ that defines a FAMILY
        found.name
        for found in pkgutil.iter_modules(package.__path__)
        if found.ispkg
        and isinstance(getattr(importlib.import_module(f"{package.__name__}.{found.name}"), "FAMILY", None), Family)
    }
    assert set(declared["driftscope.families"]) == folders  # every family folder is registered as an entry point
    assert {FAMILIES.get(name).name for name in folders} == folders


def test_a_broken_or_wrong_entry_point_is_named_with_its_source(tmp_path, monkeypatch):
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[driftscope.families]\nmissing = no_such_module_here:FAMILY\nnot_a_family = json:dumps\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry: Registry[Family] = Registry("model family", "driftscope.families", lambda e: isinstance(e, Family))
    assert {"missing", "not_a_family", "qwen2_5_vl"} <= set(registry.names())
    with pytest.raises(RegistryError) as missing:
        registry.get("missing")
    assert "'no_such_module_here:FAMILY' of broken-plugin" in str(missing.value)
    assert "ModuleNotFoundError" in str(missing.value) and "uninstall the package" in str(missing.value)
    with pytest.raises(RegistryError, match="is a function, not a model family"):
        registry.get("not_a_family")
    with pytest.warns(RuntimeWarning, match="could not be loaded"):
        loaded = {family.name for family in registry.loadable()}
    assert "qwen2_5_vl" in loaded and "missing" not in loaded  # a broken plugin does not hide the others


def _run(params: Path, out: Path, site: Path | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "driftscope", "run", str(params), "--out", str(out)]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=params.parent)


def test_an_installed_plugin_runtime_runs_in_an_investigation(tmp_path):
    site, source = tmp_path / "site", tmp_path / "plugin"
    shutil.copytree(PLUGIN, source)  # pip builds in the source folder: never in the repository
    built = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--target", str(site), str(source)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    params = tmp_path / "numpy.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "name": "numpy-plugin",
                "checkpoint": str(TINY),
                "images": [str(SHAPES)],  # 32x32 patches: 16 windows, window and full attention blocks
                "runtimes": ["transformers:f32", "numpy:f32"],
                "stages": {"blocks": True},
                "contract": "strict",
                "notebooks": [],
            }
        )
    )
    without = _run(params, tmp_path / "without", None)
    assert without.returncode == 2
    assert "unknown runtime 'numpy'" in without.stderr and "transformers" in without.stderr
    done = _run(params, tmp_path / "out", site)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verdict"]["status"] == "pass"
    rows = {row["stage"]: row for row in report["rows"] if row["candidate"] == "numpy:f32"}
    blocks = [f"vision.block.{i}" for i in range(8)]
    assert set(blocks) | {"vision.patch_embed", "vision.merger", "vision.window_index"} <= set(rows)
    assert all(rows[stage]["status"] == "pass" for stage in rows)
    assert rows["vision.window_index"]["max_abs"] == 0  # the geometry, exactly
    assert 0 < max(rows[stage]["max_abs"] for stage in blocks) < 1e-4  # float64 NumPy vs float32 torch: round-off
    assert rows["vision.merger"]["cosine"] > 0.999999


def test_a_runtime_whose_extra_is_missing_names_the_extra_to_install():
    from driftscope.capture.runtimes.compiled import IreeRuntime
    from driftscope.errors import RuntimeUnavailableError

    class Unreachable(IreeRuntime):  # the iree runtime where one of its modules is not installed
        REQUIRES = {**IreeRuntime.REQUIRES, "driftscope_no_such_module": "iree-base-nothing"}

    IreeRuntime.check_installed()  # installed here: nothing to say
    with pytest.raises(RuntimeUnavailableError) as err:
        Unreachable.check_installed()
    assert "runtime 'iree' needs iree-base-nothing, which is not installed here" in str(err.value)
    assert "install driftscope[iree] (pip install 'driftscope[iree]')" in str(err.value)
