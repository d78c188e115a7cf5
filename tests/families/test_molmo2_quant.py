"""Molmo2 under quantized policies at the default group size 64, on the dense tiny hub-layout fixture: the
588-wide patch embedding (14 x 14 x 3 pixels) stays dense and is reported with the reason; a policy whose bits
contradict the tiny q4 checkpoint's is refused by name."""

from __future__ import annotations

import pytest
from driftscope.capture.runtimes import get_runtime
from driftscope.errors import CheckpointError
from driftscope.families import get_family
from driftscope.families.checkpoints import open_checkpoint

FAMILY = get_family("molmo2")
PATCH = "model.vision_backbone.image_vit.patch_embedding.weight"


def test_the_patch_embedding_stays_dense_at_group_size_64_and_is_reported():
    runtime = get_runtime("mlx")(open_checkpoint(FAMILY.tiny.ensure()), "q4")
    runtime.load()
    report = runtime.quantized.report
    left = {row["name"]: row for row in report["left_dense"]}
    assert (report["group_size"], report["naming"]) == (64, "checkpoint")
    assert left[PATCH]["reason"] == "input width 588 is not a multiple of the group size 64"
    assert left[PATCH]["group"] == "vision"
    vit = runtime.model.vision_tower.image_vit
    assert not hasattr(vit.patch_embedding, "scales")
    assert vit.transformer[0].feed_forward.w2.group_size == 64  # 64 inputs: quantized
    assert report["quantized"]["vision"] > 0 and report["quantized"]["text"] > 0
    runtime.release()


def test_bits_that_contradict_the_q4_checkpoint_are_named():
    from make_tiny_q4 import ensure_q4

    with pytest.raises(CheckpointError, match="holds 4-bit codes; policy 'q8-dequant' asks for 8 bits"):
        get_runtime("transformers")(open_checkpoint(ensure_q4(FAMILY)), "q8-dequant").load()
