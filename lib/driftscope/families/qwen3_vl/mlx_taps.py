"""Qwen3-VL in mlx-vlm: loading (with the config adapted), where to record each stage, the replay operators.

Wrappers call the original module or function and record what it returned; q/k come from mlx-vlm's own
vision RoPE function (called for q, then k, in every block). The text side records a decoder layer's own
output (``text.layer.N``, its last position and its image slots) and what the next layer receives after the
DeepStack add (``text.layer.N.deepstack``), as the transformers side does.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.mlx_hooks import Recording, cache_snapshot, dtype_name, list_item, module_attr, shadow, to_numpy
from driftscope.taps.sink import StageSink, put_greedy

from ...errors import ParameterError
from ..qwen_shared.mlx_text import decode_step, mlx_vision_kwargs, replay_text
from ..qwen_shared.text import AppliedOffsets, put_text_inputs
from .mlx_config import load_mlx_model
from .plan import block_stage_id, deepstack_stage_id, parse_stage


def load(path: Path, config: dict) -> Any:
    """mlx-vlm's model with the checkpoint's weights (its config adapted to the layout mlx-vlm reads)."""
    return load_mlx_model(path, config)


def rms_norms(model: Any) -> list[tuple[Any, str]]:
    """Qwen3-VL's vision tower has no RMSNorm (its norms are LayerNorms): the manual-RMSNorm experiment
    does not apply."""
    raise ParameterError(
        "mlx option rmsnorm: manual swaps the vision tower's RMSNorms, and Qwen3-VL's vision tower has none "
        "(its blocks and mergers use LayerNorm)",
        "drop options.rmsnorm for this checkpoint",
    )


def _pixels(model: Any, inputs: ModelInputs):
    import mlx.core as mx

    dtype = model.vision_tower.patch_embed.proj.weight.dtype
    return mx.array(inputs["pixel_values"]).astype(dtype), mx.array(inputs["grid_thw"])


def run_vision(model: Any, inputs: ModelInputs):
    """The plain vision forward (no taps): the merged features and every DeepStack feature."""
    return model.vision_tower(*_pixels(model, inputs))


def _merger(enter, merger, stage: str, put) -> None:
    for name, suffix in (("norm", ".norm"), ("linear_fc1", ".fc1"), ("act_fn", ".act")):
        enter(shadow(merger, name, Recording(getattr(merger, name), lambda a, k, out, s=stage + suffix: put(s, out))))


def _block_substages(enter, index: int, block, put) -> None:
    attn, mlp = block.attn, block.mlp
    heads = attn.num_heads

    def record(name: str, source: str = "out"):
        stage = block_stage_id(index, name)
        return lambda args, kwargs, out: put(stage, out if source == "out" else args[0])

    def qkv(args, kwargs, out):
        put(block_stage_id(index, "attn.v"), out.reshape(out.shape[0], 3, heads, -1)[:, 2])

    def norm2(args, kwargs, out):
        put(block_stage_id(index, "residual1"), args[0])
        put(block_stage_id(index, "norm2"), out)

    enter(shadow(block, "norm1", Recording(block.norm1, record("norm1"))))
    enter(shadow(attn, "qkv", Recording(attn.qkv, qkv)))
    enter(shadow(attn, "proj", Recording(attn.proj, record("attn.context", "in"))))
    enter(shadow(block, "attn", Recording(attn, record("attn.out"))))
    enter(shadow(block, "norm2", Recording(block.norm2, norm2)))
    enter(shadow(mlp, "linear_fc1", Recording(mlp.linear_fc1, record("mlp.fc1"))))
    enter(shadow(mlp, "act_fn", Recording(mlp.act_fn, record("mlp.act"))))
    enter(shadow(mlp, "linear_fc2", Recording(mlp.linear_fc2, record("mlp.fc2"))))


def capture(model: Any, inputs: ModelInputs, sink: StageSink) -> None:
    """Every vision stage of one forward of mlx-vlm's tower (in the policy's dtype, widened to float32)."""
    import mlx.core as mx

    tower = model.vision_tower
    vision_module = sys.modules[type(tower).__module__]
    state: dict[str, Any] = {"block": None, "rope_calls": 0}

    def put(stage_id: str, value: Any) -> None:
        if sink.wants(stage_id):
            sink.put(stage_id, to_numpy(value), native_dtype=dtype_name(value))

    def rotary(args, kwargs, freqs):
        cos, sin = mx.cos(freqs), mx.sin(freqs)
        put("vision.rotary.cos", mx.concatenate([cos, cos], axis=-1))
        put("vision.rotary.sin", mx.concatenate([sin, sin], axis=-1))

    original_rope = vision_module.apply_rotary_pos_emb_vision

    def rope(tensor, freqs):
        out = original_rope(tensor, freqs)
        name = "attn.q" if state["rope_calls"] % 2 == 0 else "attn.k"
        state["rope_calls"] += 1
        put(block_stage_id(state["block"], name), out.reshape(out.shape[-3:]))  # (tokens, heads, head_dim)
        return out

    def block_call(index: int, block):
        def call(hidden_states, cu_seqlens, rotary_pos_emb):
            if index == 0:
                put("vision.positioned", hidden_states)
            put("vision.cu_seqlens", cu_seqlens)
            state["block"], state["rope_calls"] = index, 0
            out = block(hidden_states, cu_seqlens=cu_seqlens, rotary_pos_emb=rotary_pos_emb)
            put(block_stage_id(index), out)
            return out

        return call

    with ExitStack() as stack:
        enter = stack.enter_context
        enter(shadow(tower, "patch_embed", Recording(tower.patch_embed, lambda a, k, o: put("vision.patch_embed", o))))
        interpolate = Recording(tower.fast_pos_embed_interpolate, lambda a, k, o: put("vision.pos_embed", o))
        enter(shadow(tower, "fast_pos_embed_interpolate", interpolate))
        enter(shadow(tower, "rot_pos_emb", Recording(tower.rot_pos_emb, rotary)))
        enter(module_attr(vision_module, "apply_rotary_pos_emb_vision", rope))
        for index, block in enumerate(tower.blocks):
            if any(sink.wants(block_stage_id(index, s)) for s in ("norm1", "attn.q", "mlp.fc1", "norm2")):
                _block_substages(enter, index, block, put)
            enter(list_item(tower.blocks, index, block_call(index, block)))
        for branch, merger in enumerate(tower.deepstack_merger_list):
            _merger(enter, merger, deepstack_stage_id(branch), put)
        _merger(enter, tower.merger, "vision.merger", put)
        merged, deepstack = tower(*_pixels(model, inputs))
        mx.eval(merged, deepstack)
    put("vision.merger", merged)
    for branch, feature in enumerate(deepstack):
        put(deepstack_stage_id(branch), feature)


def capture_text(model: Any, inputs: ModelInputs, sink: StageSink) -> None:
    """mlx-vlm's full model: merged embeddings and M-RoPE from its own code, prefill (each layer's output and
    the hidden state after each DeepStack add), greedy decode."""
    import mlx.core as mx
    from mlx_vlm.models.cache import make_prompt_cache

    text = inputs.text
    ids = mx.array(text.input_ids[None])
    image = text.vision_slots  # the image slots, then the video slots
    vision = mlx_vision_kwargs(model, inputs)  # mlx-vlm's own image and video inputs (its processor's keys)
    pixels = vision.pop("pixel_values")
    features = model.get_input_embeddings(ids, pixels, **vision)
    embeds = to_numpy(features.inputs_embeds[0])
    inner = model.language_model.model
    rows = to_numpy(inner.embed_tokens(ids)[0])
    put_text_inputs(
        inputs, sink, embeds, rows, np.array(features.position_ids).reshape(3, -1), np.array(features.rope_deltas)
    )
    layers = inner.layers
    branches = len(model.vision_tower.deepstack_visual_indexes)

    def record_layer(index: int):  # the layer's own output, before any add
        def record(args, kwargs, out) -> None:
            hidden = to_numpy(out[0])
            sink.put(f"text.layer.{index}", hidden)
            sink.put(f"text.layer.{index}.last", hidden[-1])
            if index < branches:
                sink.put(f"text.layer.{index}.image", hidden[image])

        return record

    def record_after_add(index: int):  # what the next module receives: layer ``index``'s output after its add
        return lambda args, kwargs, out: sink.put(f"text.layer.{index}.deepstack", to_numpy(args[0][0])[image])

    cache = make_prompt_cache(model.language_model)
    with ExitStack() as stack:  # recorders only during the prefill
        for index, layer in enumerate(list(layers)):
            recorder = Recording(layer, record_layer(index))
            if 0 < index <= branches:
                recorder = Recording(recorder, record_after_add(index - 1))
            stack.enter_context(list_item(layers, index, recorder))
        final = Recording(inner.norm, lambda a, k, out: sink.put("text.norm.last", to_numpy(out[0, -1])))
        if len(layers) <= branches:
            final = Recording(final, record_after_add(len(layers) - 1))
        stack.enter_context(shadow(inner, "norm", final))
        logits = model(ids, pixel_values=pixels, cache=cache, **vision).logits
        mx.eval(logits)
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


def _merger_replay(merger, kind: str, x):
    if kind == "norm":
        return merger.norm(x.reshape(-1, merger.hidden_size) if merger.use_postshuffle_norm else x)
    if kind == "fc1":
        return merger.linear_fc1(x.reshape(-1, merger.hidden_size))
    if kind == "act":
        return merger.act_fn(x)
    return merger.linear_fc2(x)


def replay(model: Any, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
    """mlx-vlm's own modules (in the policy's dtype) applied to ``inputs``."""
    import mlx.core as mx

    if stage_id.startswith("text."):
        return replay_text(model, stage_id, inputs, ctx, lambda *args: _merge(model, *args))
    tower = model.vision_tower
    block, branch, kind = parse_stage(stage_id)
    if kind == "pos_embed":  # mlx-vlm's own interpolation of the table to the reference's grids
        out = tower.fast_pos_embed_interpolate(mx.array(np.asarray(inputs[0], dtype=np.int64)))
    else:
        dtype = tower.patch_embed.proj.weight.dtype
        args = [mx.array(np.ascontiguousarray(x, dtype=np.float32)).astype(dtype) for x in inputs]
        if kind == "patch_embed":
            out = tower.patch_embed(args[0])
        elif kind == "positioned":
            out = args[0] + args[1]
        elif branch is not None:
            out = _merger_replay(tower.deepstack_merger_list[branch], kind.split(".", 1)[1], args[0])
        elif block is None:
            out = _merger_replay(tower.merger, kind.split(".", 1)[1], args[0])
        else:
            out = _block_replay(tower.blocks[block], kind, args, ctx, sys.modules[type(tower).__module__])
    mx.eval(out)
    return to_numpy(out)


def _block_replay(blk, kind: str, args: list, ctx: Any, vision_module: Any):
    """One block stage by mlx-vlm's own block ``blk`` (perhaps wrapped by a patch) and the tower's module
    ``vision_module`` (its rotary helper: the block's own class may be a patch's wrapper)."""
    import mlx.core as mx

    # mlx-vlm rotates with angles (it takes cos/sin itself): recover them from the reference's tables
    half = ctx.cos.shape[1] // 2
    freqs = mx.array(np.arctan2(ctx.sin[:, :half], ctx.cos[:, :half]).astype(np.float32))
    bounds = ctx.cu_seqlens.astype(np.int32)
    attn, mlp = blk.attn, blk.mlp
    if kind == "block":
        return blk(args[0], cu_seqlens=mx.array(bounds), rotary_pos_emb=freqs)
    if kind in ("attn.q", "attn.k", "attn.v"):
        rows = args[0].shape[0]
        q, k, v = mx.split(attn.qkv(args[0]).reshape(rows, 3, attn.num_heads, -1).transpose(1, 0, 2, 3), 3)
        if kind == "attn.v":
            return v[0]
        return vision_module.apply_rotary_pos_emb_vision(q if kind == "attn.q" else k, freqs)[0]
    if kind == "attn.context":
        q, k, v = (t.transpose(1, 0, 2)[None] for t in args)  # [1, heads, rows, head_dim]
        splits = [mx.split(t, bounds[1:-1].tolist(), axis=2) for t in (q, k, v)]
        parts = [
            mx.fast.scaled_dot_product_attention(qs, ks, vs, scale=attn.scale, mask=None)
            for qs, ks, vs in zip(*splits, strict=True)
        ]
        return mx.concatenate(parts, axis=2).transpose(0, 2, 1, 3).reshape(args[0].shape[0], -1)
    operators = {
        "norm1": lambda: blk.norm1(args[0]),
        "attn.out": lambda: attn.proj(args[0]),
        "residual1": lambda: args[0] + args[1],
        "norm2": lambda: blk.norm2(args[0]),
        "mlp.fc1": lambda: mlp.linear_fc1(args[0]),
        "mlp.act": lambda: mlp.act_fn(args[0]),
        "mlp.fc2": lambda: mlp.linear_fc2(args[0]),
    }
    return operators[kind]()


def _merge(model: Any, features, embeds, ids):
    """mlx-vlm's own merge of the tower's features into the image slots (video slots count as image ones)."""
    config = model.config
    video = getattr(config, "video_token_id", config.image_token_id)
    return model.merge_input_ids_with_image_features(features, embeds, ids, config.image_token_id, video)[0]
