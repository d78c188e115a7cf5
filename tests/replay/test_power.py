"""Negative controls: mutations prove (or disprove) that a fixture could catch a real defect."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT, SHAPES, TINY
from driftscope.capture.runtimes import get_runtime
from driftscope.errors import RegistryError
from driftscope.families import stage_plan
from driftscope.families.checkpoints import prepare_inputs
from driftscope.judge.contract import load_contract
from driftscope.replay.power import fixture_power
from driftscope.run.investigation import investigate
from driftscope.run.params import parse_parameters
from driftscope.taps.stages import StageSelection
from PIL import Image

IMAGES = ROOT / "fixtures" / "images"


def _power(tiny_checkpoint, images, tmp_path, names):
    inputs = prepare_inputs(tiny_checkpoint, images)
    plan = stage_plan(tiny_checkpoint.family, tiny_checkpoint.config).select(StageSelection(True, (0, 1, 3)))
    oracle = get_runtime("transformers")(tiny_checkpoint).capture(inputs, plan, tmp_path / "oracle")
    power = fixture_power(oracle, tiny_checkpoint, inputs, plan, load_contract(None), tmp_path / "m", names)
    return {m["mutation"]: m for m in power["mutations"]}


def test_the_shapes_image_detects_the_identity_permutation_where_declared(tiny_checkpoint, tmp_path):
    power = _power(
        tiny_checkpoint,
        [SHAPES],
        tmp_path,
        ["identity_window_permutation", "full_attention_everywhere", "rank_scatter_unreorder"],
    )
    identity = power["identity_window_permutation"]
    assert identity["detected"] and identity["at_declared_stage"]
    assert identity["first_divergence"] == identity["declared_stage"] == "vision.window_index"
    full = power["full_attention_everywhere"]
    assert full["detected"] and full["first_divergence"] == "vision.block.0.attn.context" and full["margin"] > 1
    # 448x448: the window permutation is an involution, so a twice-applied un-reorder hides
    rank = power["rank_scatter_unreorder"]
    assert not rank["detected"] and "involution" in rank["blind_reason"] and rank["margin"] < 1


def test_a_single_window_image_is_blind_to_window_defects(tiny_checkpoint, tmp_path):
    small = tmp_path / "shapes_112.png"
    with Image.open(SHAPES) as image:
        image.resize((112, 112)).save(small)
    power = _power(tiny_checkpoint, [small], tmp_path, ["identity_window_permutation", "full_attention_everywhere"])
    for name in ("identity_window_permutation", "full_attention_everywhere"):
        assert not power[name]["detected"], name
        # one window per image: its order is raster order, and the permutation (or a full-attention schedule) is
        # the identity there
        assert re.search(r"single attention window|one window across each", power[name]["blind_reason"]), name


def test_a_packed_pair_of_images_catches_the_cross_image_leak_and_one_image_does_not(tiny_checkpoint, tmp_path):
    pair = _power(
        tiny_checkpoint,
        [IMAGES / "checkerboard_140.png", IMAGES / "shapes_336.png"],
        tmp_path / "two",
        ["cross_image_leak", "rank_scatter_unreorder"],
    )
    leak = pair["cross_image_leak"]
    assert leak["detected"] and leak["at_declared_stage"] and leak["first_divergence"] == "vision.block.3.attn.context"
    assert pair["rank_scatter_unreorder"]["detected"]  # not an involution once 336x336 is in the bucket
    single = _power(tiny_checkpoint, [IMAGES / "shapes_336.png"], tmp_path / "one", ["cross_image_leak"])
    assert not single["cross_image_leak"]["detected"]
    assert single["cross_image_leak"]["blind_reason"].startswith("one image")


def test_a_required_mutation_the_fixture_cannot_detect_fails_the_run(tmp_path, tiny_checkpoint_dir):
    params = parse_parameters(
        {
            "checkpoint": str(TINY),
            "images": [str(IMAGES / "checkerboard_140.png")],
            "runtimes": ["transformers:f32", "mlx:f32"],
            "replay": False,
            "power": {"mutations": ["identity_window_permutation"], "require": ["cross_image_leak"]},
        },
        "test",
    )
    report = investigate(params, tmp_path)
    assert report.data["verdict"]["per_candidate"]["mlx:f32"] == "pass"  # the candidate itself is fine
    assert report.verdict == "fail" and report.data["power"]["gate"] == "fail"
    assert any("cannot detect cross_image_leak: one image" in r for r in report.data["verdict"]["reasons"])
    names = [m["mutation"] for m in report.data["power"]["mutations"]]
    assert names == ["identity_window_permutation", "cross_image_leak"]


def test_unknown_mutations_list_the_valid_ones():
    with pytest.raises(RegistryError, match="unknown mutation 'nan_everywhere'") as err:
        parse_parameters(
            {
                "checkpoint": "x",
                "images": [],
                "runtimes": ["transformers", "mlx"],
                "power": {"require": ["nan_everywhere"]},
            }
        )
    assert "identity_window_permutation" in err.value.fix and "tanh_gelu" in err.value.fix
