"""The sweep's parameter set per model type (``batch.sweep.parameters``)."""

from __future__ import annotations

from pathlib import Path

from driftscope.batch.sweep import RUNTIMES, parameters


def test_a_patch_put_on_one_model_types_runtime_stays_out_of_the_next():
    first = parameters("llava", Path("a"))
    first["runtimes"][1]["patch"] = "driftscope.hypotheses:llava_text_mlp_hidden_act"
    assert "patch" not in parameters("llava_onevision", Path("b"))["runtimes"][1]
    assert all("patch" not in runtime for runtime in RUNTIMES)
