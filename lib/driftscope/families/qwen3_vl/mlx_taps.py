"""Qwen3-VL taps from mlx-vlm 0.7.10's eager model, captured by wrappers that do not change results
(a draft of the family's MLX side: plain dicts of stage id -> numpy until the Family interface settles).

Wrappers call the original module or function and record what it returned; q/k come from mlx-vlm's
own vision RoPE function. Text taps separate a decoder layer's own output (before the DeepStack add)
from the hidden state after the add (the next layer's input), as the transformers side does.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import numpy as np

from ...runtimes.mlx_runtime import _list_item, _module_attr, _Recording, _shadow, to_numpy
from .plan import block_stage_id, deepstack_stage_id


def _pixels(model, pixel_values: np.ndarray, grid_thw: np.ndarray):
    import mlx.core as mx

    dtype = model.vision_tower.patch_embed.proj.weight.dtype
    return mx.array(np.asarray(pixel_values)).astype(dtype), mx.array(np.asarray(grid_thw))


def _merger(enter, merger, stage: str, put) -> None:
    for name, suffix in (("norm", ".norm"), ("linear_fc1", ".fc1"), ("act_fn", ".act")):
        enter(_shadow(merger, name, _Recording(getattr(merger, name), lambda a, k, out, s=stage + suffix: put(s, out))))


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

    enter(_shadow(block, "norm1", _Recording(block.norm1, record("norm1"))))
    enter(_shadow(attn, "qkv", _Recording(attn.qkv, qkv)))
    enter(_shadow(attn, "proj", _Recording(attn.proj, record("attn.context", "in"))))
    enter(_shadow(block, "attn", _Recording(attn, record("attn.out"))))
    enter(_shadow(block, "norm2", _Recording(block.norm2, norm2)))
    enter(_shadow(mlp, "linear_fc1", _Recording(mlp.linear_fc1, record("mlp.fc1"))))
    enter(_shadow(mlp, "act_fn", _Recording(mlp.act_fn, record("mlp.act"))))
    enter(_shadow(mlp, "linear_fc2", _Recording(mlp.linear_fc2, record("mlp.fc2"))))


def capture_vision(model, pixel_values: np.ndarray, grid_thw: np.ndarray) -> dict[str, np.ndarray]:
    """Every vision stage of one forward of mlx-vlm's tower (in the model's dtype, widened to float32)."""
    import mlx.core as mx
    from mlx_vlm.models.qwen3_vl import vision as vision_module

    tower = model.vision_tower
    taps: dict[str, np.ndarray] = {}
    state: dict[str, Any] = {"block": None, "rope_calls": 0}

    def put(stage_id: str, value) -> None:
        taps[stage_id] = to_numpy(value)

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
        enter(
            _shadow(tower, "patch_embed", _Recording(tower.patch_embed, lambda a, k, o: put("vision.patch_embed", o)))
        )
        enter(
            _shadow(
                tower,
                "fast_pos_embed_interpolate",
                _Recording(tower.fast_pos_embed_interpolate, lambda a, k, o: put("vision.pos_embed", o)),
            )
        )
        enter(_shadow(tower, "rot_pos_emb", _Recording(tower.rot_pos_emb, rotary)))
        enter(_module_attr(vision_module, "apply_rotary_pos_emb_vision", rope))
        for index, block in enumerate(tower.blocks):
            _block_substages(enter, index, block, put)
            enter(_list_item(tower.blocks, index, block_call(index, block)))
        for branch, merger in enumerate(tower.deepstack_merger_list):
            _merger(enter, merger, deepstack_stage_id(branch), put)
        _merger(enter, tower.merger, "vision.merger", put)
        merged, deepstack = tower(*_pixels(model, pixel_values, grid_thw))
        mx.eval(merged, deepstack)
    put("vision.merger", merged)
    for branch, feature in enumerate(deepstack):
        put(deepstack_stage_id(branch), feature)
    return taps


def capture_text(model, input_ids: np.ndarray, pixel_values: np.ndarray, grid_thw: np.ndarray) -> dict[str, np.ndarray]:
    """One prefill of mlx-vlm's whole model: positions, each layer before and after its DeepStack add, logits."""
    import mlx.core as mx

    ids_np = np.asarray(input_ids)
    ids = mx.array(ids_np[None])
    pixels, grid = _pixels(model, pixel_values, grid_thw)
    features = model.get_input_embeddings(ids, pixels, image_grid_thw=grid)
    image = ids_np == model.config.image_token_id
    taps: dict[str, np.ndarray] = {
        "text.position_ids": np.array(features.position_ids).reshape(3, -1),
        "text.embeds.image": to_numpy(features.inputs_embeds[0])[image],
    }
    inner = model.language_model.model
    layers = inner.layers
    recorded: dict[str, np.ndarray] = {}

    def keep(name: str, source: str):
        return lambda args, kwargs, out: recorded.__setitem__(name, to_numpy((out if source == "out" else args[0])[0]))

    with ExitStack() as stack:
        for index, layer in enumerate(list(layers)):
            recorder = _Recording(layer, keep(f"{index}.before", "out"))
            if index > 0:
                recorder = _Recording(recorder, keep(f"{index - 1}.after", "in"))
            stack.enter_context(_list_item(layers, index, recorder))
        norm = _Recording(
            inner.norm,
            lambda a, k, out: (keep(f"{len(layers) - 1}.after", "in")(a, k, out), keep("norm", "out")(a, k, out)),
        )
        stack.enter_context(_shadow(inner, "norm", norm))
        logits = model(ids, pixel_values=pixels, image_grid_thw=grid).logits
        mx.eval(logits)
    branches = len(model.config.vision_config.deepstack_visual_indexes)
    for index in range(len(layers)):
        after = recorded[f"{index}.after"]
        taps[f"text.layer.{index}.last"] = recorded[f"{index}.before"][-1]
        taps[f"text.layer.{index}.hidden"] = after
        if index < branches:
            taps[f"text.layer.{index}.deepstack"] = after[image]
    taps["text.norm.last"] = recorded["norm"][-1]
    taps["text.logits.last"] = to_numpy(logits[0, -1])
    return taps
