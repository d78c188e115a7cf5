"""Which weights a scope quantizes, what stays dense and why, and the MLX <-> checkpoint name map."""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.errors import ParameterError
from driftscope.families import get_family
from driftscope.model.quant.host import quantize_weights
from driftscope.model.quant.policy import QuantSpec
from driftscope.model.quant.select import TensorGroups, select_weights
from driftscope.model.weightfile import TensorFiles

PROFILE = get_family("qwen2_5_vl").quant_profile()


@pytest.fixture(scope="module")
def shapes(tiny_checkpoint_dir):
    files = TensorFiles(tiny_checkpoint_dir)
    return {name: files.shape(name) for name in files.names()}


def test_scopes_select_the_matrices_of_their_side(shapes):
    everything = select_weights(shapes, PROFILE.checkpoint, 64, "all")
    vision = select_weights(shapes, PROFILE.checkpoint, 64, "vision")
    text = select_weights(shapes, PROFILE.checkpoint, 64, "text")
    assert len(vision.quantized) == 8 * 5 + 2 and len(text.quantized) == 2 * 7 + 2
    assert sorted(vision.quantized + text.quantized) == sorted(everything.quantized)
    assert all(name.startswith("visual.") for name in vision.quantized)
    assert "model.embed_tokens.weight" in text and "lm_head.weight" in text
    # norms, biases and the 5-D patch-embedding convolution are never quantized
    assert not any(name.endswith(".bias") or "norm" in name or "patch_embed" in name for name in everything.quantized)
    assert everything.left_dense == () and everything.to_dict()["quantized"] == 58


def test_layers_the_group_size_does_not_divide_are_left_dense_and_reported(shapes):
    selection = select_weights(shapes, PROFILE.checkpoint, 128, "vision")
    left = {layer.name: layer for layer in selection.left_dense}
    # 64-wide inputs (qkv, proj, gate, up) cannot hold a 128 group; down_proj (128) and the merger (256) can
    assert len(left) == 8 * 4 and sorted(selection.quantized)[:2] == [
        "visual.blocks.0.mlp.down_proj.weight",
        "visual.blocks.1.mlp.down_proj.weight",
    ]
    qkv = left["visual.blocks.0.attn.qkv.weight"]
    assert (qkv.group, qkv.input_width) == ("vision", 64)
    assert qkv.to_dict()["reason"] == "input width 64 is not a multiple of the group size 128"
    # Molmo2's patch embedding: a 588-wide linear at group size 64
    molmo = select_weights(
        {"vit.patch_embedding.weight": (1152, 588), "vit.mlp.weight": (1152, 1152)},
        TensorGroups(("vit.",), ("llm.",)),
        64,
    )
    assert molmo.quantized == ("vit.mlp.weight",) and molmo.left_dense[0].reason.startswith("input width 588")


def test_a_scope_that_selects_nothing_is_an_error(shapes):
    with pytest.raises(ParameterError, match="scope 'vision' selects no matrix weight") as err:
        select_weights(shapes, TensorGroups(("vision_tower.",), ("language_model.",)), 64, "vision")
    assert "scope" in err.value.fix
    with pytest.raises(ParameterError, match="scope 'audio' is not known"):
        select_weights(shapes, PROFILE.checkpoint, 64, "audio")


def test_vision_prefixes_win_over_text_ones():
    groups = TensorGroups(vision=("visual.", "model.visual."), text=("model.", "lm_head."))
    assert groups.group("model.visual.blocks.0.attn.qkv.weight") == "vision"
    assert groups.group("model.language_model.layers.0.mlp.up_proj.weight") == "text"
    assert groups.group("something.else") is None


def test_in_memory_weights_quantize_and_dequantize_in_the_activation_dtype():
    rng = np.random.default_rng(0)
    weights = {
        "visual.blocks.0.attn.qkv.weight": rng.standard_normal((192, 64)).astype(np.float32),
        "visual.blocks.0.norm1.weight": np.ones(64, dtype=np.float32),
        "lm_head.weight": rng.standard_normal((32, 64)).astype(np.float32),
    }
    host = quantize_weights(weights, PROFILE.checkpoint, QuantSpec(bits=8, scope="vision", activations="float16"))
    assert list(host.quantized) == ["visual.blocks.0.attn.qkv.weight"]
    dense = host.dense_weights(weights)
    assert dense["visual.blocks.0.attn.qkv.weight"].dtype == np.float16  # the spec's activations
    assert dense["lm_head.weight"] is weights["lm_head.weight"]  # out of scope: untouched
    f32 = host.dense_weights(weights, "float32")["visual.blocks.0.attn.qkv.weight"]
    assert f32.dtype == np.float32 and np.abs(f32 - weights["visual.blocks.0.attn.qkv.weight"]).max() < 0.05
    assert host.report()["spec"]["bits"] == 8


def test_name_map_round_trips_names_and_layouts():
    names = PROFILE.mlx_names
    for mlx, checkpoint in (
        ("vision_tower.blocks.3.attn.qkv.weight", "visual.blocks.3.attn.qkv.weight"),
        ("language_model.model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weight"),
        ("language_model.lm_head.weight", "lm_head.weight"),
    ):
        assert names.to_checkpoint(mlx) == checkpoint and names.to_mlx(checkpoint) == mlx
    conv = np.arange(2 * 2 * 3 * 3 * 3, dtype=np.float32).reshape(2, 2, 3, 3, 3)  # MLX (out, t, h, w, in)
    as_checkpoint = names.array_to_checkpoint("vision_tower.patch_embed.proj.weight", conv)
    assert as_checkpoint.shape == (2, 3, 2, 3, 3)  # (out, in, t, h, w)
    assert as_checkpoint[1, 2, 0, 1, 2] == conv[1, 0, 1, 2, 2]
    assert np.array_equal(names.array_to_mlx("visual.patch_embed.proj.weight", as_checkpoint), conv)
