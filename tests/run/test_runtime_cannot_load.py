"""A runtime that cannot load is could-not-run for its pairs, the others are still captured, compared and rendered
(issue 32 items 3, 4: MLX on a 27-layer Molmo2 selecting layer 26 stopped the whole run, and its message blamed a
config.json that was right)."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import ROOT

IMAGE = ROOT / "fixtures" / "images" / "shapes_224.png"


@pytest.fixture(scope="module")
def deep_molmo2(tmp_path_factory):
    """A hub-layout Molmo2 whose ``vit_layers`` select layer 26 of its 27 declared layers (all 27 persisted)."""
    from driftscope.families.molmo2.fixture import SyntheticMolmo2Spec, make_checkpoints

    base = tmp_path_factory.mktemp("deep-molmo2")
    hub, _ = make_checkpoints(base / "hub", base / "native", SyntheticMolmo2Spec(vit_layers=(-1, -9)))
    return hub


def test_the_mlx_port_limit_is_named_before_loading(deep_molmo2):
    from driftscope.capture.runtimes import get_runtime
    from driftscope.errors import PortLimitError
    from driftscope.families.checkpoints import open_checkpoint

    runtime = get_runtime("mlx")(open_checkpoint(deep_molmo2), "f32")
    with pytest.raises(PortLimitError) as err:
        runtime.load()
    assert "adapter_config.vit_layers [-1, -9] selects layer 26 of the 27 declared ViT layers" in err.value.problem
    assert "keeps only 25" in err.value.problem and "cannot represent this config" in err.value.problem
    assert "config.json is right" in err.value.fix and "other runtimes" in err.value.fix
    assert "check that config.json" not in str(err.value)


def test_a_runtime_that_cannot_load_leaves_the_other_pairs_compared_and_rendered(deep_molmo2, tmp_path):
    from driftscope.cli import main

    params = tmp_path / "p.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "name": "mlx-cannot-load",
                "checkpoint": str(deep_molmo2),
                "images": [str(IMAGE)],
                "runtimes": ["transformers:f32", "mlx:f32", "jax:f32"],
                "replay": False,  # the claim is which pairs are compared and shown, not what a replay finds
                "notebooks": ["01_stage_parity"],
            }
        )
    )
    out = tmp_path / "out"
    assert main(["run", str(params), "--out", str(out)]) == 2
    data = json.loads((out / "report.json").read_text())
    assert data["status"] == "complete"
    (check,) = data["checks"]["mlx:f32"]
    assert check["check"] == "loaded" and check["status"] == "could not run"
    assert "selects layer 26" in check["detail"] and "other runtimes" in check["detail"]
    verdict = data["verdict"]
    assert verdict["status"] == "could not run"
    assert verdict["per_candidate"] == {"mlx:f32": "could not run", "jax:f32": "pass"}
    assert {row["candidate"] for row in data["rows"]} == {"jax:f32"}
    assert [r["label"] for r in data["runtimes"]] == ["transformers:f32", "jax:f32"]
    page = (out / "01_stage_parity.html").read_text()
    assert "0 of 2 runtime pairs fail, 1 could not run" in page and "selects layer 26" in page and "jax:f32" in page


def test_a_merge_size_the_mlx_port_ignores_is_named(tmp_path, tiny_checkpoint_dir):
    """transformers' Qwen2.5-VL tester config merges 1x1; mlx-vlm's merger always merges 2x2."""
    import shutil

    from driftscope.capture.runtimes import get_runtime
    from driftscope.errors import PortLimitError
    from driftscope.families.checkpoints import open_checkpoint

    shutil.copytree(tiny_checkpoint_dir, tmp_path / "ck")
    config = json.loads((tmp_path / "ck" / "config.json").read_text())
    config["vision_config"]["spatial_merge_size"] = 1
    (tmp_path / "ck" / "config.json").write_text(json.dumps(config))
    with pytest.raises(PortLimitError, match=r"vision_config.spatial_merge_size is 1; mlx-vlm's merger always merges"):
        get_runtime("mlx")(open_checkpoint(tmp_path / "ck"), "f32").load()
    assert get_runtime("mlx")(open_checkpoint(tiny_checkpoint_dir), "f32").load() is None  # 2x2 loads


def test_a_runtime_that_cannot_capture_leaves_the_other_pairs_compared(tmp_path, tiny_checkpoint_dir):
    """iree-compile refusing the graph (here: a flag it does not know) stops only the IREE capture."""
    from conftest import write_params
    from driftscope.cli import main

    iree = {"runtime": "iree", "policy": "f32", "options": {"flags": ["--iree-no-such-flag"]}}
    # the block outputs, no replay and no notebook: the claim is which captures run and which pairs are compared
    params = write_params(
        tmp_path / "p.yaml",
        "iree-cannot-compile",
        ["transformers:f32", iree, "mlx:f32"],
        stages={"blocks": True},
        replay=False,
        notebooks=[],
    )
    assert main(["run", str(params), "--out", str(tmp_path / "out")]) == 2
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    (check,) = data["checks"]["iree:f32"]
    assert check["check"] == "complete" and check["status"] == "could not run"
    assert "iree-compile" in check["detail"] and "no-such-flag" in check["detail"]
    assert data["verdict"]["per_candidate"] == {"iree:f32": "could not run", "mlx:f32": "pass"}
    assert {row["candidate"] for row in data["rows"]} == {"mlx:f32"}
