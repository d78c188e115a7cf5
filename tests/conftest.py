"""Shared fixtures: the tiny checkpoint, the shapes image, and one capture per runtime (session-wide)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "fixtures"))

TINY = ROOT / "fixtures" / "checkpoints" / "tiny-qwen2_5-vl"
SHAPES = ROOT / "fixtures" / "images" / "shapes_448.png"


@pytest.fixture(scope="session", autouse=True)
def private_artifact_cache(tmp_path_factory):
    """Compiled IREE artifacts go to a per-session cache (notebook kernels inherit the variable); the reference
    cache is off (every test captures its reference; tests/run/test_refcache.py turns it on in its own folder)."""
    import os

    previous = {name: os.environ.get(name) for name in ("DRIFTSCOPE_CACHE", "DRIFTSCOPE_REFERENCE_CACHE")}
    os.environ["DRIFTSCOPE_CACHE"] = str(tmp_path_factory.mktemp("driftscope-cache"))
    os.environ["DRIFTSCOPE_REFERENCE_CACHE"] = "off"
    yield
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def tiny_checkpoint_dir() -> Path:
    if not (TINY / "model.safetensors").exists():
        from make_tiny_qwen25vl import main

        main([str(TINY)])
    return TINY


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_checkpoint_dir):
    from driftscope.families.checkpoints import open_checkpoint

    return open_checkpoint(tiny_checkpoint_dir)


@pytest.fixture(scope="session")
def shapes_inputs(tiny_checkpoint):
    from driftscope.families.checkpoints import prepare_inputs

    return prepare_inputs(tiny_checkpoint, [SHAPES])


@pytest.fixture(scope="session")
def full_plan(tiny_checkpoint):
    from driftscope.families import stage_plan
    from driftscope.taps.stages import StageSelection

    return stage_plan(tiny_checkpoint.family, tiny_checkpoint.config).select(StageSelection.everything())


@pytest.fixture(scope="session")
def captures(tmp_path_factory, tiny_checkpoint, shapes_inputs, full_plan):
    """TapSets of every stage: transformers f32, MLX f32 and MLX f16 on the 448x448 shapes image."""
    from driftscope.capture.runtimes import get_runtime

    out = tmp_path_factory.mktemp("captures")
    taps = {}
    for name, policy in (("transformers", "f32"), ("mlx", "f32"), ("mlx", "f16")):
        runtime = get_runtime(name)(tiny_checkpoint, policy)
        taps[f"{name}:{policy}"] = runtime.capture(shapes_inputs, full_plan, out / f"{name}-{policy}")
    return taps


def write_params(path: Path, name: str, runtimes: list, **extra) -> Path:
    """A parameter file for the tiny checkpoint on the checkerboard image."""
    import yaml

    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "checkpoint": str(TINY),
                "images": [str(ROOT / "fixtures" / "images" / "checkerboard_140.png")],
                "runtimes": runtimes,
                **extra,
            }
        )
    )
    return path


@pytest.fixture(scope="session")
def rendered(tmp_path_factory, tiny_checkpoint_dir):
    """``driftscope run`` of four runtimes (MLX bf16 diverges; IREE runs with ``decode: false``, so one side
    lacks ``text.generate.*``) with notebooks 01, 02, 04: (exit code, output directory)."""
    from driftscope.cli import main

    base = tmp_path_factory.mktemp("cli")
    params = write_params(
        base / "p.yaml",
        "cli-check",
        ["transformers:f32", "mlx:f32", "mlx:bf16", {"runtime": "iree", "policy": "f32", "options": {"decode": False}}],
        pairs=[["mlx:f32", "iree:f32"]],
        replay=["mlx:bf16"],
        notebooks=["01_stage_parity", "02_layer_drilldown", "04_negative_controls"],
        power={
            "mutations": [
                "identity_window_permutation",
                "cross_image_leak",
                "manual_f16_rmsnorm",
                "drop_rotary_block_1",
            ],
            "require": ["identity_window_permutation"],
        },
        text={"max_new_tokens": 4},
    )
    code = main(["run", str(params), "--out", str(base / "out")])
    return code, base / "out"


@pytest.fixture(scope="session")
def tiny(request):
    """name -> (checkpoint, inputs with the prompt, full plan with the text stages)."""
    from driftscope.families import get_family
    from driftscope.families.checkpoints import open_checkpoint
    from driftscope.taps.stages import StagePlan, StageSelection

    built = {}

    def get(name: str):
        if name not in built:
            family = get_family(name)
            checkpoint = open_checkpoint(family.tiny.ensure())
            inputs = family.prepare_inputs(checkpoint, list(family.tiny.images))
            inputs.text = family.text_inputs(checkpoint, inputs, max_new_tokens=4)
            plan = family.vision_plan(checkpoint.config).select(StageSelection.everything())
            plan = StagePlan(plan.family, plan.stages + family.text_stages(checkpoint.config, 4), plan.depth, plan.meta)
            built[name] = (checkpoint, inputs, plan)
        return built[name]

    return get


@pytest.fixture(scope="session")
def runs(tiny, tmp_path_factory):
    """(family, runtime) -> (runtime object, TapSet of the whole plan in f32), captured once per session."""
    from driftscope.capture.runtimes import get_runtime

    out = tmp_path_factory.mktemp("family-runs")
    captured = {}

    def get(name: str, runtime_name: str):
        if (name, runtime_name) not in captured:
            checkpoint, inputs, plan = tiny(name)
            runtime = get_runtime(runtime_name)(checkpoint, "f32")
            tapset = runtime.capture(inputs, plan, out / name / runtime_name)
            runtime.release()
            captured[(name, runtime_name)] = (runtime, tapset)
        return captured[(name, runtime_name)]

    return get
