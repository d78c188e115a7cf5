"""mlx-vlm 0.7.10's InternVL computes every GELU with the tanh approximation (``fixes/internvl.py``): the sweep's run on
the tester's checkpoint (vision quick_gelu, projector gelu) localizes it at the first vision block's activation, and
the ready patch closes it there and in the projector."""

from __future__ import annotations

from generic_fix_support import conclusion, first_divergence, rows, sweep_run

PATCH = "internvl_activations"


def test_the_tanh_gelu_is_localized_at_the_first_vision_activation_and_closed(tmp_path):
    report = sweep_run("internvl", tmp_path / "as-is")
    assert first_divergence(report) == "vision.block.0.mlp.activation_fn"
    said = conclusion(report)
    assert said["kind"] == "introduced" and said["stage"] == "vision.block.0.mlp.activation_fn"
    assert said["ready_patches"] == [f"driftscope.hypotheses:{PATCH}"]
    assert rows(report)["vision.block.0.mlp.fc1"]["status"] == "pass"  # what the activation takes agrees

    patched = sweep_run("internvl", tmp_path / "patched", mlx=PATCH)
    assert all(
        rows(patched)[stage]["status"] == "pass" for stage in ("vision.block.0.mlp.activation_fn", "projector.act")
    )
    assert patched.data["verdict"]["status"] == "pass", patched.data["verdict"]["reasons"]
