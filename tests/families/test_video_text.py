"""Videos with text in both Qwen families: the prompt places the video's tokens after the images' (Qwen3-VL with
its timestamps), the M-RoPE positions step a video's time as transformers' own ``get_rope_index`` does, and every
text stage (merged embeddings, positions, each layer, prefill logits, greedy and teacher-forced tokens, the KV
cache) is compared under the strict f32 contract. A planted defect in mlx-vlm's temporal position rule is found
at ``text.position_ids``; mlx-vlm's own Qwen2.5-VL time-step defect is found there too, and its ready patch
closes it."""

from __future__ import annotations

import functools
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import ROOT
from driftscope.families import get_family
from driftscope.families.checkpoints import open_checkpoint, prepare_inputs
from driftscope.families.qwen_shared.mrope import prompt_positions
from driftscope.inputs.text_inputs import load_tokenizer
from driftscope.run.investigation import investigate
from driftscope.run.params import parse_parameters
from driftscope.taps.tapset import TapSet

QWEN = ("qwen2_5_vl", "qwen3_vl")
GIF = "fixtures/videos/shapes_4f.gif"
PATCHES = "tests/planted_patches.py"
FIX = {"callable": "driftscope.hypotheses:video_time_positions", "kwargs": {"second_per_grid_ts": [0.5]}}


def _transformers_rope_index(name: str, checkpoint, text, grids: np.ndarray, images: int):
    """transformers' own ``get_rope_index`` of the family's model class, on the prompt's ids and grids."""
    from transformers import AutoConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    cls = {"qwen2_5_vl": Qwen2_5_VLModel, "qwen3_vl": Qwen3VLModel}[name]
    model = SimpleNamespace(config=AutoConfig.from_pretrained(str(checkpoint.path)))
    model.get_vision_position_ids = functools.partial(cls.get_vision_position_ids, model)
    extra = {"second_per_grid_ts": torch.tensor(text.second_per_grid_ts)} if name == "qwen2_5_vl" else {}
    positions, deltas = cls.get_rope_index(
        model,
        torch.from_numpy(text.input_ids)[None],
        mm_token_type_ids=torch.from_numpy(text.mm_token_type_ids)[None],
        image_grid_thw=torch.from_numpy(grids[:images]) if images else None,
        video_grid_thw=torch.from_numpy(grids[images:]),
        **extra,
    )
    return positions[:, 0].numpy(), int(deltas.reshape(-1)[0])


@pytest.mark.parametrize("name", QWEN)
def test_an_image_and_a_video_take_the_positions_transformers_gives_them(name):
    family = get_family(name)
    checkpoint = open_checkpoint(family.tiny.ensure())
    inputs = prepare_inputs(checkpoint, [family.tiny.images[0]], [ROOT / GIF])
    text = family.text_inputs(checkpoint, inputs, prompt="What moves?", max_new_tokens=2)
    grids = np.asarray(inputs["grid_thw"])
    (t, h, w) = grids[1]
    assert t == 2 and int((text.input_ids == text.video_token_id).sum()) == t * h * w // 4
    slots, positions, delta = prompt_positions(text, grids, 2)
    expected, expected_delta = _transformers_rope_index(name, checkpoint, text, grids, images=1)
    np.testing.assert_array_equal(positions, expected)
    assert delta == expected_delta
    assert slots.sum() == inputs.image_tokens.sum()  # every merged row of the tower has its slot
    times = np.unique(positions[0][text.input_ids == text.video_token_id])
    prompt = load_tokenizer(checkpoint.path).decode(text.input_ids.tolist())
    if name == "qwen2_5_vl":  # 4 tokens per second x 2 frames / 4 fps: the second temporal patch 2 positions on
        assert np.diff(times).tolist() == [2] and "seconds>" not in prompt
        assert text.second_per_grid_ts == [0.5]
    else:  # time lives in the prompt: one stamped frame group each, transformers' own timestamps
        from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

        stamps = Qwen3VLProcessor._calculate_timestamps(None, list(range(4)), 4.0, 2)
        assert re.findall(r"<([0-9.]+) seconds>", prompt) == [f"{s:.1f}" for s in stamps] == ["0.1", "0.6"]
        assert len(times) == 2 and text.time_intervals == [1, 1, 1]


@pytest.mark.parametrize(("frames", "fps"), [(4, 4.0), (3, 2.0), (7, 24.0), (2, 0.5)])
def test_frame_timestamps_are_transformers_own_including_a_padded_last_patch(frames, fps):
    from driftscope.families.qwen_shared.video_text import frame_timestamps
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    expected = Qwen3VLProcessor._calculate_timestamps(None, list(range(frames)), fps, 2)
    assert frame_timestamps(frames, fps, 2) == pytest.approx(expected, abs=1e-12)


def _run(name: str, out, runtimes: list, tokens: int = 3, **extra):
    params = parse_parameters(
        {
            "name": f"video-text-{name}",
            "checkpoint": str(get_family(name).tiny.ensure()),
            "videos": [GIF],
            "text": {"prompt": "What moves?", "max_new_tokens": tokens},
            "runtimes": runtimes,
            "contract": "parameters/contracts/strict.yaml",
            "replay": False,
            "notebooks": [],
            **extra,
        },
        base=ROOT,
    )
    return investigate(params, out)


def _text_rows(report, candidate: str) -> dict:
    return {
        r["stage"]: r for r in report.data["rows"] if r["candidate"] == candidate and r["stage"].startswith("text.")
    }


def test_a_planted_temporal_position_defect_is_found_at_the_position_stages(tmp_path):
    planted = {"runtime": "mlx", "policy": "f32", "patch": f"{PATCHES}:video_time_shift", "label": "mlx-time"}
    report = _run("qwen3_vl", tmp_path, ["transformers:f32", planted], tokens=1, stages={"blocks": False})
    first = report.data["first_divergence"]["mlx-time"]
    assert first["stage"] == "text.position_ids", first
    rows = _text_rows(report, "mlx-time")
    assert rows["text.embeds.image"]["status"] == rows["text.embeds.text"]["status"] == "pass"
    oracle, planted_taps = (TapSet(tmp_path / "taps" / f"{n}.safetensors") for n in ("transformers-f32", "mlx-time"))
    diff = np.asarray(planted_taps["text.position_ids"]) - np.asarray(oracle["text.position_ids"])
    ids = np.asarray(oracle["text.input_ids"])
    video = np.flatnonzero(ids == 7)
    assert (diff[0, video[len(video) // 2 :]] == 1).all() and np.count_nonzero(diff[0]) == len(video) // 2
    assert not diff[1:].any()  # the spatial axes are untouched: the defect is in the temporal rule alone


@pytest.fixture(scope="module")
def video_text_runs(tmp_path_factory):
    done = {}

    def get(name: str):
        if name not in done:
            out = tmp_path_factory.mktemp(f"video-text-{name}")
            fixed = (
                [{"runtime": "mlx", "policy": "f32", "label": "mlx-fixed", "patch": FIX}]
                if name == "qwen2_5_vl"
                else []
            )
            runtimes = ["transformers:f32", "mlx:f32", *fixed, "jax:f32", "iree:f32"]
            done[name] = (_run(name, out, runtimes, images=[str(get_family(name).tiny.images[0])]), out)
        return done[name]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("name", QWEN)
def test_an_image_and_a_video_with_text_pass_the_strict_contract_on_every_text_stage(name, video_text_runs):
    report, _ = video_text_runs(name)
    passing = ["jax:f32", "iree:f32"] + (["mlx-fixed"] if name == "qwen2_5_vl" else ["mlx:f32"])
    text = [s["id"] for s in report.data["stage_plan"] if s["id"].startswith("text.")]
    for candidate in passing:
        rows = _text_rows(report, candidate)
        assert {"text.position_ids", "text.embeds.image", "text.logits.last", "text.forced.tokens"} <= set(rows)
        assert set(text) - set(rows) <= {"text.rope_delta"} or candidate == "mlx-fixed", set(text) - set(rows)
        failing = {stage: row["max_abs"] for stage, row in rows.items() if row["status"] != "pass"}
        assert not failing, (candidate, failing)
        assert report.data["first_divergence"][candidate] is None
    if name == "qwen2_5_vl":  # mlx-vlm steps a video's time by 1: found where it is, the rest is inherited
        first = report.data["first_divergence"]["mlx:f32"]
        assert first["stage"] == "text.position_ids" and first["reference_value"] - first["candidate_value"] == 1
        assert _text_rows(report, "mlx:f32")["text.embeds.image"]["status"] == "pass"
        ready = report.data["conclusions"]["mlx:f32"]["ready_patches"]
        assert ready == ["driftscope.hypotheses:video_time_positions"]  # the one the patched MLX applied
    inputs = report.data["inputs"]
    assert [v["grid_thw"][0] for v in inputs["videos"]] == [2] and len(inputs["images"]) == 1
