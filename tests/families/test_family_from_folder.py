"""A family is its folder (docs/adding-a-family.md): Qwen2.5-VL's folder copied under another name and model type
into a copy of the package, with nothing outside that folder changed, is detected from a checkpoint of that model
type and runs a real investigation (transformers, mlx-vlm and the compiled path) in a fresh process, whose rows
equal Qwen2.5-VL's own on the same weights.

The copy differs from Qwen2.5-VL's folder in one line, its name (``plan.NAME``, which is also the model type it
claims); it registers from its folder, as a family folder without an entry point does (docs/plugins.md). mlx-vlm
picks its model code by ``config.json``'s model type: the folder's own ``mlx.adapt_config`` names mlx-vlm's
Qwen2.5-VL port whatever type the checkpoint declares, so the copy runs that port too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import ROOT, SHAPES, TINY

PACKAGE = ROOT / "lib" / "driftscope"
SOURCE = "qwen2_5_vl"
COPY = "qwen2_5_vl_twin"
NAME_LINE = f'NAME = "{SOURCE}"'
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc")


def digests(folder: Path, without: str | None = None) -> dict[str, str]:
    """sha256 of every file under ``folder`` (no bytecode), by relative path, leaving out the folder ``without``."""
    found = {}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if path.is_dir() or "__pycache__" in relative.parts or path.suffix == ".pyc":
            continue
        if without is not None and relative.parts[: len(Path(without).parts)] == Path(without).parts:
            continue
        found[str(relative)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def package_with_copy(base: Path) -> Path:
    """A copy of the package (``base/lib/driftscope``) with Qwen2.5-VL's folder copied to ``families/COPY`` under
    the name ``COPY``: the one edit, inside the new folder."""
    package = base / "lib" / "driftscope"
    shutil.copytree(PACKAGE, package, ignore=SKIP)
    folder = package / "families" / COPY
    shutil.copytree(package / "families" / SOURCE, folder, ignore=SKIP)
    plan = folder / "plan.py"
    text = plan.read_text()
    assert text.count(NAME_LINE) == 1
    plan.write_text(text.replace(NAME_LINE, f'NAME = "{COPY}"'))
    return package


def checkpoint_of_copy(base: Path) -> Path:
    """The tiny Qwen2.5-VL checkpoint, its config.json declaring the copy's model type."""
    checkpoint = base / "tiny-twin"
    shutil.copytree(TINY, checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    config["model_type"] = COPY
    (checkpoint / "config.json").write_text(json.dumps(config, indent=2))
    return checkpoint


def investigate(base: Path, checkpoint: Path, name: str) -> dict:
    """``driftscope run`` in a fresh interpreter on the package copy under ``base``: the report."""
    params = base / f"{name}.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "checkpoint": str(checkpoint),
                "images": [str(SHAPES)],  # 16 windows: window and full attention blocks differ
                "runtimes": ["transformers:f32", "mlx:f32", "jax:f32"],
                "stages": {"blocks": True},
                "notebooks": [],
            }
        )
    )
    env = {**os.environ, "PYTHONPATH": str(base / "lib"), "DRIFTSCOPE_CACHE": str(base / "cache")}
    out = base / "runs" / name
    command = [sys.executable, "-m", "driftscope", "run", str(params), "--out", str(out), "--reference-cache", "off"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=base, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return json.loads((out / "report.json").read_text())


def rows(report: dict) -> list[tuple]:
    return [(r["stage"], r["reference"], r["candidate"], r["status"], r["max_abs"]) for r in report["rows"]]


def test_a_family_added_as_a_folder_alone_runs_and_agrees_with_its_source(tmp_path):
    from driftscope.families import GENERIC, detect_family

    assert detect_family({"model_type": COPY}) == GENERIC  # the installed package has no such family
    package = package_with_copy(tmp_path)
    copied, source = package / "families" / COPY, package / "families" / SOURCE
    # nothing outside the new folder differs from the package; inside it, only the name
    outside = digests(package, without=f"families/{COPY}")
    assert outside == digests(PACKAGE)
    differs = {p for p, d in digests(copied).items() if digests(source).get(p) != d}
    assert differs == {"plan.py"} and set(digests(copied)) == set(digests(source))

    twin = investigate(tmp_path, checkpoint_of_copy(tmp_path), "twin")
    original = investigate(tmp_path, TINY, "original")
    assert twin["family"] == COPY and original["family"] == SOURCE
    assert {r["candidate"] for r in twin["rows"]} == {"mlx:f32", "jax:f32"}
    blocks = [r for r in twin["rows"] if r["stage"].startswith("vision.block.") and r["stage"].count(".") == 2]
    assert len(blocks) == 2 * 8 and 0 < max(r["max_abs"] for r in blocks) < 1e-3  # real float32 round-off
    assert rows(twin) == rows(original)  # the same numbers, stage by stage, on the same weights
    assert twin["verdict"]["status"] == original["verdict"]["status"] == "pass"
    assert digests(package, without=f"families/{COPY}") == outside  # the runs wrote nothing there
