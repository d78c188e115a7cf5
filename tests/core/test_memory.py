"""Releasing a model frees it: by reference counting where that frees it (no full collection), else by one."""

from __future__ import annotations

import gc
import weakref

import pytest
from driftscope.core.memory import free, watch


class Node:
    def __init__(self):
        self.other = None


def test_an_object_freed_by_reference_counting_needs_no_collection():
    node = Node()
    watched = watch(node)
    gone = weakref.ref(node)
    del node
    assert gone() is None and free(watched) is False


def test_an_object_in_a_cycle_is_collected():
    gc.disable()  # no automatic collection between the drop and free(): the cycle outlives its last reference
    try:
        node = Node()
        node.other = node
        watched = watch(node)
        gone = weakref.ref(node)
        del node
        assert gone() is not None
        assert free(watched) is True and gone() is None
    finally:
        gc.enable()


def test_what_cannot_be_watched_is_always_collected():
    assert watch(1) is None and watch() is None
    assert free(None) is True


@pytest.mark.parametrize(
    "runtime_name,patch",
    [("transformers", None), ("mlx", None), ("transformers", "driftscope.families.hypotheses:scale_block_output")],
)
def test_a_released_runtime_holds_no_model(tiny, runtime_name, patch, monkeypatch, tmp_path):
    """After a capture of the whole tower, the tiny Qwen2.5-VL model is freed as its last reference goes (no
    collection); under a hypothesis patch (which may tie the model into a cycle) the release always collects.
    Either way the model is gone after ``release()``."""
    from driftscope.capture.patches import parse_patch
    from driftscope.capture.runtimes import get_runtime
    from driftscope.families import get_family
    from driftscope.taps.stages import StageSelection

    checkpoint, inputs, _ = tiny("qwen2_5_vl")
    patched = parse_patch({"callable": patch, "kwargs": {"block": 0, "factor": 1.0}}) if patch else None
    runtime = get_runtime(runtime_name)(checkpoint, "f32", patched)
    plan = get_family("qwen2_5_vl").vision_plan(checkpoint.config).select(StageSelection.everything())
    runtime.capture(inputs, plan, tmp_path / "taps")
    model = weakref.ref(runtime.model)
    collected = []
    monkeypatch.setattr(gc, "collect", lambda *args: collected.append(args) or 0)  # counted, not run
    gc.disable()
    try:
        runtime.release()
        assert bool(collected) is (patch is not None) and runtime.model is None
        assert patch is not None or model() is None  # unpatched: freed by reference counting alone
        monkeypatch.undo()
        gc.collect()
        assert model() is None
    finally:
        gc.enable()
