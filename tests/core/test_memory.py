"""Releasing a model frees it: by reference counting where that frees it (no full collection), else by one; and
what was freed goes back to the operating system."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
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


FRAGMENTED = """
import json, numpy as np
from driftscope.core.memory import free

def rss():
    return int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmRSS"))) * 1024

base = rss()
weights, pins = [], []
for _ in range(3000):
    weights.append(np.ones(12_000))  # 96 kB each: below glibc's mmap threshold, so from the heap
    pins.append(np.ones(16))  # small and kept: what a run allocates meanwhile, pinning the heap's top
held = rss()
del weights
freed = rss()
free(None)
print(json.dumps({"held": held - base, "freed": freed - base, "after": rss() - base}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap")
def test_freed_weights_go_back_to_the_system_not_only_to_the_heap():
    """Weights freed between allocations that stay (a run's taps, its log) are given back by ``free``: without
    it glibc kept them resident, and a 7B run's next candidate loaded beside the last one's 16 GiB."""
    out = subprocess.run([sys.executable, "-c", FRAGMENTED], capture_output=True, text=True, check=True).stdout
    sizes = json.loads(out)
    assert sizes["held"] > 250 * 2**20  # 3000 x 96 kB resident
    assert sizes["freed"] > 0.8 * sizes["held"]  # freed into the heap, still resident
    assert sizes["after"] < 0.1 * sizes["held"]  # given back
