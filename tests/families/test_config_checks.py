"""Configurations nobody here chose (issue 32): refused when the checkpoint is opened, or run whatever the schedule."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import TINY
from driftscope.errors import CheckpointError
from driftscope.families.checkpoints import open_checkpoint


def _with_text_rope(tmp_path, mrope_section: list[int]):
    """The tiny Qwen2.5-VL checkpoint (text head_dim 64 / 4 = 16) with another ``mrope_section``."""
    out = tmp_path / "ckpt"
    shutil.copytree(TINY, out)
    config = json.loads((out / "config.json").read_text())
    config["text_config"]["rope_parameters"]["mrope_section"] = mrope_section
    (out / "config.json").write_text(json.dumps(config))
    return out, config


def test_an_mrope_section_that_does_not_fit_the_head_dim_is_refused_when_the_checkpoint_opens(tmp_path):
    """mlx-vlm's Qwen2.5-VL test config pairs ``mrope_section [2, 1, 1]`` with head_dim 80; transformers fails on it
    only in the text prefill. The tiny checkpoint's head_dim 16 has 8 rotary frequencies; [2, 1, 1] splits 4."""
    import torch
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding

    path, config = _with_text_rope(tmp_path, [2, 1, 1])
    refusal = r"text_config\.rope_parameters\.mrope_section \[2, 1, 1\] sums to 4.* has 8 rotary"
    with pytest.raises(CheckpointError, match=refusal) as err:
        open_checkpoint(path)
    assert "summing to 8" in err.value.fix
    # the refusal is transformers' own failure, met before any model runs
    text = Qwen2_5_VLConfig(**{k: v for k, v in config.items() if k != "architectures"}).text_config
    rotary = Qwen2_5_VLRotaryEmbedding(text)
    positions = torch.zeros(3, 1, 5, dtype=torch.long)
    with pytest.raises(RuntimeError, match="split_with_sizes expects split_sizes to sum exactly to 8"):
        rotary(torch.zeros(1, 5, 64), positions)
    # mlx-vlm's test_qwen2_5_vl text settings, in the flat layout it reads: head_dim 1280 / 16 = 80, 40 frequencies
    from driftscope.families.qwen2_5_vl.plan import check_config

    mlx_vlm_test = {"hidden_size": 1280, "num_attention_heads": 16, "rope_scaling": {"mrope_section": [2, 1, 1]}}
    with pytest.raises(CheckpointError, match=r"^rope_scaling\.mrope_section \[2, 1, 1\] sums to 4.* has 40 rotary"):
        check_config(mlx_vlm_test)
    fitting, _ = _with_text_rope(tmp_path / "fits", [4, 2, 2])
    assert open_checkpoint(fitting).config["text_config"]["rope_parameters"]["mrope_section"] == [4, 2, 2]


@pytest.mark.parametrize("full", [(7, 15, 23, 31), (0, 1)], ids=["no-full-attention-block", "only-full-attention"])
def test_both_attention_bounds_are_captured_whatever_the_schedule(full, tmp_path):
    """Replay needs the full and the window bounds even where no block attends that way (depth 2, 2x2 merges,
    so mlx-vlm loads it too): each runtime gives the bounds transformers' own tower computes for the image."""
    import torch
    from conftest import SHAPES
    from driftscope.capture.runtimes import get_runtime
    from driftscope.families import get_family
    from driftscope.families.qwen2_5_vl.fixture import SyntheticQwen25VLSpec, make_checkpoint
    from driftscope.taps.stages import StageSelection
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as modeling

    spec = SyntheticQwen25VLSpec(vision_depth=2, fullatt_block_indexes=full, text_layers=1, seed=5)
    checkpoint = open_checkpoint(make_checkpoint(tmp_path / "ckpt", spec))
    family = get_family(checkpoint.family)
    inputs = family.prepare_inputs(checkpoint, [SHAPES])
    plan = family.vision_plan(checkpoint.config).select(StageSelection.everything())
    grid = torch.from_numpy(inputs["grid_thw"])
    vision = modeling.Qwen2_5_VLConfig.from_pretrained(checkpoint.path).vision_config
    expected_full = modeling.get_vision_attention_seqlens(grid, vision)[0].tolist()
    _, window = modeling.get_vision_window_index(grid, spatial_merge_size=2, window_size=112, patch_size=14)
    expected_window = torch.unique_consecutive(torch.as_tensor(window)).tolist()
    assert expected_full == [0, int(grid[0, 1] * grid[0, 2])] and len(expected_window) > 2
    for name in ("transformers", "mlx"):
        runtime = get_runtime(name)(checkpoint, "f32")
        tapset = runtime.capture(inputs, plan, tmp_path / name)
        runtime.release()
        assert np.asarray(tapset["vision.cu_seqlens"]).tolist() == expected_full, name
        assert np.asarray(tapset["vision.cu_window_seqlens"]).tolist() == expected_window, name
        family.replay_context(tapset, plan)  # what stopped replay:iree
