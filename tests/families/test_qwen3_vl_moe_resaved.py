"""A Qwen3-VL-MoE checkpoint re-saved by transformers 5.24, as any fine-tune is (issue 50 item 3): its experts in
transformers 5's layout, its config.json with ``text_config.tie_word_embeddings: true`` beside a top-level
``false``. transformers reads the top level; so does MLX now (it kept the text value and refused
``lm_head.weight``), and MLX puts the experts into the layout its sanitizing reads (it transposed them whatever
they were: "Expected shape (8, 96, 256)"). Every runtime then loads what the checkpoint holds and agrees with
transformers under the strict contract. A load MLX still refuses names mlx-vlm's port, not a config setting it
cannot know is wrong."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT
from driftscope.capture.runtimes import get_runtime
from driftscope.errors import CheckpointError
from driftscope.families import get_family
from driftscope.families.checkpoints import open_checkpoint
from driftscope.judge.compare import compare_tapsets
from driftscope.judge.contract import load_contract
from driftscope.taps.stages import StagePlan, StageSelection

STRICT = load_contract(ROOT / "parameters" / "contracts" / "strict.yaml")
GATE_UP = "model.language_model.layers.0.mlp.experts.gate_up_proj"


@pytest.fixture(scope="module")
def resaved(tmp_path_factory):
    """The tiny MoE loaded by transformers and saved again; the text config then says its head is tied, as
    transformers 5.24 writes a fine-tune's whose text config did not say (the top level keeps false)."""
    import torch
    from transformers import Qwen3VLMoeForConditionalGeneration

    source = get_family("qwen3_vl_moe").tiny.ensure()
    out = tmp_path_factory.mktemp("moe-resaved")
    Qwen3VLMoeForConditionalGeneration.from_pretrained(str(source), dtype=torch.float32).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json", "chat_template.jinja"):
        if (source / name).exists():
            (out / name).write_bytes((source / name).read_bytes())
    config = json.loads((out / "config.json").read_text())
    config["text_config"]["tie_word_embeddings"] = True
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return open_checkpoint(out)


def test_the_premise(resaved):
    from driftscope.model.weightfile import TensorFiles

    config = resaved.config
    assert config["tie_word_embeddings"] is False and config["text_config"]["tie_word_embeddings"] is True
    assert config["transformers_version"].startswith("5.")
    text = config["text_config"]
    assert TensorFiles(resaved.path).shape(GATE_UP)[1:] == (2 * text["moe_intermediate_size"], text["hidden_size"])


@pytest.mark.parametrize("runtime_name", ["transformers", "mlx", "jax"])
def test_every_runtime_loads_what_the_resaved_checkpoint_holds(resaved, runtime_name):
    runtime = get_runtime(runtime_name)(resaved, "f32")
    runtime.load()
    assert runtime.load_audit["status"] == "pass", runtime.load_audit["findings"]
    runtime.release()


def test_mlx_agrees_with_transformers_on_it(resaved, tmp_path):
    family = get_family("qwen3_vl_moe")
    inputs = family.prepare_inputs(resaved, [ROOT / "fixtures" / "images" / "shapes_224.png"])
    inputs.text = family.text_inputs(resaved, inputs, max_new_tokens=2)
    plan = family.vision_plan(resaved.config).select(StageSelection(blocks=True))
    plan = StagePlan(plan.family, plan.stages + family.text_stages(resaved.config, 2), plan.depth, plan.meta)
    taps = {}
    for name in ("transformers", "mlx"):
        patch = family.known_defects.get(name)
        from driftscope.capture.patches import parse_patch

        runtime = get_runtime(name)(resaved, "f32", parse_patch(patch) if patch else None)
        taps[name] = runtime.capture(inputs, plan, tmp_path / name)
        runtime.release()
    rows = compare_tapsets(taps["transformers"], taps["mlx"], STRICT, plan)
    assert not [(row.stage, row.max_abs) for row in rows if row.status != "pass"]
    assert any(row.stage.endswith(".mlp.experts") and row.status == "pass" for row in rows)


def test_a_load_mlx_refuses_names_the_port_not_the_config(tmp_path):
    """Weights mlx-vlm's model does not take (here a DeepStack merger the config no longer lists): the message says
    what mlx-vlm refused and that, where transformers loads the checkpoint, the MLX port is the limit."""
    import shutil

    source = get_family("qwen3_vl").tiny.ensure()
    copy = tmp_path / "ckpt"
    shutil.copytree(source, copy)
    config = json.loads((copy / "config.json").read_text())
    config["vision_config"]["deepstack_visual_indexes"] = config["vision_config"]["deepstack_visual_indexes"][:-1]
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as caught:
        get_runtime("mlx")(open_checkpoint(copy), "f32").load()
    assert "does not take checkpoint" in caught.value.problem
    assert "the MLX port is the limit" in caught.value.fix and "deepstack_visual_indexes" not in caught.value.fix
