"""Every limit of mlx-vlm's Molmo2 port is declared and checked before loading (issue 50 item 4): a stored ViT
prefix shorter than the 25 layers it builds, ``qk_norm_type: olmo`` and ``norm_after`` each stop the MLX runtime
with a port-limit error naming the setting (config.json is right), never a generic load error blaming the
config; the checkpoints the family's fixtures and testers hold pass."""

from __future__ import annotations

import json

import pytest
from driftscope.capture.runtimes import get_runtime
from driftscope.errors import PortLimitError
from driftscope.families.checkpoints import open_checkpoint
from driftscope.families.molmo2.config import stored_vit_layers, unrepresentable
from driftscope.families.molmo2.fixture import SyntheticMolmo2Spec, make_checkpoints


@pytest.fixture(scope="module")
def short_prefix(tmp_path_factory):
    """A hub-layout Molmo2 selecting layers 19 and 13 of 27: its weights hold the 20-layer prefix those need."""
    base = tmp_path_factory.mktemp("molmo2-short")
    hub, _ = make_checkpoints(base / "hub", base / "native", SyntheticMolmo2Spec(vit_layers=(-8, -14)))
    return hub


def _refused(path) -> PortLimitError:
    runtime = get_runtime("mlx")(open_checkpoint(path), "f32")
    with pytest.raises(PortLimitError) as caught:
        runtime.load()
    assert runtime.model is None  # refused before anything loaded
    assert "config.json is right" in caught.value.fix and "check that config.json" not in str(caught.value)
    return caught.value


def test_a_stored_vit_prefix_shorter_than_the_25_layers_mlx_builds(short_prefix):
    assert stored_vit_layers(short_prefix) == 20
    err = _refused(short_prefix)
    assert "the weights store 20 ViT layers" in err.problem and "builds 25 of the 27 declared" in err.problem


@pytest.mark.parametrize(
    "setting,said",
    [
        ({"qk_norm_type": "olmo"}, "text_config.qk_norm_type 'olmo'"),
        ({"norm_after": True}, "text_config.norm_after true"),
    ],
)
def test_decoder_settings_mlx_cannot_represent_are_named(short_prefix, tmp_path, setting, said):
    import shutil

    copy = tmp_path / "ckpt"
    shutil.copytree(short_prefix, copy)
    config = json.loads((copy / "config.json").read_text())
    text = config.get("text_config") or config.get("llm_config")
    text.update(setting)
    (copy / "config.json").write_text(json.dumps(config))
    assert said in _refused(copy).problem


def test_the_fixtures_and_testers_are_within_the_limits():
    from driftscope.families import get_family
    from make_tester_configs import TESTER_CONFIGS

    paths = [get_family("molmo2").tiny.ensure()]
    paths += [config.ensure() for config in TESTER_CONFIGS if config.family == "molmo2"]
    for path in paths:
        checkpoint = open_checkpoint(path)
        assert unrepresentable(checkpoint.config, checkpoint.path) == [], path
