"""The compiled runtimes drop the tower's weights while the text side runs (``capture.runtimes.compiled_weights``)
and read them back for the next tower capture or vision replay: the same taps, memory actually released."""

from __future__ import annotations

import weakref

import numpy as np
import pytest
from driftscope.capture.runtimes import get_runtime
from driftscope.families.qwen2_5_vl.plan import ReplayContext, replay_inputs
from driftscope.taps.tapset import tap_paths


@pytest.mark.slow  # two captures and a replay of the tiny fixture with text (jax: 209 s on a loaded machine)
@pytest.mark.parametrize("engine", ["jax", "iree"])
def test_the_tower_weights_are_dropped_for_the_text_side_and_read_back_for_the_tower(engine, tiny, tmp_path):
    """IREE's outputs hold their call's arguments (every tower weight): the probe would stay alive through the
    tower outputs the text side reads, were they not copied."""
    checkpoint, inputs, plan = tiny("qwen2_5_vl")
    runtime = get_runtime(engine)(checkpoint, "f32")
    runtime.load()
    probe = weakref.ref(runtime.model.weights[sorted(runtime.model.weights)[0]])
    first = runtime.capture(inputs, plan, tmp_path / "first")
    assert any(stage.startswith("text.forced") for stage in first.stage_ids())
    assert runtime.model.weights is None and runtime.tower_dropped
    assert probe() is None  # released, not held by a device buffer or a cache
    # a vision replay reads them back: the block's operator on the capture's own inputs gives the capture's output
    ctx = ReplayContext.from_tapset(first, [3, 7])
    stage = "vision.block.5.mlp.down"
    replayed = runtime.replay(stage, [ctx.stage(first, name) for name in replay_inputs(stage, 8)], ctx)
    assert runtime.model.weights is not None and not runtime.tower_dropped
    np.testing.assert_allclose(replayed, np.asarray(first[stage]), rtol=0, atol=1e-6)
    second = runtime.capture(inputs, plan, tmp_path / "second")
    assert tap_paths(tmp_path / "second")[0].read_bytes() == tap_paths(tmp_path / "first")[0].read_bytes()
    assert second.stage_ids() == first.stage_ids()
    runtime.release()


def test_a_patched_runtime_keeps_its_tower_weights(tiny_checkpoint):
    """A patch may have changed the loaded weights; what the checkpoint holds is not what ran, so nothing is
    dropped (it would be read back unpatched)."""
    from driftscope.capture.patches import parse_patch
    from driftscope.capture.runtimes.compiled_weights import drop_tower

    runtime = get_runtime("jax")(tiny_checkpoint, "f32")
    runtime.load()
    runtime.patch = parse_patch("driftscope.hypotheses:norm2_in_float32")  # as if applied by the load
    assert drop_tower(runtime) is False and runtime.model.weights
    runtime.patch = None
    assert drop_tower(runtime) is True and runtime.model.weights is None
    runtime.release()


def test_f16_contract_holds_its_dot_weights_in_float16_with_the_same_taps(tiny, tmp_path, monkeypatch):
    """Under f16-contract every dot rounds its weight to float16, so holding the dot-only weights (the
    ``dot_weights`` capability) in float16 from the read on gives the same taps bit for bit, in half their memory;
    the tied head is the embedding (a gather) and stays float32, and so do norms and biases."""
    import dataclasses

    import driftscope.families.qwen2_5_vl.jax.program as program
    from driftscope.model.weightfile import TensorFiles, matching
    from driftscope.taps.stages import StagePlan

    checkpoint, inputs, plan = tiny("qwen2_5_vl")
    plan = StagePlan(plan.family, [s for s in plan if ".block.1." not in s.id], plan.depth, dict(plan.meta))
    captured, held, declared = {}, {}, program.CAPABILITIES.dot_weights
    for half in (True, False):
        dots = declared if half else ()
        monkeypatch.setattr(program, "CAPABILITIES", dataclasses.replace(program.CAPABILITIES, dot_weights=dots))
        runtime = get_runtime("jax")(checkpoint, "f16-contract")
        runtime.load()  # the tower's weights (the text side's are read at the text capture, the same way)
        held[half] = {name: str(array.dtype) for name, array in runtime.model.weights.items()}
        assert runtime.load_audit["status"] == "pass"
        captured[half] = runtime.capture(inputs, plan, tmp_path / f"half-{half}")
        runtime.release()
    names = TensorFiles(checkpoint.path).names()
    dots = {name.removeprefix("model.").removeprefix("visual.") for name in matching(names, declared)}
    assert {name for name, dtype in held[True].items() if dtype == "float16"} == dots & set(held[True])
    assert set(held[False].values()) == {"float32"} and "blocks.0.norm1.weight" not in dots
    for stage in captured[False].stage_ids():
        np.testing.assert_array_equal(np.asarray(captured[True][stage]), np.asarray(captured[False][stage]), stage)
