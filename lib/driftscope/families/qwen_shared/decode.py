"""The host side of a Qwen decoder on the compiled path: its spec and weights read once, a text replay's
arguments, and greedy decoding after the prefill (one compiled decode-step graph, weights as arguments, a
fixed-capacity key/value cache)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from driftscope.taps.sink import StageSink, compiled_cache, put_greedy

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


def put_decoded(
    runtime,
    sink: StageSink,
    logits: Any,
    text: Any,
    decode_step: Callable,
    weights: dict,
    cache: tuple,
    rope_delta: int,
    length: int | None = None,
    **bound: Any,
) -> None:
    """Greedy decode from the prefill's last ``logits`` into ``sink`` (``text`` the prompt's ``TextInputs``), then
    the offset each decode step applied. ``decode_step(w, k, v, token, position, at, **bound)`` is the family's
    step (``bound``: its spec and contract); the rest is as :func:`greedy_decoder` takes it."""

    def decode(w, k, v, token, position, at):
        return decode_step(w, k, v, token, position, at, **bound)

    step = greedy_decoder(runtime, decode, weights, cache, rope_delta, text.max_new_tokens, length)
    put_greedy(sink, np.asarray(logits), step, text.max_new_tokens, forced=text.forced)
    if step is not None:
        step.offsets.put(sink)


def text_model(model: Any, spec_class: type, load_weights: Callable) -> tuple:
    """``(spec, weights)`` of the emitted ``model``'s decoder: ``spec_class.from_config`` of the checkpoint's config
    and ``load_weights(path, spec)``, read from the checkpoint once (released with the model)."""
    if model.text is None:
        spec = spec_class.from_config(model.checkpoint.config)
        model.text_weights = load_weights(model.checkpoint.path, spec)
        model.text = (spec, model.text_weights)
    return model.text


def text_replay_arguments(stage_id: str, kind: str, inputs: list[np.ndarray], ctx: Any) -> tuple:
    """A decoder stage's replay arguments: the text slots' token ids for ``text.embeds.text``, else the inputs as
    float32, a layer's image rows (``kind`` ending ``layer.image``) with the image slots' indices after them."""
    if stage_id == "text.embeds.text":
        arguments: tuple = (np.asarray(inputs[0])[~ctx.image_slots].astype(np.int32),)
    else:
        arguments = tuple(np.asarray(x, dtype=np.float32) for x in inputs)
    if kind.endswith("layer.image"):
        arguments += (np.flatnonzero(ctx.image_slots).astype(np.int32),)
    return arguments
