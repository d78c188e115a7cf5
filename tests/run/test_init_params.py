"""``driftscope init CHECKPOINT``: a commented parameter file that runs as written (issue 51 item 4)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from driftscope.capture.runtimes import RUNTIMES
from driftscope.cli import main
from driftscope.core.paths import CONTRACTS, DEMO_IMAGES
from driftscope.errors import CheckpointError
from driftscope.families import detect_family, get_family
from driftscope.run.init_params import draft, write_parameters
from driftscope.run.params import load_parameters
from driftscope.run.preflight import check_parameters


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "molmo2"])
def test_the_written_file_names_the_family_the_installed_runtimes_and_passes_every_check(family, tmp_path):
    checkpoint = get_family(family).tiny.ensure()
    path, found = write_parameters(checkpoint, tmp_path / "mine.yaml")
    written = path.read_text()
    assert f"# family: {family}  (detected from config.json model_type" in written
    params = load_parameters(path)
    check_parameters(params)  # every runtime installed, policy offered, contract read
    assert params.checkpoint == checkpoint.resolve() and params.images == [DEMO_IMAGES / "shapes_448.png"]
    assert [spec.display for spec in params.runtimes][:3] == ["transformers:f32", "mlx:f32", "mlx:f16"]
    assert all(RUNTIMES.get(spec.runtime).check_installed() is None for spec in params.runtimes)
    assert params.contract == CONTRACTS / "default.yaml" and list(params.notebooks) == ["01_stage_parity"]
    data = yaml.safe_load(written)
    assert data["stages"] == {"blocks": True} and data["name"] == checkpoint.name
    commented = [line for line in written.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert all("#" in line for line in commented if line.startswith("  - {runtime")), "every runtime says why"


def test_a_model_type_no_family_claims_is_named(tmp_path, capsys):
    source = get_family("qwen2_5_vl").tiny.ensure()
    checkpoint = tmp_path / "strange"
    checkpoint.mkdir()
    config = json.loads((source / "config.json").read_text())
    config["model_type"] = "strange_vlm"
    (checkpoint / "config.json").write_text(json.dumps(config))
    for weights in source.glob("*.safetensors"):
        (checkpoint / weights.name).symlink_to(weights)
    found = draft(checkpoint)
    try:  # a family that takes any model type (a generic one) detects it: init names what a run would detect
        assert found.family == detect_family(config) and not found.claimed
        assert main(["init", str(checkpoint), "--out", str(tmp_path / "strange.yaml")]) == 0
        written = (tmp_path / "strange.yaml").read_text()
        assert f"# family: {found.family}  (no family folder claims config.json model_type 'strange_vlm')" in written
        return
    except CheckpointError:
        pass
    assert found.family is None and found.model_type == "strange_vlm"
    assert main(["init", str(checkpoint), "--out", str(tmp_path / "strange.yaml")]) == 0
    written = (tmp_path / "strange.yaml").read_text()
    assert "# family: none of the installed families (" in written and "claims model_type 'strange_vlm'" in written
    assert "no installed family claims model_type 'strange_vlm'" in capsys.readouterr().err


def test_an_existing_file_is_kept_unless_forced(tmp_path, capsys):
    checkpoint = get_family("qwen2_5_vl").tiny.ensure()
    target = tmp_path / "p.yaml"
    target.write_text("mine\n")
    assert main(["init", str(checkpoint), "--out", str(target)]) == 2
    assert target.read_text() == "mine\n" and "pass --force to replace it" in capsys.readouterr().err
    assert main(["init", str(checkpoint), "--out", str(target), "--force"]) == 0
    assert "next: driftscope run" in capsys.readouterr().out


def test_without_a_checkpoint_it_says_so(tmp_path, capsys):
    assert main(["init", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
    shutil.rmtree(tmp_path)
