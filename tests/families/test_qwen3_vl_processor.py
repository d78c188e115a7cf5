"""The processor contract of a Qwen3-VL run: the resize bounds and the resampler it ran with are recorded,
and a run whose processor is not what the checkpoint's preprocessor_config.json states says so (in the
inputs' facts and among the report's warnings)."""

from __future__ import annotations

import json
import shutil

import yaml
from driftscope.families.checkpoints import open_checkpoint
from qwen3_vl_support import FAMILY, checkpoint, image_paths, inputs


def _copy(tmp_path, edit):
    target = tmp_path / "checkpoint"
    shutil.copytree(checkpoint().path, target)
    config = json.loads((target / "preprocessor_config.json").read_text())
    edit(config)
    (target / "preprocessor_config.json").write_text(json.dumps(config))
    return open_checkpoint(target)


def test_the_run_records_the_bounds_and_the_resampler_and_agrees_with_its_config():
    facts = inputs("224").facts
    assert facts["processor"]["resample"] == "bicubic"
    assert (facts["processor"]["min_pixels"], facts["processor"]["max_pixels"]) == (65536, 16777216)
    assert facts["processor_contract"]["stated"]["resample"] == "bicubic"
    assert facts["processor_contract"]["differences"] == [] and inputs("224").warnings == []
    assert inputs("224").summary()["processor"]["patch_size"] == 16


def test_a_config_without_bounds_runs_on_the_class_defaults_and_says_so(tmp_path):
    """The PIL class falls back to Qwen2-VL's bounds: a 224x224 image is no longer upscaled to 256x256."""
    bare = _copy(tmp_path, lambda config: config.pop("size"))
    ran = FAMILY.prepare_inputs(bare, list(image_paths("224")))
    assert ran["grid_thw"].tolist() == [[1, 14, 14]]
    assert any("does not state min_pixels: the class default 3136" in warning for warning in ran.warnings)
    assert any("does not state max_pixels" in warning for warning in ran.warnings)
    assert ran.summary()["warnings"] == ran.warnings


def test_contradicting_bounds_in_the_config_are_named(tmp_path):
    contradicting = _copy(tmp_path, lambda config: config.update(min_pixels=3136))
    ran = FAMILY.prepare_inputs(contradicting, list(image_paths("224")))
    assert any(
        "states min_pixels 3136 and size.shortest_edge 65536: transformers uses min_pixels" in warning
        for warning in ran.warnings
    )
    assert ran["grid_thw"].tolist() == [[1, 14, 14]]


def test_an_override_that_differs_from_the_config_is_a_difference(tmp_path):
    ran = FAMILY.prepare_inputs(checkpoint(), list(image_paths("224")), {"resample": 2})
    assert ran.facts["processor"]["resample"] == "bilinear"
    assert ran.warnings == [
        "processor contract: resample bilinear differs from the checkpoint's preprocessor_config.json (bicubic)"
    ]


def test_the_report_carries_the_processor_warnings(tmp_path):
    from driftscope.run.investigation import investigate

    bare = _copy(tmp_path, lambda config: config.pop("size"))
    parameters = {
        "name": "qwen3-processor-contract",
        "checkpoint": str(bare.path),
        "images": [str(p) for p in image_paths("224")],
        "runtimes": [{"runtime": "transformers"}, {"runtime": "mlx"}],
        "stages": {"blocks": True, "substages": []},
    }
    path = tmp_path / "parameters.yaml"
    path.write_text(yaml.safe_dump(parameters))
    report = investigate(path, tmp_path / "out")
    assert report.data["family"] == "qwen3_vl"
    assert report.data["inputs"]["processor"]["resample"] == "bicubic"
    assert any("does not state min_pixels" in warning for warning in report.data["warnings"])
    assert report.verdict == "pass"
