"""MLX-community quantized checkpoints: the tiny q4 fixture loads in mlx-vlm as is, our reader dequantizes
it bit for bit like mx.dequantize, and it holds the same codes as quantizing the dense fixture on the host."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from driftscope.errors import CheckpointError
from driftscope.families import get_family
from driftscope.model.quant.affine import from_mlx, mlx_core
from driftscope.model.quant.host import quantize_checkpoint
from driftscope.model.quant.mlx_checkpoint import MLXQuantizedCheckpoint
from driftscope.model.quant.policy import QuantSpec
from driftscope.model.weightfile import TensorFiles

PROFILE = get_family("qwen2_5_vl").quant_profile()


@pytest.fixture(scope="module")
def mx():
    return mlx_core()  # not at import time: driftscope loads OpenBLAS for MLX before mlx.core is imported


@pytest.fixture(scope="module")
def tiny_q4(tiny_checkpoint_dir) -> Path:
    from make_tiny_q4 import ensure_q4

    return ensure_q4(get_family("qwen2_5_vl"))  # skips a checkpoint already there


def quantized_modules(model) -> dict:
    import mlx.nn as nn

    kinds = (nn.QuantizedLinear, nn.QuantizedEmbedding)
    return {name: module for name, module in model.named_modules() if isinstance(module, kinds)}


def test_mlx_vlm_loads_the_q4_checkpoint_as_is(mx, tiny_q4):
    import mlx.nn as nn
    from mlx_vlm.utils import load_model

    config = json.loads((tiny_q4 / "config.json").read_text())
    assert config["quantization"] == config["quantization_config"] == {"group_size": 64, "bits": 4, "mode": "affine"}
    model = load_model(tiny_q4)  # mlx-vlm's own load path: config, sanitize, nn.quantize, strict load
    modules = quantized_modules(model)
    vision = [name for name in modules if name.startswith("vision_tower.")]
    text = [name for name in modules if name.startswith("language_model.")]
    assert len(vision) == 8 * 5 + 2 and len(text) == 2 * 7 + 2  # every linear, the merger, embedding and head
    assert isinstance(modules["language_model.model.embed_tokens"], nn.QuantizedEmbedding)
    assert all(m.bits == 4 and m.group_size == 64 for m in modules.values())
    assert isinstance(model.vision_tower.patch_embed.proj, nn.Conv3d)  # no to_quantized: stays dense
    stored = mx.load(str(tiny_q4 / "model.safetensors"))
    qkv = modules["vision_tower.blocks.0.attn.qkv"]
    assert np.array_equal(np.array(qkv.weight), np.array(stored["vision_tower.blocks.0.attn.qkv.weight"]))


def test_reader_dequantizes_bit_identically_to_mx_dequantize(mx, tiny_q4):
    checkpoint = MLXQuantizedCheckpoint(tiny_q4)
    stored = mx.load(str(tiny_q4 / "model.safetensors"))
    dense = checkpoint.dense_weights()
    assert len(checkpoint.layers) == 58
    assert not any(name.endswith((".scales", ".biases")) for name in dense)
    for path, settings in checkpoint.layers.items():
        expected = mx.dequantize(
            stored[f"{path}.weight"],
            stored[f"{path}.scales"],
            stored[f"{path}.biases"],
            settings.group_size,
            settings.bits,
        )
        got = dense[f"{path}.weight"]
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), from_mlx(expected).view(np.uint32)), path
    half = checkpoint.dense_weights("bfloat16")["vision_tower.blocks.0.mlp.down_proj.weight"]
    path = "vision_tower.blocks.0.mlp.down_proj"
    scales, biases = (stored[f"{path}.{p}"].astype(mx.bfloat16) for p in ("scales", "biases"))
    expected = from_mlx(mx.dequantize(stored[f"{path}.weight"], scales, biases, 64, 4))
    assert half.dtype == expected.dtype and np.array_equal(half.view(np.uint16), expected.view(np.uint16))
    assert checkpoint.report(PROFILE.mlx)["quantized"] == {"vision": 42, "text": 16}


def test_checkpoint_holds_the_host_quantization_of_the_dense_fixture(tiny_q4, tiny_checkpoint_dir):
    """nn.quantize on mlx-vlm's model (the fixture) == mx.quantize of the checkpoint's tensors by name (host)."""
    dense = PROFILE.mlx_names.weights_to_checkpoint(MLXQuantizedCheckpoint(tiny_q4).dense_weights())
    files = TensorFiles(tiny_checkpoint_dir)
    assert sorted(dense) == sorted(files.names())
    host = quantize_checkpoint(tiny_checkpoint_dir, PROFILE.checkpoint, QuantSpec(bits=4))
    assert host.report()["quantized"] == 58 and host.report()["left_dense"] == []
    dequantized = host.dequantized()
    for name in files.names():
        assert dense[name].shape == files.shape(name), name
        expected = dequantized.get(name, files.read(name))
        assert np.array_equal(dense[name], expected), name
    assert not np.array_equal(
        dequantized["visual.blocks.0.attn.qkv.weight"], files.read("visual.blocks.0.attn.qkv.weight")
    )


def test_the_fixture_is_deterministic(tiny_q4, tiny_checkpoint_dir, tmp_path):
    from make_tiny_q4 import main

    main([str(tmp_path / "again"), "--source", str(tiny_checkpoint_dir)])
    names = sorted(p.name for p in tiny_q4.iterdir())
    assert names == sorted(p.name for p in (tmp_path / "again").iterdir())
    for name in names:
        assert (tiny_q4 / name).read_bytes() == (tmp_path / "again" / name).read_bytes(), name


def test_layers_the_group_size_does_not_divide_stay_dense_and_are_reported(mx, tiny_checkpoint_dir, tmp_path):
    import mlx.nn as nn
    from make_tiny_q4 import main
    from mlx_vlm.utils import load_model

    out = tmp_path / "q8-g128"
    main([str(out), "--source", str(tiny_checkpoint_dir), "--bits", "8", "--group-size", "128"])
    checkpoint = MLXQuantizedCheckpoint(out)
    report = checkpoint.report(PROFILE.mlx)
    left = {row["name"]: row for row in report["left_dense"]}
    assert "vision_tower.blocks.0.attn.qkv.weight" in left and "language_model.lm_head.weight" in left
    assert (
        left["vision_tower.blocks.0.attn.qkv.weight"]["reason"]
        == "input width 64 is not a multiple of the group size 128"
    )
    assert "vision_tower.blocks.0.mlp.down_proj.weight" not in left  # 128 wide: quantized
    assert report["quantized"] == {"vision": 8 + 2, "text": 2}  # down projections and the merger
    written = json.loads((out / "driftscope_quant.json").read_text())
    assert sorted(row["name"] for row in written["left_dense"]) == sorted(left)
    model = load_model(out)  # mlx-vlm leaves the layers without scales dense
    modules = quantized_modules(model)
    assert sorted(modules) == sorted(path for path in checkpoint.layers)
    assert type(model.vision_tower.blocks[0].attn.qkv) is nn.Linear
    assert model.vision_tower.blocks[0].mlp.down_proj.bits == 8
    assert all(name + ".weight" not in left for name in modules)


def test_per_layer_overrides_are_read_as_mlx_vlm_writes_them(mx, tiny_checkpoint_dir, tmp_path):
    """One layer at group size 32 / 8 bits, one left dense by ``false``: mlx-vlm loads it, our reader agrees."""
    import mlx.nn as nn
    from mlx_vlm.utils import load_model, save_config, save_weights

    config = json.loads((tiny_checkpoint_dir / "config.json").read_text())
    model = get_family("qwen2_5_vl").engine("mlx").load(tiny_checkpoint_dir, config)
    special, dense = "language_model.model.layers.0.mlp.down_proj", "language_model.model.layers.1.mlp.up_proj"

    def predicate(path, module):
        if path == special:
            return {"group_size": 32, "bits": 8, "mode": "affine"}
        return hasattr(module, "to_quantized") and path != dense

    nn.quantize(model, 64, 4, class_predicate=predicate)
    save_weights(tmp_path, model)
    quantization = {"group_size": 64, "bits": 4, "mode": "affine", special: predicate(special, None), dense: False}
    save_config(
        {**PROFILE.mlx_config(config), "quantization": quantization, "quantization_config": quantization},
        tmp_path / "config.json",
    )
    loaded = quantized_modules(load_model(tmp_path))
    checkpoint = MLXQuantizedCheckpoint(tmp_path)
    assert (checkpoint.layers[special].group_size, checkpoint.layers[special].bits) == (32, 8)
    assert (loaded[special].group_size, loaded[special].bits) == (32, 8)
    assert dense not in checkpoint.layers and dense not in loaded
    expected = mx.dequantize(loaded[special].weight, loaded[special].scales, loaded[special].biases, 32, 8)
    assert np.array_equal(checkpoint.dense_weights()[special + ".weight"], np.array(expected))


def test_bad_quantized_checkpoints_are_named(mx, tiny_checkpoint_dir, tiny_q4, tmp_path):
    with pytest.raises(CheckpointError, match="not MLX-quantized") as err:
        MLXQuantizedCheckpoint(tiny_checkpoint_dir)
    assert "q4/q8 policy" in err.value.fix
    broken = tmp_path / "broken"
    broken.mkdir()
    stored = mx.load(str(tiny_q4 / "model.safetensors"))
    stored.pop("vision_tower.blocks.0.attn.qkv.biases")
    mx.save_safetensors(str(broken / "model.safetensors"), stored)
    (broken / "config.json").write_text((tiny_q4 / "config.json").read_text())
    with pytest.raises(CheckpointError, match="'vision_tower.blocks.0.attn.qkv' has no 'biases' tensor"):
        MLXQuantizedCheckpoint(broken)
    config = json.loads((tiny_q4 / "config.json").read_text())
    config["quantization"]["vision_tower.blocks.0.attn.proj"] = {"group_size": 32, "bits": 4}
    config["quantization_config"] = config["quantization"]
    (broken / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(broken / "model.safetensors"), mx.load(str(tiny_q4 / "model.safetensors")))
    with pytest.raises(CheckpointError, match="'vision_tower.blocks.0.attn.proj' does not fit config.json's settings"):
        MLXQuantizedCheckpoint(broken).dense_weights()
