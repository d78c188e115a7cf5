"""Aya Vision's logits (``fixes/aya_vision.py``): transformers 5.24 drops the Cohere2 ``logit_scale`` that mlx-vlm (and
the original model) apply. The sweep's run shows every stage agreeing up to the final norm and the logits differing by
that factor; the ready patch on transformers' runtime closes it."""

from __future__ import annotations

import numpy as np
from generic_fix_support import first_divergence, rows, sweep_run

PATCH = "aya_vision_logit_scale"


def _logit_scale() -> float:
    import json

    from make_generic_tinies import ensure

    return json.loads((ensure("aya_vision") / "config.json").read_text())["text_config"]["logit_scale"]


def test_the_logits_differ_by_the_logit_scale_alone_and_the_patch_closes_it(tmp_path):
    from driftscope.run.access import open_run

    report = sweep_run("aya_vision", tmp_path / "as-is")
    assert first_divergence(report) == "text.logits.last"
    found = rows(report)
    assert found["text.norm.last"]["status"] == "pass" and found["text.layer.3"]["status"] == "pass"
    pair = open_run(tmp_path / "as-is").pair("mlx:f32")
    reference, candidate = pair.reference["text.logits.last"], pair.candidate["text.logits.last"]
    np.testing.assert_allclose(candidate, reference * _logit_scale(), rtol=1e-4, atol=1e-6)  # 0.0625, Cohere2's default

    patched = sweep_run("aya_vision", tmp_path / "patched", transformers=PATCH)
    assert patched.data["verdict"]["status"] == "pass", patched.data["verdict"]["reasons"]
