"""mlx-vlm 0.7.10's LLaVA text MLP is SwiGLU whatever ``hidden_act`` says (``fixes/llava.py``): the sweep's run on the
testers' checkpoints (gelu) localizes it in the first decoder layer's MLP, and the ready patch closes it."""

from __future__ import annotations

import pytest
from driftscope.views.finding import banners
from finding_support import shares_from_the_taps
from generic_fix_support import conclusion, first_divergence, rows, sweep_run

PATCH = "llava_text_mlp_hidden_act"
STAGE = "text.layer.0.mlp"


@pytest.mark.parametrize("model_type", ["llava", "llava_onevision"])
def test_the_text_mlp_activation_is_localized_and_closed(model_type, tmp_path):
    report = sweep_run(model_type, tmp_path / "as-is")
    assert first_divergence(report) == "text.layer.0.mlp.down_proj.input"  # act(gate) * up: what down_proj takes
    said = conclusion(report)
    assert said["kind"] == "introduced" and said["stage"] == "text.layer.0.mlp"
    assert said["between"] == ["model.language_model.layers.0.mlp.act_fn"]  # the pieces replay clean
    assert said["ready_patches"][0] == f"driftscope.hypotheses:{PATCH}"
    assert all(rows(report)[f"text.layer.0.mlp.{piece}"]["status"] == "pass" for piece in ("gate_proj", "up_proj"))
    # the run tried the ready patch on the stage where the error is introduced, and its first screen says the defect
    # in words (issue 53 item 1: the generic family's banner from its fix's declaration and docstring)
    trial = report.data["patch_trials"]["mlx:f32"]
    assert (trial["status"], trial["patch"], trial["stages"]) == ("tried", f"driftscope.hypotheses:{PATCH}", [STAGE])
    before, after = shares_from_the_taps(report, "mlx:f32", STAGE)
    (said,) = trial["rows"]
    assert said["before_used"] == pytest.approx(before, rel=1e-4) and before > 1  # the run's own row
    assert said["after_used"] == pytest.approx(after, rel=1e-4) and after < 1 and trial["closes"]
    (banner,) = banners(report)
    assert "mlx-vlm's text MLP is always SwiGLU" in banner and "whatever the text config's hidden\\_act" in banner
    assert "Gate every text MLP with the checkpoint's `text_config.hidden_act`" in banner
    assert f"It was **tried on `{STAGE}`** by the run" in banner and "fail -> **pass**" in banner

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
