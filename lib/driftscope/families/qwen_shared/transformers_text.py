"""The Qwen decoders in transformers: what a tapped prefill leaves in the sink and the greedy decode after it, and
the replay operators (the decoder's own modules on given inputs)."""

from __future__ import annotations

from typing import Any

import numpy as np

from driftscope.taps.sink import StageSink, put_greedy
from driftscope.taps.torch_hooks import to_numpy as _np

from .plan import layer_index
from .text import AppliedOffsets, put_text_inputs


def select_rows(out, stage_id: str, ctx: Any):
    """A layer's output as the stage holds it: the last position (``.last``), the image slots (``.image``), or
    every position."""
    if stage_id.endswith(".last"):
        return out[-1]
    if stage_id.endswith(".image"):
        return out[ctx.image_slots]
    return out


def replay_text(model: Any, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
    """Embeddings and their merge (into the image and the video slots), one layer (causal mask, M-RoPE from the
    reference's positions), the DeepStack add (``.deepstack``: the decoder's own, of the branch's features to the
    layer's image rows), the final norm, the head."""
    import torch
    from transformers.masking_utils import create_causal_mask

    language = model.model.language_model
    dtype = language.embed_tokens.weight.dtype
    with torch.no_grad():
        if stage_id == "text.embeds.text":
            return _np(language.embed_tokens(torch.from_numpy(inputs[0]).long()))[~ctx.image_slots]
        if stage_id == "text.embeds.image":
            ids = torch.from_numpy(ctx.input_ids)[None]
            embeds = language.embed_tokens(ids)
            features = torch.from_numpy(np.ascontiguousarray(inputs[0])).to(dtype)
            image, video = model.model.get_placeholder_mask(ids, inputs_embeds=embeds)
            mask = image | video  # the image slots then the video slots, filled in prompt order as the tower packs
            return _np(embeds.masked_scatter(mask, features)[0])[ctx.image_slots]
        x = torch.from_numpy(np.ascontiguousarray(inputs[0])).to(dtype)
        if stage_id == "text.norm.last":
            return _np(language.norm(x))
        if stage_id == "text.logits.last":
            return _np(model.lm_head(x))
        if stage_id.endswith(".deepstack"):  # the model's own add, over the image rows alone
            features = torch.from_numpy(np.ascontiguousarray(inputs[1])).to(dtype)
            rows = torch.ones((1, x.shape[0]), dtype=torch.bool)
            return _np(language._deepstack_process(x[None], rows, features)[0])
        layer = language.layers[layer_index(stage_id)]
        x = x[None]
        positions = torch.from_numpy(ctx.text_positions)[:, None, :]
        mask = create_causal_mask(config=language.config, inputs_embeds=x, attention_mask=None, cache=None)
        out = layer(x, attention_mask=mask, position_embeddings=language.rotary_emb(x, positions))
        return _np(select_rows((out[0] if isinstance(out, tuple) else out)[0], stage_id, ctx))


def decode_step(model: Any, cache: Any, offsets: Any):
    """``step(token) -> logits`` of transformers' decoder on ``cache``, recording into ``offsets``
    (``qwen_shared.text.AppliedOffsets``) the M-RoPE positions its language model is given for the token; with
    ``rewind`` and ``cache_snapshot`` as ``put_greedy`` reads them."""
    import torch

    from driftscope.taps.torch_hooks import cache_snapshot

    language = model.model.language_model

    def step(token: int) -> np.ndarray:
        index = cache.get_seq_length()
        handle = language.register_forward_pre_hook(
            lambda module, args, kwargs: offsets.record(_np(kwargs["position_ids"]), index), with_kwargs=True
        )
        try:
            with torch.no_grad():
                return _np(model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True).logits[0, -1])
        finally:
            handle.remove()

    step.rewind = lambda count: cache.crop(-count)  # drop the last ``count`` tokens
    step.cache_snapshot = cache_snapshot(cache)  # the cache's keys and values, layer by layer
    return step


def put_prefill(model: Any, inputs: Any, sink: StageSink, ids: Any, seen: dict, out: Any) -> None:
    """After a tapped prefill (``out``, with ``seen`` holding the ``embeds`` and ``positions`` its language model
    was given): the prompt's input stages, the last position's logits, then greedy decode on the prefill's cache
    and the M-RoPE offset each decode step applied."""
    text = inputs.text
    language = model.model.language_model
    embeds = _np(seen["embeds"][0])
    rows = _np(language.embed_tokens(ids)[0])
    positions = seen["positions"]
    positions = _np(positions[-3:, 0] if positions.dim() == 3 else positions)
    put_text_inputs(inputs, sink, embeds, rows, positions, _np(model.model.rope_deltas))
    logits = _np(out.logits[0, -1])
    sink.put("text.logits.last", logits)
    cache = out.cache  # the decode steps append to it in place

    offsets = AppliedOffsets()
    step = decode_step(model, cache, offsets)
    put_greedy(sink, logits, step, text.max_new_tokens, forced=text.forced)
    offsets.put(sink)  # the offset each decode step applied
