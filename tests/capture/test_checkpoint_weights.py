"""A missing or unexpected tensor is a checkpoint error naming it on every runtime, the family's derived tensors
aside (issue 32 item 2: the compiled emitters read the tensors they know by name and ignored any other one)."""

from __future__ import annotations

import json
import shutil

import pytest
from driftscope.capture.runtimes import get_runtime
from driftscope.errors import CheckpointError
from driftscope.families import get_family
from driftscope.families.checkpoints import open_checkpoint
from safetensors.numpy import load_file, save_file

FAMILIES = ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "molmo2")
RUNTIMES = ("transformers", "mlx", "jax", "iree")
#: a vision tensor of each family's tiny checkpoint (every runtime reads it at load)
VISION = {
    "qwen2_5_vl": "patch_embed.proj.weight",
    "qwen3_vl": "patch_embed.proj.weight",
    "qwen3_vl_moe": "patch_embed.proj.weight",
    "molmo2": "patch_embedding",
}


def variant(family: str, target, change=None, tied: bool = False):
    """The family's tiny checkpoint copied to ``target``, its tensors through ``change``, optionally tied."""
    source = get_family(family).tiny.ensure()
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
    tensors = load_file(str(source / "model.safetensors"))
    save_file(change(tensors) if change else tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    if tied:
        config = json.loads((target / "config.json").read_text())
        config["tie_word_embeddings"] = True
        config.setdefault("text_config", {})["tie_word_embeddings"] = True
        (target / "config.json").write_text(json.dumps(config))
    return open_checkpoint(target)


def vision_tensor(family: str, tensors: dict) -> str:
    return next(name for name in sorted(tensors) if VISION[family] in name)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["missing", "unexpected"])
def test_every_runtime_refuses_a_missing_or_unexpected_tensor_naming_it(family, kind, tmp_path):
    names = {}

    def change(tensors):
        name = vision_tensor(family, tensors)
        if kind == "missing":
            names["shown"] = name.rsplit(".", 1)[0]  # each engine names it in its own layout
            return {key: value for key, value in tensors.items() if key != name}
        names["shown"] = "model.unknown_head.weight"
        return {**tensors, names["shown"]: tensors[name].ravel()[:4].copy()}

    checkpoint = variant(family, tmp_path / "ck", change)
    for runtime in RUNTIMES:
        with pytest.raises(CheckpointError) as err:
            get_runtime(runtime)(checkpoint, "f32").load()
        assert VISION[family] in err.value.problem if kind == "missing" else names["shown"] in err.value.problem, (
            runtime,
            err.value.problem,
        )


def test_the_compiled_path_refuses_an_unexpected_text_tensor_at_its_text_capture(tmp_path):
    from conftest import ROOT
    from driftscope.taps.stages import StagePlan

    family = get_family("qwen3_vl")
    extra = "model.language_model.layers.0.mlp.extra_proj.weight"
    checkpoint = variant("qwen3_vl", tmp_path / "ck", lambda t: {**t, extra: t[vision_tensor("qwen3_vl", t)][:1]})
    runtime = get_runtime("jax")(checkpoint, "f32")
    runtime.load()  # a text-side tensor: read, if at all, by the text capture
    inputs = family.prepare_inputs(checkpoint, [ROOT / "fixtures" / "images" / "shapes_224.png"])
    inputs.text = family.text_inputs(checkpoint, inputs, max_new_tokens=1)
    vision = family.vision_plan(checkpoint.config)
    plan = StagePlan(vision.family, vision.stages + family.text_stages(checkpoint.config, 1), vision.depth, vision.meta)
    with pytest.raises(CheckpointError, match="the checkpoint holds but the model does not use") as err:
        runtime.capture(inputs, plan, tmp_path / "taps")
    assert extra in err.value.problem and "jax's emitter" in err.value.problem


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
@pytest.mark.parametrize("holds_head", [False, True])
def test_a_tied_embedding_checkpoint_loads_on_every_runtime(family, holds_head, tmp_path):
    """A tied ``lm_head.weight`` is derived: lacking it or holding it is no checkpoint error."""
    change = None if holds_head else (lambda tensors: {k: v for k, v in tensors.items() if k != "lm_head.weight"})
    checkpoint = variant(family, tmp_path / "ck", change, tied=True)
    assert get_family(family).derived_weights(checkpoint.config) == ("lm_head.weight",)
    for runtime in RUNTIMES:
        get_runtime(runtime)(checkpoint, "f32").load()
