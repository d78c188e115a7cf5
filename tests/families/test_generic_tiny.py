"""The generic family's tiny checkpoints (``driftscope.families.generic``): one builder for 15 model types from
transformers' own model testers, their inputs through each family's real processor, and the whole-model prefill of
transformers (f32, the reference) against mlx-vlm's, as ``benchmarks/generic_probe.py`` measures for
docs/families.md (there on two images; here on one)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import ROOT
from driftscope.errors import CheckpointError, InputError
from driftscope.families.generic.calls import mlx_config
from driftscope.families.generic.testers import VOCAB, get_tester, model_types
from driftscope.families.generic.tokens import SPECS
from make_generic_tinies import ensure

IMAGE = ROOT / "fixtures" / "images" / "shapes_448.png"
#: the model types whose mlx-vlm prefill agrees with transformers' to f32 round-off (docs/families.md); the others
#: differ where mlx-vlm computes something else (the generic family localizes it)
AGREE = ("qwen2_vl", "smolvlm", "idefics3", "lfm2_vl")
#: the model types transformers 5.24 has no torchvision-free processor for: their inputs come from mlx-vlm's
MLX_VLM_PROCESSOR = ("mistral3", "lfm2_vl")
#: the model types whose unpatched mlx-vlm prefill reads outside a table: its logits differ on every run and may be
#: NaN (Idefics2's position id -2 of a one-row table on the tester's one-patch grid; docs/families.md)
READS_OUTSIDE = ("idefics2",)


def test_fifteen_model_types_have_a_tester_config():
    assert sorted(model_types()) == sorted(
        "qwen2_vl smolvlm idefics3 idefics2 llava llava_next llava_onevision paligemma gemma3 mistral3 internvl "
        "aya_vision lfm2_vl glm4v hunyuan_vl".split()
    )
    assert set(SPECS) == set(model_types())
    with pytest.raises(CheckpointError, match="no model tester config for model_type 'nope'"):
        get_tester("nope")


def test_mlx_config_moves_settings_where_mlx_vlm_reads_them():
    config = {
        "model_type": "qwen2_vl",
        "image_token_id": 7,
        "mm_tokens_per_image": 1,
        "text_config": {
            "hidden_size": 32,
            "num_attention_heads": 4,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
        },
        "vision_config": {"model_type": "qwen2_vl_vision"},
    }
    adapted = mlx_config(config)
    text = adapted["text_config"]
    assert text["rope_theta"] == 10000.0
    assert text["partial_rotary_factor"] == 1.0  # what transformers uses where rope_parameters does not say
    assert text["rope_scaling"] == {"rope_type": "default", "mrope_section": [2, 1, 1], "type": "mrope"}
    assert adapted["hidden_size"] == 32 and adapted["rope_scaling"] == text["rope_scaling"]  # copied up
    assert text["mm_tokens_per_image"] == 1 and text["image_token_index"] == 7  # copied down, both spellings
    assert text["head_dim"] == 8
    assert "rope_scaling" not in config["text_config"]  # a new dict: the checkpoint's config is untouched
    plain = mlx_config({"model_type": "llava", "text_config": {"rope_parameters": {"rope_type": "default"}}})
    assert "rope_scaling" not in plain["text_config"]  # default RoPE: nothing to say
    layered = {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}}
    gemma = mlx_config({"model_type": "gemma3", "text_config": {"rope_parameters": layered}})["text_config"]
    assert (gemma["rope_global_base_freq"], gemma["rope_local_base_freq"]) == (1e6, 1e4)
    # GLM-4.1V's image markers under the name mlx-vlm's mrope index reads; a config that names both keeps its own
    glm = mlx_config({"model_type": "glm4v", "image_start_token_id": 3, "image_end_token_id": 4})
    assert (glm["vision_start_token_id"], glm["vision_end_token_id"]) == (3, 4)
    both = mlx_config({"model_type": "x", "image_start_token_id": 3, "vision_start_token_id": 9})
    assert both["vision_start_token_id"] == 9


def test_mlx_config_model_type_rules():
    hunyuan = mlx_config(
        {"model_type": "hunyuan_vl", "text_config": {"rope_parameters": {"rope_theta": 1e4, "mrope_section": [2] * 4}}}
    )
    assert hunyuan["text_config"]["rope_scaling"]["xdrope_section"] == [2, 2, 2, 2]
    assert hunyuan["text_config"]["rope_scaling"]["type"] == "xdrope"
    lfm2 = mlx_config({"model_type": "lfm2_vl", "text_config": {"hidden_size": 32}})
    assert lfm2["text_config"]["block_dim"] == 32


def test_build_is_deterministic(tmp_path):
    from driftscope.families.generic.tiny import build_tiny

    for model_type in ("llava", "qwen2_vl"):
        first = build_tiny(model_type, tmp_path / "a" / model_type)
        second = build_tiny(model_type, tmp_path / "b" / model_type)
        names = sorted(path.name for path in first.iterdir())
        assert names == sorted(path.name for path in second.iterdir())
        assert "model.safetensors" in names and "tokenizer.json" in names
        for name in names:
            assert (first / name).read_bytes() == (second / name).read_bytes(), f"{model_type}/{name}"


@pytest.mark.parametrize("model_type", model_types())
def test_every_parameter_is_seeded_random_and_ids_are_the_tokenizers(model_type):
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    directory = ensure(model_type)
    tensors = load_file(directory / "model.safetensors")
    digests = {}
    for name, array in tensors.items():
        assert np.isfinite(array).all() and float(array.std()) > 0, f"{name} is constant"
        assert float(np.abs(array).max()) < 10, f"{name} is not small"
        digests.setdefault(array.tobytes(), []).append(name)
    assert [names for names in digests.values() if len(names) > 1] == []  # no two tensors equal
    config = json.loads((directory / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(directory)
    for key, token in SPECS[model_type].ids.items():
        *parents, leaf = key.split(".")
        section = config
        for parent in parents:
            section = section[parent]
        assert section[leaf] == tokenizer.convert_tokens_to_ids(token) < VOCAB, key


def test_weights_are_saved_in_the_hubs_layout():
    from safetensors import safe_open

    with safe_open(ensure("llava") / "model.safetensors", "np") as handle:
        names = set(handle.keys())
    assert "vision_tower.vision_model.embeddings.patch_embedding.weight" in names  # CLIP's prefix put back
    assert any(name.startswith("language_model.model.layers.") for name in names)
    with safe_open(ensure("qwen2_vl") / "model.safetensors", "np") as handle:
        names = set(handle.keys())
    assert "model.embed_tokens.weight" in names and not any(".language_model." in name for name in names)


def test_inputs_go_through_the_familys_processor():
    from driftscope.families.generic.processor import build_text_inputs, prepare_inputs
    from driftscope.model.checkpoint import Checkpoint, validate_checkpoint

    path, config = validate_checkpoint(ensure("idefics3"))
    checkpoint = Checkpoint(path, config, "generic")
    wide = ROOT / "fixtures" / "images" / "shapes_448x672.png"
    inputs = prepare_inputs(checkpoint, [IMAGE, wide])
    assert inputs.facts["processor"] == "transformers Idefics3Processor"
    # 32-px longest edge in 16-px tiles plus the global view: 5 tiles of 4 tokens for the square image
    assert inputs["pixel_values"].shape[2:] == (3, 16, 16) and inputs.image_tokens.tolist() == [20, 20]
    text = build_text_inputs(checkpoint, inputs, "Which shapes?")
    assert int((text.input_ids == config["image_token_id"]).sum()) == 40
    with pytest.raises(InputError, match="does not exist"):
        prepare_inputs(checkpoint, [ROOT / "fixtures" / "images" / "missing.png"])


@pytest.mark.parametrize("model_type", model_types())
def test_both_libraries_load_and_run_the_prefill(model_type, tmp_path):
    from driftscope.families.generic.tiny_probe import probe

    row = probe(model_type, tmp_path / model_type, [IMAGE])
    assert row.error == "", row.error
    assert (row.transformers_load, row.mlx_load, row.transformers_run, row.mlx_run) == ("ok",) * 4
    assert row.built and sum(row.image_tokens) > 0 and row.logits_max > 0.5
    assert np.isfinite(row.max_abs) or model_type in READS_OUTSIDE
    library = "mlx-vlm" if model_type in MLX_VLM_PROCESSOR else "transformers"
    assert row.processor.startswith(library)
    if model_type in AGREE:
        assert row.max_abs < 1e-4


@pytest.mark.parametrize(
    ("model_type", "refusal"),
    [
        ("qwen2_vl", "Expected shape (128, 128) but received shape (32, 32) for parameter vision_tower.merger"),
        ("glm4v", "Missing 1 parameters"),
    ],
)
def test_the_testers_own_setting_is_what_mlx_vlm_refuses(model_type, refusal, tmp_path):
    """The adjustment is needed: with the tester's setting as it is, mlx-vlm 0.7.10's strict load refuses it (the
    day it loads, the adjustment and docs/families.md's table go)."""
    from driftscope.families.generic.calls import mlx_load
    from driftscope.families.generic.tiny import build_tiny

    directory = build_tiny(model_type, tmp_path / model_type, adjusted=False)
    with pytest.raises(ValueError, match=refusal.replace("(", r"\(").replace(")", r"\)")):
        mlx_load(directory, json.loads((directory / "config.json").read_text()))
