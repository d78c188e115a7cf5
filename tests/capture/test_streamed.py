"""The transformers reference streamed from the memory-mapped checkpoint (``options: {stream: true}``,
``capture.runtimes.streamed``) against the same reference loaded whole: every stage of every block, the text
layers, the greedy and teacher-forced answer and the KV cache equal, on each family whose taps read weights
through its modules; what it held and read, checked against the checkpoint's own headers; a family that reads a
weight outside its module refused plainly."""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.capture.runtimes import get_runtime
from driftscope.capture.runtimes.streamed import units
from driftscope.errors import RuntimeUnavailableError
from driftscope.model.weightfile import TensorFiles

STREAMED = ["qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "generic"]


@pytest.mark.parametrize("name", STREAMED)
def test_the_streamed_reference_is_the_resident_one(name, tiny, runs, tmp_path):
    checkpoint, inputs, plan = tiny(name)
    _, resident = runs(name, "transformers")
    runtime = get_runtime("transformers")(checkpoint, "f32", options={"stream": True})
    streamed = runtime.capture(inputs, plan, tmp_path / "streamed")
    assert runtime.load_audit["status"] == "pass" and not runtime.load_audit["findings"]
    sizes = {name: entry.nbytes for name, entry in TensorFiles(checkpoint.path).entries.items()}
    blocks = [sum(p.numel() * 4 for p in unit.parameters()) for _, unit, _ in units(runtime.model)]
    runtime.release()
    assert set(streamed.stage_ids()) == set(resident.stage_ids())
    for stage in resident.stage_ids():
        expected, got = np.asarray(resident[stage], np.float64), np.asarray(streamed[stage], np.float64)
        assert got.shape == expected.shape, stage
        assert np.allclose(got, expected, rtol=0, atol=1e-6, equal_nan=True), (stage, np.abs(got - expected).max())
    record = streamed.meta["streamed"]
    tokens = int(np.asarray(resident["text.generate.tokens"]).size)
    assert record["passes"] == tokens  # the prefill, then one pass per decode step
    # every checkpoint tensor read at least once per pass of the text side; never more than one block's weights
    assert record["mapped_bytes_read"] >= sum(sizes.values())
    assert record["peak_resident_weight_bytes"] <= max(blocks)
    assert sum(blocks) >= sum(sizes.values()) > 3 * max(blocks)  # a block is a small part of the model


def test_a_family_that_reads_a_weight_outside_its_module_is_refused(tiny, tmp_path):
    checkpoint, inputs, plan = tiny("molmo2")
    runtime = get_runtime("transformers")(checkpoint, "f32", options={"stream": True})
    with pytest.raises(RuntimeUnavailableError, match="reads a weight outside its module's call") as caught:
        runtime.capture(inputs, plan, tmp_path / "molmo2")
    assert "drop options.stream" in caught.value.fix
    runtime.release()
