"""The Qwen decoders in mlx-vlm: the prompt's input stages and the greedy decode after a prefill, and the replay
operators (its decoder modules on given inputs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from driftscope.taps.mlx_hooks import cache_snapshot, list_item, to_numpy
from driftscope.taps.sink import StageSink, put_greedy

from .plan import layer_index
from .text import AppliedOffsets, put_text_inputs
from .transformers_text import select_rows


def replay_text(model: Any, stage_id: str, inputs: list[np.ndarray], ctx: Any, merge: Callable) -> np.ndarray:
    """Embeddings and their merge (``merge(features, embeds, ids)``: the family's own, [1, tokens, hidden]), one
    layer (its causal mask and M-RoPE from the reference's positions, as the text model builds them), the
    DeepStack add (``.deepstack``: the text model's own), the final norm, the head."""
    import mlx.core as mx
    from mlx_vlm.models.base import create_attention_mask

    language = model.language_model
    inner = language.model
    dtype = inner.embed_tokens.weight.dtype
    if stage_id == "text.embeds.text":
        out = inner.embed_tokens(mx.array(np.asarray(inputs[0], dtype=np.int64)))
        return to_numpy(out)[~ctx.image_slots]
    if stage_id == "text.embeds.image":
        ids = mx.array(ctx.input_ids[None])
        embeds = inner.embed_tokens(ids)
        features = mx.array(np.ascontiguousarray(inputs[0], dtype=np.float32)).astype(embeds.dtype)
        return to_numpy(merge(features, embeds, ids)[0])[ctx.image_slots]
    x = mx.array(np.ascontiguousarray(inputs[0], dtype=np.float32)).astype(dtype)
    if stage_id == "text.norm.last":
        out = inner.norm(x)
    elif stage_id == "text.logits.last":
        out = inner.embed_tokens.as_linear(x) if language.args.tie_word_embeddings else language.lm_head(x)
    elif stage_id.endswith(".deepstack"):  # the text model's own add, over the image rows alone
        features = mx.array(np.ascontiguousarray(inputs[1], dtype=np.float32)).astype(dtype)
        out = inner._deepstack_process(x[None], np.ones((1, x.shape[0]), dtype=bool), features)[0]
    else:
        layer = inner.layers[layer_index(stage_id)]
        x = x[None]
        positions = mx.array(ctx.text_positions)[:, None, :]
        rotary = layer.self_attn.rotary_emb
        embeddings = None if rotary.fused_apply else inner.layers[0].self_attn.rotary_emb(x, positions)
        out = layer(x, create_attention_mask(x, [None]), None, positions, embeddings)[0]
        if stage_id.endswith(".image"):
            out = out[mx.array(np.flatnonzero(ctx.image_slots))]
        else:
            out = select_rows(out, stage_id, ctx)
    mx.eval(out)
    return to_numpy(out)


def mlx_pixels(model: Any, inputs: Any) -> tuple[Any, Any]:
    """The packed images' pixels (in the tower's dtype) and grids, as mlx-vlm's tower takes them."""
    import mlx.core as mx

    dtype = model.vision_tower.patch_embed.proj.weight.dtype
    return mx.array(inputs["pixel_values"]).astype(dtype), mx.array(inputs["grid_thw"])


def mlx_vision_kwargs(model: Any, inputs: Any) -> dict[str, Any]:
    """The vision keyword arguments of an mlx-vlm Qwen forward: ``pixel_values`` and ``image_grid_thw`` for the
    images, ``pixel_values_videos`` and ``video_grid_thw`` for the videos (as mlx-vlm's processor hands them;
    absent where there are none), pixels in the tower's dtype."""
    import mlx.core as mx

    from .tower import modalities

    parts = modalities(inputs)
    dtype = model.vision_tower.patch_embed.proj.weight.dtype
    out: dict[str, Any] = {"pixel_values": None}
    if parts["image_grid"] is not None:
        out.update(
            pixel_values=mx.array(parts["image_pixels"]).astype(dtype), image_grid_thw=mx.array(parts["image_grid"])
        )
    if parts["video_grid"] is not None:
        out["pixel_values_videos"] = mx.array(parts["video_pixels"]).astype(dtype)
        out["video_grid_thw"] = mx.array(parts["video_grid"])
    return out


class _Positions:
    """A decoder layer (the first), recording the M-RoPE positions each call passes it."""

    def __init__(self, layer: Any, cache: list, offsets: Any):
        self.layer, self.cache, self.offsets = layer, cache, offsets

    def __call__(self, *args, **kwargs):
        positions = args[3] if len(args) > 3 else kwargs.get("position_ids")
        self.offsets.record(None if positions is None else np.array(positions), self.cache[0].offset)
        return self.layer(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.layer, name)


def decode_step(model: Any, cache: list, offsets: Any):
    """``step(token) -> logits`` of mlx-vlm's decoder on ``cache``, recording into ``offsets``
    (``qwen_shared.text.AppliedOffsets``) the position its first layer is given for the token (what is used, after
    whatever the decoder did with its stored delta)."""
    import mlx.core as mx

    language = model.language_model
    layers = language.model.layers

    def step(token: int) -> np.ndarray:
        with list_item(layers, 0, _Positions(layers[0], cache, offsets)):
            return to_numpy(language(mx.array([[token]]), cache=cache).logits[0, -1])

    return step


def put_prompt(model: Any, inputs: Any, sink: StageSink, ids: Any, features: Any) -> None:
    """The prompt's input stages from mlx-vlm's own merge (``features``: ``get_input_embeddings`` of ``ids``): the
    merged embeddings, the token rows, the M-RoPE positions and the rope delta."""
    embeds = to_numpy(features.inputs_embeds[0])
    rows = to_numpy(model.language_model.model.embed_tokens(ids)[0])
    positions = np.array(features.position_ids).reshape(3, -1)
    put_text_inputs(inputs, sink, embeds, rows, positions, np.array(features.rope_deltas))


def put_decoded(model: Any, sink: StageSink, logits: Any, cache: list, text: Any) -> None:
    """The prefill's last ``logits``, then greedy decode on its ``cache`` (``text`` the prompt's ``TextInputs``)
    and the offset each decode step applied."""
    last = to_numpy(logits[0, -1])
    sink.put("text.logits.last", last)
    offsets = AppliedOffsets()
    put_greedy(
        sink,
        last,
        decode_step(model, cache, offsets),
        text.max_new_tokens,
        forced=text.forced,
        rewind=lambda count: [entry.trim(count) for entry in cache],  # drop the last ``count`` tokens
        snapshot=cache_snapshot(cache),  # the cache's keys and values, layer by layer
    )
    offsets.put(sink)  # the offset each decode step applied
