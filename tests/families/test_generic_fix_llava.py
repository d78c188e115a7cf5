"""mlx-vlm 0.7.10's LLaVA text MLP is SwiGLU whatever ``hidden_act`` says (``fixes/llava.py``): the sweep's run on the
testers' checkpoints (gelu) localizes it in the first decoder layer's MLP, and the ready patch closes it."""

from __future__ import annotations

import pytest
from generic_fix_support import conclusion, first_divergence, rows, sweep_run

PATCH = "llava_text_mlp_hidden_act"


@pytest.mark.parametrize("model_type", ["llava", "llava_onevision"])
def test_the_text_mlp_activation_is_localized_and_closed(model_type, tmp_path):
    report = sweep_run(model_type, tmp_path / "as-is")
    assert first_divergence(report) == "text.layer.0.mlp.down_proj.input"  # act(gate) * up: what down_proj takes
    said = conclusion(report)
    assert said["kind"] == "introduced" and said["stage"] == "text.layer.0.mlp"
    assert said["between"] == ["model.language_model.layers.0.mlp.act_fn"]  # the pieces replay clean
    assert said["ready_patches"][0] == f"driftscope.hypotheses:{PATCH}"
    assert all(rows(report)[f"text.layer.0.mlp.{piece}"]["status"] == "pass" for piece in ("gate_proj", "up_proj"))

    patched = sweep_run(model_type, tmp_path / "patched", mlx=PATCH)
    assert rows(patched)["text.layer.0.mlp"]["status"] == "pass"
    assert patched.data["verdict"]["status"] == "pass", patched.data["verdict"]["reasons"]


def test_the_patch_refuses_a_model_it_does_not_correct():
    from driftscope.errors import HypothesisPatchError
    from driftscope.families.checkpoints import open_checkpoint
    from driftscope.families.generic.calls import mlx_load
    from driftscope.families.generic.fixes.llava import llava_text_mlp_hidden_act
    from make_generic_tinies import ensure

    checkpoint = open_checkpoint(ensure("qwen2_vl"))  # a SwiGLU text MLP that is right as it is
    with pytest.raises(HypothesisPatchError, match="this is 'qwen2_vl'"):
        llava_text_mlp_hidden_act(mlx_load(checkpoint.path, checkpoint.config))
    llava = open_checkpoint(ensure("llava"))
    with pytest.raises(HypothesisPatchError, match="'silu', which mlx-vlm's SwiGLU already computes"):
        llava_text_mlp_hidden_act(mlx_load(llava.path, llava.config), hidden_act="silu")
