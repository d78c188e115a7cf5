"""mlx-vlm 0.7.10's Gemma 3 rounds the embedding scale sqrt(hidden_size) to bfloat16 in a float32 model; the sweep
localizes it between operators at the decoder's input and ``gemma3_embed_scale`` closes it (docs/families.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from generic_sweep_support import conclusion, investigate_sweep, rows, verdict


def test_unpatched_the_decoder_input_is_off_by_bfloat16s_rounding_of_the_scale(tmp_path):
    """sqrt(32) = 5.65685 rounds to 5.65625 in bfloat16: every row of the decoder's input is 1.07e-4 relative off,
    which no operator computes (the embedding stage, compared with its scale, agrees)."""
    import mlx.core as mx

    report = investigate_sweep("gemma3", tmp_path)
    found = rows(report)
    rounded = float(np.array(mx.array(math.sqrt(32), dtype=mx.bfloat16).astype(mx.float32)))
    assert found["text.embed_tokens"]["status"] == "pass"
    assert found["text.layer.0.input"]["relative_rms"] == pytest.approx(1 - rounded / math.sqrt(32), rel=0.02)
    said = conclusion(report)
    assert said["kind"] == "unreplayed" and said["stage"] == "text.layer.0.input"
    assert said["ready_patches"] == ["driftscope.hypotheses:gemma3_embed_scale"]


def test_the_patch_closes_every_stage(tmp_path):
    report = investigate_sweep("gemma3", tmp_path, "gemma3_embed_scale")
    assert rows(report)["text.layer.0.input"]["relative_rms"] < 1e-6
    assert verdict(report) == "pass"


def test_the_patch_refuses_another_port():
    from driftscope.errors import HypothesisPatchError
    from driftscope.families.generic.fixes.gemma3 import gemma3_embed_scale

    with pytest.raises(HypothesisPatchError, match="corrects mlx-vlm's gemma3 port"):
        gemma3_embed_scale(object())
