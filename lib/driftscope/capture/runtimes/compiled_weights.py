"""What the compiled runtimes (``jax``, ``iree``) hold of a checkpoint's weights: every tensor must be read (one
the emitter never read is a checkpoint error), and the tower's weights are dropped while the text side runs.

The text decoder of a family whose program module declares ``tower_weights_apart`` (its ``CAPABILITIES``) holds
its own weights (``EmittedModel.text``) and never reads the tower's: those (and their device buffers) are dropped
before the text prefill, so the process never holds both, and read back from the checkpoint by the next tower capture or
vision replay (:func:`restore_tower`). Not under a hypothesis patch: a patch may have changed the loaded
weights, and what is read back would be the checkpoint's.
"""

from __future__ import annotations

import time
from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np

from driftscope.core.memory import free, watch


def half_weights(runtime: Any) -> tuple[str, ...]:
    """The checkpoint tensors (fnmatch) ``runtime`` holds in float16: those its family's emitter reads only as dot
    operands (its ``CAPABILITIES.dot_weights``), under a policy whose every dot takes float16 operands
    (``f16-contract``; not a mixed one, whose float32 operators read the same weights in float32). The graph rounds
    a float32 weight to float16 at each dot anyway, so the result is the same, at half the memory."""
    contract = runtime.contract
    if contract.dot_inputs != "float16" or contract.f32 or runtime.quantized is not None:
        return ()
    return tuple(runtime.capabilities.dot_weights)


@contextmanager
def weight_reads(runtime: Any):
    """Reading ``runtime``'s weights: each tensor's name recorded (``refuse_unread``), those of
    :func:`half_weights` read as float16."""
    from driftscope.model.weightfile import half_reads, recording_reads

    with ExitStack() as stack:
        stack.enter_context(recording_reads(runtime.checkpoint.path, runtime._read))
        halves = half_weights(runtime)
        if halves:
            stack.enter_context(half_reads(runtime.checkpoint.path, halves))
        yield


def refuse_unread(runtime: Any, text: bool) -> None:
    """The emitter reads each tensor it uses by name, so a tensor it never read is one the checkpoint holds
    and the model does not use: a checkpoint error naming it (the family's derived tensors aside, and, before
    the text capture, ``text=False``, the text side's, unless the family does not say which those are)."""
    from driftscope.capture.runtimes.base import refuse_weights
    from driftscope.model.weightfile import TensorFiles, matching

    if not text and not runtime.family.text_weights:
        return
    unread = set(TensorFiles(runtime.checkpoint.path).names()) - runtime._read
    if not text:
        unread -= matching(unread, runtime.family.text_weights)
    derived = runtime.family.derived_weights(runtime.checkpoint.config)
    refuse_weights(runtime.checkpoint.path, f"{runtime.name}'s emitter", {"unexpected": unread}, derived)


def drop_tower(runtime: Any) -> bool:
    """Drop the tower's weights before the text side where the family keeps the text weights apart and no patch
    is applied; whether they were dropped."""
    model = runtime.model
    if model is None or runtime.patch is not None or not runtime.capabilities.tower_weights_apart:
        return False
    for name in ("_device_weights", "_block_weights"):  # device buffers of the tower's (and text's) weights
        runtime.__dict__.pop(name, None)
    # the tower's outputs the text side reads: copies of their own, because an IREE output maps a device buffer
    # and holds its call's arguments, i.e. every tower weight (``capture.iree._host``)
    tower = runtime.__dict__.get("_tower")
    if isinstance(tower, dict):
        runtime._tower = {k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in tower.items()}
    watched = watch(*model.weights.values()) if isinstance(model.weights, dict) else None
    model.weights = None
    runtime.tower_dropped = True
    free(watched)
    return True


def restore_tower(runtime: Any) -> None:
    """Read the tower's weights back from the checkpoint if :func:`drop_tower` dropped them (the timing goes
    into ``timings["reload_tower_s"]``)."""
    if not runtime.tower_dropped or runtime.model is None:
        return
    start = time.perf_counter()
    with weight_reads(runtime):
        runtime.model.weights = runtime.taps.load(runtime.checkpoint).weights
    runtime.tower_dropped = False
    runtime.timings["reload_tower_s"] = runtime.timings.get("reload_tower_s", 0.0) + time.perf_counter() - start
