"""mlx-vlm 0.7.10's Pixtral vision MLP gates with SiLU whatever ``hidden_act`` says (``fixes/mistral3.py``): the sweep's
run on the Mistral 3 tester's checkpoint (gelu) localizes it in the first vision block's MLP, and the ready patch
closes it."""

from __future__ import annotations

from generic_fix_support import conclusion, first_divergence, rows, sweep_run

PATCH = "pixtral_vision_mlp_hidden_act"


def test_the_pixtral_mlp_activation_is_localized_and_closed(tmp_path):
    report = sweep_run("mistral3", tmp_path / "as-is")
    assert first_divergence(report) == "vision.block.0.feed_forward.down_proj.input"
    said = conclusion(report)
    assert said["kind"] == "introduced" and said["stage"] == "vision.block.0.feed_forward"
    assert said["between"] == ["model.vision_tower.transformer.layers.0.feed_forward.act_fn"]
    assert said["ready_patches"] == [f"driftscope.hypotheses:{PATCH}"]

    patched = sweep_run("mistral3", tmp_path / "patched", mlx=PATCH)
    assert rows(patched)["vision.block.0.feed_forward"]["status"] == "pass"
    assert patched.data["verdict"]["status"] == "pass", patched.data["verdict"]["reasons"]
