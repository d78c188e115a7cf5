"""A video through every runtime of both Qwen families: the four-frame GIF becomes one grid with t = 2, the tower
attends per frame in transformers, MLX, JAX and IREE alike (every vision stage within the strict f32 contract),
the fixture has the power to catch attention leaking across frames, and a run with that defect planted fails
at the stage it disturbs."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT
from driftscope.families import get_family
from driftscope.run.investigation import investigate
from driftscope.run.params import parse_parameters
from driftscope.taps.tapset import TapSet

QWEN = ("qwen2_5_vl", "qwen3_vl")
GIF = "fixtures/videos/shapes_4f.gif"
PATCHES = "tests/planted_patches.py"


def _run(name: str, out, runtimes: list, **extra):
    params = parse_parameters(
        {
            "name": f"video-{name}",
            "checkpoint": str(get_family(name).tiny.ensure()),
            "videos": [GIF],
            "runtimes": runtimes,
            "contract": "parameters/contracts/strict.yaml",
            "stages": {"blocks": True, "substages": "all"},
            "replay": False,
            "notebooks": [],
            **extra,
        },
        base=ROOT,
    )
    return investigate(params, out)


@pytest.fixture(scope="module")
def video_runs(tmp_path_factory):
    done = {}

    def get(name: str):
        if name not in done:
            out = tmp_path_factory.mktemp(f"video-{name}")
            report = _run(
                name,
                out,
                ["transformers:f32", "mlx:f32", "jax:f32", "iree:f32"],
                power={"mutations": ["cross_image_leak"], "require": ["cross_image_leak"]},
            )
            done[name] = (report, out)
        return done[name]

    return get


@pytest.mark.parametrize("name", QWEN)
def test_a_video_passes_the_strict_contract_on_every_vision_stage_of_every_runtime(name, video_runs):
    report, out = video_runs(name)
    assert report.verdict == "pass", report.data["verdict"]
    inputs = report.data["inputs"]
    assert inputs["images"] == [] and [v["frames"] for v in inputs["videos"]] == [4]
    t, h, w = inputs["grid_thw"][0]
    assert t == 2 and inputs["image_tokens"] == [t * h * w // 4]  # two temporal patches: the tower saw frames
    vision = [stage["id"] for stage in report.data["stage_plan"] if stage["id"].startswith("vision.")]
    assert len(vision) > 50  # every block's substages
    for candidate in ("mlx:f32", "jax:f32", "iree:f32"):
        rows = {row["stage"]: row for row in report.data["rows"] if row["candidate"] == candidate}
        judged = [stage for stage in vision if stage in rows]
        assert judged == vision, (candidate, sorted(set(vision) - set(judged)))
        assert all(rows[stage]["status"] == "pass" for stage in vision), candidate
        assert max(rows[stage]["max_abs"] for stage in vision) < 1e-4
    oracle = TapSet(out / "taps" / "transformers-f32.safetensors")
    np.testing.assert_array_equal(np.asarray(oracle["vision.cu_seqlens"]), [0, h * w, 2 * h * w])  # per frame


@pytest.mark.parametrize("name", QWEN)
def test_the_video_fixture_catches_attention_across_frames(name, video_runs):
    report, _ = video_runs(name)
    (leak,) = report.data["power"]["mutations"]
    assert leak["mutation"] == "cross_image_leak" and leak["detected"] and leak["at_declared_stage"], leak
    assert leak["blind_reason"] is None


@pytest.mark.parametrize("name", QWEN)
def test_a_video_run_with_a_planted_frame_leak_fails_where_it_is_planted(name, tmp_path):
    planted = {"runtime": "mlx", "policy": "f32", "patch": f"{PATCHES}:leak_{name}", "label": "mlx-leak"}
    report = _run(name, tmp_path, ["transformers:f32", planted])
    assert report.verdict == "fail"
    first = report.data["first_divergence"]["mlx-leak"]
    block = 3 if name == "qwen2_5_vl" else 0  # the first block attending over whole frames
    assert first["stage"] == f"vision.block.{block}.attn.context", first
