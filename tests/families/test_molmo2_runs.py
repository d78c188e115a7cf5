"""The Molmo2 parameter files as runs: each defect run names its defect's stage as the first divergence and the
first introduced error (driftscope's report, not a test's own comparison), and the demo renders notebooks
01-04 and 06 with every mlx-vlm defect found and closed by its patch."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT
from molmo2_support import DEFECT_STAGE, checkpoint_dirs

DEFECT_RUNS = {
    "tanh_gelu": "molmo2_gelu_defect.yaml",
    "layers_from_declared_depth": "molmo2_layers_defect.yaml",
    "bidirectional_image_mask": "molmo2_mask_defect.yaml",
}


@pytest.mark.slow
@pytest.mark.parametrize("fix", sorted(DEFECT_RUNS))
def test_each_defect_run_names_its_defect_first(fix, tmp_path):
    from driftscope.run.investigation import investigate
    from driftscope.run.params import load_parameters

    checkpoint_dirs()  # built when absent
    report = investigate(load_parameters(ROOT / "parameters" / DEFECT_RUNS[fix]), tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    label = f"mlx-without-{fix}"
    (first,) = data["first_divergence"].values()
    assert first["stage"] == DEFECT_STAGE[fix], first
    assert data["replay"][label]["first_introduced"] == DEFECT_STAGE[fix]
    assert report.data["verdict"]["status"] == "fail"


@pytest.mark.slow
def test_the_demo_renders_its_notebooks_and_shows_each_defect_and_its_patch(tmp_path):
    from driftscope.cli import main

    checkpoint_dirs()
    out = tmp_path / "demo"
    code = main(["run", str(ROOT / "parameters" / "demo_molmo2.yaml"), "--out", str(out), "--no-gate"])
    assert code == 0
    for name in (
        "01_stage_parity",
        "02_layer_drilldown",
        "03_window_geometry",
        "04_negative_controls",
        "06_answer_parity",
    ):
        assert (out / f"{name}.html").exists(), name
    data = json.loads((out / "report.json").read_text())
    first = {key: (entry or {}).get("stage") for key, entry in data["first_divergence"].items()}
    expected = {
        "mlx:f32": DEFECT_STAGE["tanh_gelu"],  # mlx-vlm as shipped: the first of its three defects
        "mlx-fixed": None,
        "mlx-without-tanh_gelu": DEFECT_STAGE["tanh_gelu"],
        "mlx-without-layers_from_declared_depth": DEFECT_STAGE["layers_from_declared_depth"],
        "mlx-without-bidirectional_image_mask": DEFECT_STAGE["bidirectional_image_mask"],
        "iree:f32": None,
        "transformers:tf32": "vision.patch_embed",  # TF32 operands move the oracle from its first matmul
    }
    assert first == expected
    for label in (
        "mlx-without-tanh_gelu",
        "mlx-without-layers_from_declared_depth",
        "mlx-without-bidirectional_image_mask",
    ):
        assert data["replay"][label]["first_introduced"] == expected[label], label
    power = {entry["mutation"]: entry for entry in data["power"]["mutations"]}
    for name in ("layers_after_truncation", "exact_gelu_vit", "causal_image_mask"):
        assert power[name]["detected"] and power[name]["at_declared_stage"], power[name]
