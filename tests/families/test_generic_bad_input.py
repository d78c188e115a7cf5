"""The generic family on input it cannot take: each says what is wrong and how to fix it, and the runtimes that can
still run report (issue 48 item 6)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from conftest import ROOT, SHAPES
from driftscope.errors import CheckpointError
from driftscope.families.checkpoints import open_checkpoint


def test_a_model_type_transformers_does_not_implement_is_refused_naming_it(tmp_path):
    source = ROOT / "fixtures" / "checkpoints" / "generic-qwen2_vl"
    folder = tmp_path / "ckpt"
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "a_vlm_nobody_implements"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="'a_vlm_nobody_implements' is not an image-text-to-text model") as err:
        open_checkpoint(folder)
    assert "model_type" in err.value.fix


def test_a_checkpoint_mlx_vlm_cannot_load_leaves_transformers_to_report(tmp_path):
    """PaliGemma with the tester's own SigLIP pooling head: transformers loads it, mlx-vlm's strict load refuses
    the head's weights. The run says mlx-vlm's own error as a runtime that could not run; transformers reports."""
    from driftscope.cli import main
    from driftscope.families.generic.tiny import build_tiny
    from driftscope.run.report import Report

    checkpoint = build_tiny("paligemma", tmp_path / "ckpt", adjusted=False)
    params = tmp_path / "p.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "name": "mlx-cannot-load",
                "checkpoint": str(checkpoint),
                "images": [str(SHAPES)],
                "runtimes": [{"runtime": "transformers", "policy": "f32"}, {"runtime": "mlx", "policy": "f32"}],
                "stages": {"blocks": True},
                "notebooks": [],
            }
        )
    )
    assert main(["run", str(params), "--out", str(tmp_path / "run")]) == 2
    report = Report.load(tmp_path / "run")
    runtimes = {entry["label"]: entry for entry in report.data["runtimes"]}
    assert runtimes["transformers:f32"].get("tapset"), runtimes["transformers:f32"]  # the reference reported
    assert report.data["verdict"]["per_candidate"] == {"mlx:f32": "could not run"}
    loaded = next(check for check in report.data["checks"]["mlx:f32"] if check["check"] == "loaded")
    assert "mlx-vlm 0.7.10 cannot load this 'paligemma' checkpoint" in loaded["detail"]
    assert "vision_tower.vision_model.head" in loaded["detail"]  # mlx-vlm's own words: the refused tensors


def test_two_models_that_own_no_common_tensor_do_not_align(tmp_path):
    """transformers' model of one tiny checkpoint against mlx-vlm's of the same family with other weights (seed 1):
    nothing aligns, and the reading says so instead of comparing unrelated modules."""
    from driftscope.families.generic.align import align
    from driftscope.families.generic.reading import _mlx_side, _torch_side, nothing_aligns, probe_inputs
    from driftscope.families.generic.tiny import build_tiny

    first = open_checkpoint(ROOT / "fixtures" / "checkpoints" / "generic-qwen2_vl")
    other = open_checkpoint(build_tiny("qwen2_vl", tmp_path / "seed1", seed=1))
    inputs = probe_inputs(first)
    torch_probe, _ = _torch_side(first, inputs)
    assert nothing_aligns(align(torch_probe, _mlx_side(first, inputs))) is None
    said = nothing_aligns(align(torch_probe, _mlx_side(other, inputs)))
    assert said and "nothing aligns" in said
