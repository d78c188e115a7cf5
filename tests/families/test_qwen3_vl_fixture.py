"""The tiny Qwen3-VL checkpoint: deterministic bytes, the config FACTS describe, processor and tokenizer files."""

from __future__ import annotations

import json

import numpy as np
from driftscope.families.qwen3_vl.fixture import SyntheticQwen3VLSpec, make_checkpoint
from qwen3_vl_support import checkpoint, config, inputs


def checkpoint_dir():
    return checkpoint().path


def test_building_twice_gives_identical_bytes(tmp_path):
    first, second = make_checkpoint(tmp_path / "a"), make_checkpoint(tmp_path / "b")
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    assert {"model.safetensors", "config.json", "preprocessor_config.json", "tokenizer.json"} <= set(names)
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_a_different_seed_gives_different_weights(tmp_path):
    from safetensors.numpy import load_file

    base = load_file(checkpoint_dir() / "model.safetensors")
    other = load_file(make_checkpoint(tmp_path / "seed1", SyntheticQwen3VLSpec(seed=1)) / "model.safetensors")
    assert base.keys() == other.keys()
    assert not np.array_equal(base["model.visual.pos_embed.weight"], other["model.visual.pos_embed.weight"])


def test_config_is_the_tiny_deepstack_model():
    vision, text = config()["vision_config"], config()["text_config"]
    assert (vision["depth"], vision["hidden_size"], vision["deepstack_visual_indexes"]) == (6, 64, [1, 3, 4])
    assert (vision["patch_size"], vision["num_position_embeddings"], vision["hidden_act"]) == (
        16,
        2304,
        "gelu_pytorch_tanh",
    )
    assert (text["num_hidden_layers"], text["num_attention_heads"], text["num_key_value_heads"]) == (4, 4, 2)
    assert text["rope_parameters"]["mrope_section"] == [4, 2, 2] and text["rope_parameters"]["mrope_interleaved"]
    ids = {k: config()[k] for k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")}
    assert ids == {"image_token_id": 6, "video_token_id": 7, "vision_start_token_id": 3, "vision_end_token_id": 4}


def test_processor_files_record_qwen3_vl_settings():
    processor = json.loads((checkpoint_dir() / "preprocessor_config.json").read_text())
    assert (processor["patch_size"], processor["merge_size"], processor["temporal_patch_size"]) == (16, 2, 2)
    assert processor["image_mean"] == processor["image_std"] == [0.5, 0.5, 0.5]
    assert processor["size"] == {"shortest_edge": 65536, "longest_edge": 16777216}
    assert processor["resample"] == 3  # PIL bicubic


def test_min_pixels_resize_a_224_image_to_256():
    assert inputs("224")["grid_thw"].tolist() == [[1, 16, 16]]
    assert inputs("448")["grid_thw"].tolist() == [[1, 28, 28]]
    assert inputs("224")["pixel_values"].shape == (256, 3 * 2 * 16 * 16)
    assert inputs("224").facts["processor_contract"]["upscaled_by_min_pixels"] == ["224x224 -> 256x256"]


def test_tokenizer_keeps_image_pad_one_token():
    ids = inputs("two-256").text.input_ids
    assert int((ids == 6).sum()) == 2 * 64
    assert int((ids == 3).sum()) == int((ids == 4).sum()) == 2
