"""Molmo2 config facts (both layouts), the mlx-vlm adaptation, the stage plan and the tiny fixtures."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from driftscope.errors import CheckpointError
from driftscope.families.molmo2.config import layout_of, mlx_config, read_facts, resolve_layers
from driftscope.model.weightfile import read_header
from molmo2_support import FAMILY, capture, checkpoint, checkpoint_dirs, config, plan


def test_hub_layout_resolves_negative_layers_against_the_declared_depth():
    facts = read_facts(config("hub"))
    assert facts.layout == "hub" and facts.vit.declared_depth == 27
    assert facts.adapter.configured_layers == (-3, -9)
    assert facts.selected_layers == (24, 18) and facts.execution_depth == 25


def test_native_layout_states_the_same_facts():
    hub, native = read_facts(config("hub")), read_facts(config("native"))
    assert native.layout == "native" and native.vit.declared_depth == 25
    assert native.selected_layers == hub.selected_layers and native.execution_depth == hub.execution_depth
    assert native.text == hub.text and native.vit.hidden_size == hub.vit.hidden_size


def test_hub_keys_are_authoritative_over_a_vision_config():
    hub = copy.deepcopy(config("hub"))
    hub["vision_config"] = {}  # what mlx-vlm's loader inserts
    assert layout_of(hub) == "hub" and read_facts(hub).selected_layers == (24, 18)
    hub["vision_config"] = {"num_hidden_layers": 3}
    assert read_facts(hub).vit.declared_depth == 27


def test_configured_order_is_kept_and_execution_depth_follows_the_deepest_layer():
    assert resolve_layers((-9, -3), 27) == (18, 24)
    hub = copy.deepcopy(config("hub"))
    hub["adapter_config"]["vit_layers"] = [2, -20]
    facts = read_facts(hub)
    assert facts.selected_layers == (2, 7) and facts.execution_depth == 8


@pytest.mark.parametrize("layers", [[-28], [27], []])
def test_layers_outside_the_declared_depth_are_named(layers):
    hub = copy.deepcopy(config("hub"))
    hub["adapter_config"]["vit_layers"] = layers
    with pytest.raises(CheckpointError, match="vit_layers"):
        read_facts(hub)


def test_a_config_without_vision_settings_is_named():
    with pytest.raises(CheckpointError, match="vit_config"):
        read_facts({"model_type": "molmo2", "text_config": {}})


def test_mlx_config_passes_the_configured_layers_through():
    hub, native = mlx_config(config("hub")), mlx_config(config("native"))
    assert hub["adapter_config"]["vit_layers"] == [-3, -9] and hub["vit_config"]["num_hidden_layers"] == 27
    assert native["adapter_config"]["vit_layers"] == [24, 18] and native["vit_config"]["num_hidden_layers"] == 25
    assert native["vit_config"]["image_num_pos"] == 729 and native["vision_config"] == {}
    assert native["text_config"]["qkv_bias"] is False and native["text_config"]["layer_norm_eps"] == 1e-6
    assert native["text_config"]["rope_theta"] == 5e6 and "rope_parameters" not in native["text_config"]


def test_fixture_files_hold_the_hub_prefix_and_the_resplit_embedding():
    header = read_header(checkpoint_dirs()["hub"] / "model.safetensors")
    layers = {name.split(".")[5] for name in header if ".resblocks." in name}
    assert layers == {str(i) for i in range(25)}  # declared 27, persisted 25
    assert header["model.transformer.wte.embedding"].shape == (512, 64)
    assert header["model.transformer.wte.new_embedding"].shape == (128, 64)
    hub, native = (checkpoint_dirs()[k] / "model.safetensors" for k in ("hub", "native"))
    assert hub.read_bytes() == native.read_bytes()
    native_config = json.loads((checkpoint_dirs()["native"] / "config.json").read_text())
    assert native_config["vision_config"]["num_hidden_layers"] == 25


def test_transformers_reads_both_layouts_alike():
    from driftscope.capture.runtimes import get_runtime

    models = []
    for layout in ("hub", "native"):
        engine = get_runtime("transformers")(checkpoint(layout), "f32")
        engine.load()
        models.append(engine.model)
    for model in models:
        assert model.config.vision_config.num_hidden_layers == 25
        assert model.config.adapter_config.vision_feature_layer == [24, 18]
    hub, native = models
    embed = hub.model.language_model.embed_tokens.weight.detach().numpy()
    np.testing.assert_array_equal(embed, native.model.language_model.embed_tokens.weight.detach().numpy())
    assert embed.shape == (640, 64)


def test_plan_lists_every_captured_stage_in_execution_order():
    ids = plan().ids()
    assert len(ids) == len(set(ids))
    assert set(capture("transformers", "224").stage_ids()) == set(ids)
    assert ids.index("vision.block.24") < ids.index("vision.selected.24") < ids.index("vision.selected.18")
    assert ids.index("vision.selected.18") < ids.index("vision.concatenated") < ids.index("pool.gathered")
    vision = FAMILY.vision_plan(config("hub"))
    assert [s.id for s in vision if s.integer] == [
        "inputs.pooling", "inputs.grids", "inputs.num_crops", "inputs.image_tokens", "pool.valid_counts"
    ]  # fmt: skip
    assert vision.meta["selected_layers"] == [24, 18] and vision.depth == 25
    assert vision.ids()[-1] == "projector.output"


def test_plan_refuses_a_layer_selected_twice():
    hub = copy.deepcopy(config("hub"))
    hub["adapter_config"]["vit_layers"] = [-3, 24]
    with pytest.raises(CheckpointError, match="twice"):
        FAMILY.vision_plan(hub)


@pytest.mark.slow
def test_building_twice_gives_identical_bytes(tmp_path):
    from make_tiny_molmo2 import main

    hub, native = main([str(tmp_path), "--force"])
    for folder, name in ((hub, "hub"), (native, "native")):
        built = sorted(p.name for p in folder.iterdir())
        assert built == sorted(p.name for p in checkpoint_dirs()[name].iterdir())
        for file in built:
            assert (folder / file).read_bytes() == (checkpoint_dirs()[name] / file).read_bytes(), file
