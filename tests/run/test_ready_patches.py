"""Which ready patches a conclusion suggests (``run.candidates.with_ready_patches``, ``Family.ready_patches``): only
those that can change the candidate's arithmetic. ``norm2_in_float32`` closes a half-precision norm2; on a runtime
computing in float32 already (an epsilon defect, say) it would change nothing, so it is not offered."""

from __future__ import annotations

from driftscope.families import get_family
from driftscope.run.candidates import with_ready_patches

INTRODUCED = {"kind": "introduced", "stage": "vision.block.1.norm2", "first_divergence": "vision.block.1.norm2"}
NORM2 = "driftscope.hypotheses:norm2_in_float32"


def test_a_float32_norm_patch_is_not_suggested_to_a_float32_runtime():
    assert "ready_patches" not in with_ready_patches(INTRODUCED, "qwen2_5_vl", "mlx", activations="float32")
    assert get_family("qwen2_5_vl").ready_patches("vision.block.1.norm2", "mlx", activations="float32") == []


def test_it_is_suggested_where_the_norm_computes_in_half_precision():
    for dtype in ("float16", "bfloat16"):
        assert with_ready_patches(INTRODUCED, "qwen2_5_vl", "mlx", activations=dtype)["ready_patches"] == [NORM2]
    assert get_family("qwen2_5_vl").ready_patches("vision.block.1.norm2", "mlx") == [NORM2]  # dtype not known
