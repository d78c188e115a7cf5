"""HunYuan-VL (``fixes/hunyuan_vl.py``): mlx-vlm 0.7.10's vision tower ignores ``hidden_act`` and its fallback XD-RoPE
positions start an image at every image token; transformers 5.24 recomposes the XD-RoPE channels unlike the original
code. The sweep's run localizes each in turn, and the ready patches close them."""

from __future__ import annotations

import numpy as np
from conftest import SHAPES
from generic_fix_support import conclusion, first_divergence, rows, sweep_run


def test_the_vision_activation_then_the_rotary_positions_are_localized_and_closed(tmp_path):
    report = sweep_run("hunyuan_vl", tmp_path / "as-is")
    assert first_divergence(report) == "vision.block.0.mlp.fc2.input"
    said = conclusion(report)
    assert said["kind"] == "introduced" and said["stage"] == "vision.block.0.mlp"
    assert said["between"] == ["model.vision_tower.layers.0.mlp.activation_fn"]
    assert said["ready_patches"][0] == "driftscope.hypotheses:hunyuan_vl_vision_hidden_act"

    mlx_fixed = sweep_run("hunyuan_vl", tmp_path / "mlx-fixed", mlx="hunyuan_vl_fixes")
    assert all(rows(mlx_fixed)[s]["status"] == "pass" for s in ("vision.block.1.mlp", "vision.patch_merger.proj_act"))
    said = conclusion(mlx_fixed)  # what is left: transformers' own recomposition of the rotary channels
    assert said["kind"] == "introduced" and said["stage"] == "text.layer.0.self_attn"
    assert first_divergence(mlx_fixed) == "text.layer.0.self_attn.query_layernorm.input"  # the rotated queries

    both = sweep_run("hunyuan_vl", tmp_path / "both", mlx="hunyuan_vl_fixes", transformers="hunyuan_vl_xdrope_sections")
    assert both.data["verdict"]["status"] == "pass", both.data["verdict"]["reasons"]


def test_the_corrected_positions_are_transformers_own():
    """mlx-vlm's positions, corrected, against transformers' ``get_rope_index`` on the sweep's prompt."""
    import torch
    import transformers
    from driftscope.families.checkpoints import open_checkpoint
    from driftscope.families.generic import _prepare_inputs
    from driftscope.families.generic.calls import mlx_load, transformers_kwargs
    from driftscope.families.generic.fixes.hunyuan_vl import hunyuan_vl_xdrope_positions
    from make_generic_tinies import ensure

    checkpoint = open_checkpoint(ensure("hunyuan_vl"))
    inputs = _prepare_inputs(checkpoint, [SHAPES])
    given = transformers_kwargs(inputs)
    model = transformers.AutoModelForImageTextToText.from_pretrained(str(checkpoint.path), dtype=torch.float32)
    expected, _ = model.model.get_rope_index(given["input_ids"], given["mm_token_type_ids"], given["image_grid_thw"])
    theirs = mlx_load(checkpoint.path, checkpoint.config)
    merge = checkpoint.config["vision_config"]["spatial_merge_size"]
    args = (given["input_ids"][0].tolist(), given["image_grid_thw"].numpy(), checkpoint.config["image_token_id"], merge)
    positions = theirs.language_model.get_xdrope_input_positions
    assert not np.array_equal(np.array(positions(*args)), expected[:, 0].numpy())
    hunyuan_vl_xdrope_positions(theirs)
    np.testing.assert_array_equal(np.array(theirs.language_model.get_xdrope_input_positions(*args)), expected[:, 0])
