"""Configurations nobody here chose (issue 32): refused when the checkpoint is opened, or run whatever the schedule."""

from __future__ import annotations

import json
import shutil

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
    with pytest.raises(CheckpointError, match=r"mrope_section \[2, 1, 1\] sums to 4.* has 8 rotary") as err:
        open_checkpoint(path)
    assert "summing to 8" in err.value.fix
    # the refusal is transformers' own failure, met before any model runs
    text = Qwen2_5_VLConfig(**{k: v for k, v in config.items() if k != "architectures"}).text_config
    rotary = Qwen2_5_VLRotaryEmbedding(text)
    positions = torch.zeros(3, 1, 5, dtype=torch.long)
    with pytest.raises(RuntimeError, match="split_with_sizes expects split_sizes to sum exactly to 8"):
        rotary(torch.zeros(1, 5, 64), positions)
    fitting, _ = _with_text_rope(tmp_path / "fits", [4, 2, 2])
    assert open_checkpoint(fitting).config["text_config"]["rope_parameters"]["mrope_section"] == [4, 2, 2]
