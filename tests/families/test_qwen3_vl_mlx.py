"""mlx-vlm 0.7.10 and the Qwen3-VL checkpoint: the config adapted in memory to what mlx-vlm reads, the
settings mlx-vlm would silently replace refused, a checkpoint that disagrees with its config named."""

from __future__ import annotations

import json
import shutil

import pytest
from driftscope.errors import CheckpointError, ParameterError
from driftscope.families.qwen3_vl.mlx import adapt_config, check_config, load_mlx_model
from qwen3_vl_support import checkpoint, config


def test_config_adaptation_is_what_mlx_vlm_needs():
    adapted = adapt_config(config())
    assert adapted["vision_config"]["model_type"] == "qwen3_vl"
    assert adapted["text_config"]["rope_theta"] == 5e6
    assert adapted["text_config"]["rope_scaling"] == {
        "type": "default",
        "mrope_section": [4, 2, 2],
        "mrope_interleaved": True,
    }
    assert config()["vision_config"]["model_type"] == "qwen3_vl_vision"  # the checkpoint's config is left alone
    from mlx_vlm.models.qwen3_vl.config import VisionConfig
    from mlx_vlm.models.qwen3_vl.vision import VisionModel

    raw = {k: v for k, v in config()["vision_config"].items() if k in VisionConfig.__dataclass_fields__}
    with pytest.raises(ValueError, match="Unsupported model type"):
        VisionModel(VisionConfig(**raw))


def test_settings_mlx_vlm_would_ignore_are_refused():
    exact = {**config(), "vision_config": {**config()["vision_config"], "hidden_act": "gelu"}}
    with pytest.raises(CheckpointError, match="gelu_pytorch_tanh"):
        check_config(exact)
    theta = {**config(), "vision_config": {**config()["vision_config"], "rope_parameters": {"rope_theta": 1e4 * 2}}}
    with pytest.raises(CheckpointError, match="10000"):
        check_config(theta)


def test_a_checkpoint_that_disagrees_with_its_config_is_named(tmp_path):
    for name in ("model.safetensors", "config.json"):
        shutil.copy(checkpoint().path / name, tmp_path / name)
    wrong = {**config(), "vision_config": {**config()["vision_config"], "depth": 5}}
    (tmp_path / "config.json").write_text(json.dumps(wrong))
    with pytest.raises(CheckpointError, match="mlx-vlm's qwen3_vl model does not take checkpoint") as err:
        load_mlx_model(tmp_path, wrong)
    assert "vision_tower.blocks.5" in err.value.problem and "save_pretrained" in err.value.fix


def test_the_manual_rmsnorm_experiment_says_qwen3_vl_has_no_rmsnorm_to_swap(tmp_path):
    from driftscope.capture.runtimes import get_runtime
    from qwen3_vl_support import inputs, plan

    engine = get_runtime("mlx")(checkpoint(), "f16", None, {"rmsnorm": "manual"})
    with pytest.raises(ParameterError, match="LayerNorm") as err:
        engine.capture(inputs("224"), plan(), tmp_path / "x")
    assert "options.rmsnorm" in err.value.fix
