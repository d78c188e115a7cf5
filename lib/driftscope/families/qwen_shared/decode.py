"""Greedy decoding on the compiled path after a Qwen prefill: the host side of one compiled decode-step graph
(weights as arguments, a fixed-capacity key/value cache)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from driftscope.taps.sink import compiled_cache

from .text import AppliedOffsets


def greedy_decoder(
    runtime,
    decode: Callable,
    weights: dict,
    cache: tuple,
    rope_delta: int,
    max_new_tokens: int,
    length: int | None = None,
):
    """``step(token) -> logits`` for greedy decoding after the prefill, or None when no step is ever taken (a
    single token, or no cache). ``decode(w, k, v, token, position, at)`` is the family's step; its one compiled
    graph serves every step: the cache holds the prompt and every generated token (capacity fixed up front), and
    the token written at sequence index ``at`` sits at M-RoPE position ``at + rope_delta`` on all three axes, as
    transformers places generated tokens. ``length`` (default: the cache's own) is the prompt's real length when
    the prefill ran padded past it: the entries past it are masked (the graph sees entries up to ``at``) and
    overwritten as the steps write theirs."""
    import jax

    keys, values = cache
    if keys is None:
        return None
    grow = ((0, 0), (0, max_new_tokens - 1), (0, 0), (0, 0))
    state = {
        "keys": np.pad(keys, grow),
        "values": np.pad(values, grow),
        "length": keys.shape[1] if length is None else length,
    }
    function = jax.jit(decode, keep_unused=True)
    offsets = AppliedOffsets()

    def step(token: int) -> np.ndarray:
        at = state["length"]
        offsets.record(np.array([at + rope_delta]), at)  # the position the graph is given for this token
        scalars = (
            np.array([token], np.int32),
            np.array([at + rope_delta], np.int32),
            np.array([at], np.int32),
        )
        out = runtime.run_text(function, (weights, state["keys"], state["values"], *scalars), name="text_decode")
        state.update(keys=np.array(out["keys"]), values=np.array(out["values"]), length=at + 1)  # own copies
        return np.asarray(out["logits"], dtype=np.float32)

    def rewind(count: int) -> None:  # drop the last ``count`` tokens: the graph masks entries past ``at``
        state["length"] -= count

    step.rewind = rewind
    step.offsets = offsets  # the offset each step above placed its token with (``text.rope_delta``)
    step.cache_snapshot = lambda kind: compiled_cache(state, kind)  # [layers, seq, kv_heads, head_dim] arrays
    return step
