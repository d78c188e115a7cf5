"""The layer-17 case: a deep tower whose massive channels overflow a manual F16 RMSNorm at block 17.

The fast test pins the bug this case found in driftscope itself: capturing taps dropped a precision
experiment (or a hypothesis patch) that had replaced a module, so the replay that followed ran the
original operator and labelled the overflowing norm "clean". The slow test runs the whole story.
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from conftest import ROOT
from driftscope.capture.runtimes import get_runtime
from driftscope.families import stage_plan
from driftscope.taps.stages import StageSelection

DEEP = ROOT / "fixtures" / "checkpoints" / "tiny-qwen2_5-vl-deep"
CASE = ROOT / "parameters" / "case_layer17.yaml"


def test_a_capture_keeps_the_operators_a_precision_experiment_or_patch_put_in_place(
    tiny_checkpoint, shapes_inputs, tmp_path
):
    from driftscope.capture.patches import parse_patch
    from driftscope.families.hypotheses import norm2_in_float32
    from driftscope.taps.mlx_hooks import ManualRMSNorm

    plan = stage_plan(tiny_checkpoint.family, tiny_checkpoint.config).select(StageSelection(True, (0,)))
    manual = get_runtime("mlx")(tiny_checkpoint, "f16", options={"rmsnorm": "manual"})
    manual.capture(shapes_inputs, plan, tmp_path / "manual")
    assert all(isinstance(block.norm1, ManualRMSNorm) for block in manual.model.vision_tower.blocks)
    assert all(isinstance(block.norm2, ManualRMSNorm) for block in manual.model.vision_tower.blocks)

    patched = get_runtime("mlx")(
        tiny_checkpoint, "f16", parse_patch("driftscope.hypotheses:norm2_in_float32"), {"rmsnorm": "manual"}
    )
    patched.capture(shapes_inputs, plan, tmp_path / "patched")
    norm2 = patched.model.vision_tower.blocks[0].norm2
    assert type(norm2).__qualname__.startswith(norm2_in_float32.__name__)  # still the patch's float32 norm
    assert isinstance(patched.model.vision_tower.blocks[0].norm1, ManualRMSNorm)


def _deep_checkpoint():
    if not (DEEP / "model.safetensors").exists():
        from make_tiny_qwen25vl_deep import main

        main([str(DEEP)])
    from driftscope.families.checkpoints import open_checkpoint

    return open_checkpoint(DEEP)


@pytest.mark.slow
def test_the_massive_channels_first_exceed_256_at_block_17s_norm2_input(tmp_path):
    from driftscope.families.checkpoints import prepare_inputs
    from make_tiny_qwen25vl_deep import IMAGES

    checkpoint = _deep_checkpoint()
    inputs = prepare_inputs(checkpoint, IMAGES)
    plan = stage_plan(checkpoint.family, checkpoint.config).select(StageSelection.everything())
    oracle = get_runtime("transformers")(checkpoint).capture(inputs, plan, tmp_path / "oracle")
    norm2_inputs = [float(np.abs(oracle[f"vision.block.{b}.residual1"]).max()) for b in range(32)]
    block_inputs = [float(np.abs(oracle[f"vision.block.{b}"]).max()) for b in range(32)]
    assert [b for b, value in enumerate(norm2_inputs) if value > 256][0] == 17
    assert max(block_inputs) < 256  # norm1 and the merger's norm never see an overflowing value
    # a float16 sum of squares over a row overflows (65504) first at block 17 as well
    squares = [
        float((np.asarray(oracle[f"vision.block.{b}.residual1"], np.float64) ** 2).sum(1).max()) for b in range(32)
    ]
    assert [b for b, value in enumerate(squares) if value > 65504][0] == 17


@pytest.mark.slow
def test_the_layer17_story(tmp_path):
    """With block-level taps only (the case's parameter file), narrowing finds it: manual F16 RMSNorm diverges at
    block 17, whose substages narrowing captures for that pair alone; norm2 is introduced, rows collapsed; the
    fused norm, IREE f16-contract and the norm2-in-float32 patch stay inside the default contract."""
    from driftscope.run.investigation import investigate
    from driftscope.run.params import parse_parameters
    from driftscope.views.errormaps import StageDifference, collapsed_rows

    _deep_checkpoint()
    data = yaml.safe_load(CASE.read_text())
    assert data["stages"] == {"blocks": True}  # no substages asked for
    data["runtimes"].append(
        {
            "runtime": "mlx",
            "policy": "f16",
            "label": "mlx:f16-manual+norm2-f32",
            "options": {"rmsnorm": "manual"},
            "patch": "driftscope.hypotheses:norm2_in_float32",
        }
    )
    data["notebooks"] = []
    report = investigate(parse_parameters(data, str(CASE)), tmp_path / "run")
    verdict = report.data["verdict"]["per_candidate"]
    manual = "mlx:f16-manual-rmsnorm"
    assert verdict[manual] == "fail"
    assert verdict["mlx:f16"] == verdict["iree:f16-contract"] == verdict["mlx:f16-manual+norm2-f32"] == "pass"
    assert report.data["first_divergence"][manual]["stage"].startswith("vision.block.17")
    replay = report.data["replay"][manual]
    labels = {label["stage"]: label["label"] for label in replay["labels"]}
    assert replay["first_introduced"] == "vision.block.17.norm2"
    assert labels["vision.block.17.norm2"] == "introduced"
    assert all(labels[f"vision.block.{b}"] == "clean" for b in range(17))
    assert report.data["conclusions"][manual]["kind"] == "introduced"
    # narrowing found it: block 17's substages, captured for the failing pair only
    assert [step["target"] for step in report.data["narrowing"][manual]["steps"]] == ["vision.block.17"]
    assert set(report.data["narrowing"]) == {manual}  # the pairs that pass narrow nothing
    lineage = report.data["lineage"][manual]["stages"]
    assert lineage[-1]["stage"] == report.data["first_divergence"][manual]["stage"] and lineage[-1]["failures"] > 0
    stage = "vision.block.17.norm2"
    reference, candidate = report.pair_tapsets(manual)
    difference = StageDifference(
        stage,
        np.asarray(reference[stage]),
        np.asarray(candidate[stage]),
        0.08,
        0.08,
        "window",
        [(0, 1024), (1024, 1600)],
    )
    assert collapsed_rows(difference) > 0
