"""Molmo2's decoder in mlx-vlm: where to record the text stages (every layer at every position), greedy decoding,
and the text replay operators (mlx-vlm's own embedding, blocks, final norm and head; its mask built by its own
code, or a hypothesis patch's, for the mask's replay; a block replay reads the mask it is given)."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import numpy as np

from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.mlx_hooks import Recording, cache_snapshot, shadow, to_numpy
from driftscope.taps.module_taps import tapped
from driftscope.taps.sink import StageSink, put_greedy

from .module_stages import text_taps


def decoder(model: Any) -> Any:
    """mlx-vlm's ``Molmo2Transformer`` behind any wrapper a hypothesis patch or recorder put around it."""
    import mlx.nn as nn

    inner = model.language_model.model
    while not isinstance(inner, nn.Module):
        inner = next(value for key, value in vars(inner).items() if key in ("inner", "decoder"))
    return inner


def allowed(mask: Any, seq: int) -> np.ndarray:
    """The mask mlx-vlm's decoder used as 1 where row ``i`` may read column ``j`` ([seq, seq] int64)."""
    import mlx.core as mx

    if mask is None:
        return np.ones((seq, seq), dtype=np.int64)
    if isinstance(mask, str):  # "causal": scaled_dot_product_attention's own causal mask
        return np.tril(np.ones((seq, seq), dtype=np.int64))
    mask = mask.reshape(mask.shape[-2], mask.shape[-1])
    if mask.dtype == mx.bool_:
        return np.array(mask).astype(np.int64)
    return (to_numpy(mask) > -1e30).astype(np.int64)  # additive: 0 where allowed, -inf (or a huge negative) not


def per_image_pooling(inputs: ModelInputs) -> np.ndarray:
    """Pooling indices without the offset of earlier images (mlx-vlm's model adds that offset itself)."""
    pooling = np.asarray(inputs["pooling"]).copy()
    start, offset = 0, 0
    patches = inputs["pixel_values"].shape[1]
    for tokens, crops in zip(inputs.image_tokens.tolist(), np.asarray(inputs["num_crops"]).tolist(), strict=True):
        rows = pooling[start : start + tokens]
        pooling[start : start + tokens] = np.where(rows >= 0, rows - offset, -1)
        start, offset = start + tokens, offset + crops * patches
    return pooling


def capture_text(model: Any, inputs: ModelInputs, sink: StageSink) -> None:
    """mlx-vlm's whole model on the prompt: merged embeddings, the decoder's mask and layers, greedy decode."""
    import mlx.core as mx
    from mlx_vlm.models.cache import make_prompt_cache

    text = inputs.text
    ids = mx.array(text.input_ids[None])
    seen: dict[str, Any] = {}
    inner = decoder(model)

    def first_block(args, kwargs) -> None:
        seen["mask"] = args[1] if len(args) > 1 else kwargs.get("mask")

    cache = make_prompt_cache(model.language_model)
    language = model.language_model
    with ExitStack() as stack:  # recorders only during the prefill
        stack.enter_context(
            shadow(language, "model", Recording(language.model, lambda a, k, o: seen.update(embeds=a[1])))
        )
        stack.enter_context(tapped("mlx", inner, text_taps(len(inner.blocks)), sink, {"blocks.0": first_block}, False))
        logits = model(
            ids,
            mx.array(inputs["pixel_values"]),
            cache=cache,
            image_token_pooling=mx.array(per_image_pooling(inputs)),
            image_grids=mx.array(inputs["grids"]),
            image_num_crops=mx.array(inputs["num_crops"]),
        ).logits
        mx.eval(logits)
    embeds = to_numpy(seen["embeds"][0])
    image = text.input_ids == text.image_token_id
    sink.put("text.input_ids", text.input_ids)
    sink.put("text.token_types", text.mm_token_type_ids)
    sink.put("text.embeds.image", embeds[image])
    sink.put("text.embeds.text", embeds[~image])
    sink.put("text.attention_mask", allowed(seen["mask"], len(text.input_ids)))
    final = to_numpy(logits[0, -1])
    sink.put("text.logits.last", final)
    put_greedy(
        sink,
        final,
        lambda token: to_numpy(model.language_model(mx.array([[token]]), cache=cache).logits[0, -1]),
        text.max_new_tokens,
        forced=text.forced,
        rewind=lambda count: [entry.trim(count) for entry in cache],  # drop the last ``count`` tokens
        snapshot=cache_snapshot(cache),  # the cache's keys and values, layer by layer
    )


def _text_mask(model: Any, ids: np.ndarray) -> np.ndarray:
    """The mask mlx-vlm's decoder builds for this prompt (its own code, or a patch's; no layer runs)."""
    import mlx.core as mx

    inner = decoder(model)
    seen: dict[str, Any] = {}

    def record(x, mask=None, cache=None):
        seen["mask"] = mask
        return x

    prompt = mx.array(ids.astype(np.int64)[None])
    embeds = mx.zeros((1, len(ids), inner.ln_f.weight.shape[0]))
    with shadow(inner, "blocks", [record]), shadow(inner, "ln_f", lambda x: x):
        model.language_model.model(prompt, embeds, None, None)
    return allowed(seen["mask"], len(ids))


def replay_text(model: Any, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
    """mlx-vlm's decoder modules on given inputs: the mask its decoder builds, the embedding (the features
    clipped and added at the ``<im_patch>`` slots, as its model adds them), one block (the given mask; RoPE at the
    sequence's indices, as its prefill without a cache), the final norm, the head."""
    import mlx.core as mx
    from mlx_vlm.models.molmo2.molmo2 import clip_image_features

    if stage_id == "text.attention_mask":
        return _text_mask(model, inputs[0])
    inner = decoder(model)
    dtype = inner.ln_f.weight.dtype
    if stage_id == "text.embeds.text":
        return to_numpy(inner.wte(mx.array(np.asarray(inputs[0], dtype=np.int64))))[~ctx.image_slots]
    x = mx.array(np.ascontiguousarray(inputs[0], dtype=np.float32)).astype(dtype)
    if stage_id == "text.embeds.image":
        rows = inner.wte(mx.array(ctx.input_ids[ctx.image_slots]))
        out = rows + clip_image_features(x.astype(rows.dtype))
    elif stage_id == "text.norm.last":
        out = inner.ln_f(x)
    elif stage_id == "text.logits.last":
        out = model.language_model.lm_head(x)
    else:
        block = inner.blocks[int(stage_id.split(".")[2])]
        mask = mx.array(np.asarray(inputs[1]).astype(bool))[None, None]
        out = block(x[None], mask, None)[0]
        out = out[-1] if stage_id.endswith(".last") else out
    mx.eval(out)
    return to_numpy(out)
