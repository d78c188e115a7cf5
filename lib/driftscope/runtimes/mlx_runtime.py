"""Eager MLX through mlx-vlm's Qwen2.5-VL model code, captured by wrappers that do not change results.

Wrappers call the original module or function and record what it returned; q/k are recorded from
mlx-vlm's own RoPE function and SiLU from the activation call inside its MLP, so every tap is the
value the model actually computed.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np

from ..families.qwen2_5_vl import block_stage_id
from ..inputs import VisionInputs
from ..mlx_loader import load_mlx_model
from .base import Runtime, StageSink, package_versions, require

DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def to_numpy(array: Any) -> np.ndarray:
    """An MLX array as numpy (bfloat16 and float16 widened to float32, which is exact)."""
    import mlx.core as mx

    if array.dtype in (mx.bfloat16, mx.float16):
        array = array.astype(mx.float32)
    return np.array(array)


def dtype_name(array: Any) -> str:
    """An MLX array's dtype as numpy names it (``mlx.core.bfloat16`` -> ``bfloat16``)."""
    return str(array.dtype).rsplit(".", 1)[-1]


class _Recording:
    """Calls ``inner`` and hands its inputs and output to ``record``."""

    def __init__(self, inner: Any, record):
        self.inner = inner
        self.record = record

    def __call__(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        self.record(args, kwargs, out)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextmanager
def _shadow(owner: Any, name: str, value: Any):
    """Make ``owner.name`` resolve to ``value`` (an instance attribute), then put back what was there.

    A precision experiment or hypothesis patch may itself have shadowed ``name`` (e.g. a manual
    RMSNorm): that instance attribute is restored, not dropped, so a later replay runs the same operator.
    """
    missing = object()
    previous = owner.__dict__.get(name, missing)
    object.__setattr__(owner, name, value)
    try:
        yield
    finally:
        if previous is missing:
            object.__delattr__(owner, name)
        else:
            object.__setattr__(owner, name, previous)


@contextmanager
def _list_item(items: list, index: int, value: Any):
    original = items[index]
    items[index] = value
    try:
        yield
    finally:
        items[index] = original


@contextmanager
def _module_attr(module: Any, name: str, value: Any):
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


class _NNProxy:
    """Stands in for ``mlx.nn`` inside mlx-vlm's vision module: ``silu`` records, the rest delegates."""

    def __init__(self, nn: Any, silu):
        self._nn = nn
        self.silu = silu

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nn, name)


class ManualRMSNorm:
    """RMSNorm written out in the activation dtype: squares in F16 overflow above |x| = 256.

    The fused ``mx.fast.rms_norm`` (mlx.nn.RMSNorm) accumulates in float32 and does not.
    """

    def __init__(self, norm: Any):
        self.weight = norm.weight
        self.eps = norm.eps

    def __call__(self, x):
        import mlx.core as mx

        variance = mx.mean(x * x, axis=-1, keepdims=True)  # in x's dtype, as a hand-written port does it
        return self.weight * (x * mx.rsqrt(variance + mx.array(self.eps, dtype=x.dtype)))


RMSNORM_FORMS = ("fused", "manual")


def use_manual_rmsnorm(model: Any) -> Any:
    """Swap every RMSNorm of the vision tower for :class:`ManualRMSNorm` (the precision experiment)."""
    tower = model.vision_tower
    for block in tower.blocks:
        object.__setattr__(block, "norm1", ManualRMSNorm(block.norm1))
        object.__setattr__(block, "norm2", ManualRMSNorm(block.norm2))
    object.__setattr__(tower.merger, "ln_q", ManualRMSNorm(tower.merger.ln_q))
    return model


class MLXRuntime(Runtime):
    """mlx-vlm's eager Qwen2.5-VL on MLX (CPU here; Metal on a Mac)."""

    name = "mlx"
    policies = ("f32", "f16", "bf16")

    def _load(self) -> Any:
        from ..blas import mlx_blas

        mlx_blas()  # before the first `import mlx.core`
        mx = require("mlx.core", "mlx", self.name)
        require("mlx_vlm", "mlx-vlm", self.name)
        model = load_mlx_model(self.checkpoint.path, self.checkpoint.config)
        # every policy casts, f32 too: a bf16 checkpoint would otherwise run in bf16 under "f32"
        model.set_dtype(getattr(mx, DTYPES[self.policy.name]))
        mx.eval(model.parameters())
        form = self.options.get("rmsnorm", "fused")
        if form not in RMSNORM_FORMS:
            from ..errors import ParameterError

            raise ParameterError(f"mlx option rmsnorm={form!r} is not known", f"use one of: {', '.join(RMSNORM_FORMS)}")
        if form == "manual":
            model = use_manual_rmsnorm(model)
        return model

    def release(self) -> None:
        super().release()
        import mlx.core as mx

        mx.clear_cache()  # MLX keeps freed buffers for reuse; give them back

    def versions(self) -> dict[str, str]:
        from ..blas import mlx_blas

        return {**package_versions("mlx", "mlx-vlm"), "blas": mlx_blas()}

    def weight_dtypes(self) -> dict[str, int]:
        from collections import Counter

        from mlx.utils import tree_flatten

        return dict(Counter(dtype_name(value) for _, value in tree_flatten(self.model.parameters())))

    @property
    def tower(self) -> Any:
        return self.model.vision_tower

    def _pixels(self, inputs: VisionInputs):
        import mlx.core as mx

        dtype = self.tower.patch_embed.proj.weight.dtype
        return mx.array(inputs.pixel_values).astype(dtype), mx.array(inputs.grid_thw)

    def run_vision(self, inputs: VisionInputs):
        """The plain vision forward (no taps): merged features in raster order."""
        import mlx.core as mx

        self.load()
        out = self.tower(*self._pixels(inputs))
        mx.eval(out)
        return out

    def _capture(self, inputs: VisionInputs, sink: StageSink) -> None:
        import mlx.core as mx
        import mlx.nn as nn
        from mlx_vlm.models.qwen2_5_vl import vision as vision_module

        tower = self.tower
        state: dict[str, Any] = {"block": None, "rope_calls": 0}
        full = set(tower.fullatt_block_indexes)

        def put(stage_id: str, value: Any) -> None:
            if sink.wants(stage_id):
                sink.put(stage_id, to_numpy(value), native_dtype=dtype_name(value))

        def out_to(stage_id: str):
            return lambda args, kwargs, out: put(stage_id, out)

        def in_to(stage_id: str):
            return lambda args, kwargs, out: put(stage_id, args[0])

        def both_to(in_id: str, out_id: str):
            return lambda args, kwargs, out: (put(in_id, args[0]), put(out_id, out))

        def put_bounds(cu_window_seqlens):
            if sink.wants("vision.cu_window_seqlens"):
                sink.put_bounds("vision.cu_window_seqlens", to_numpy(cu_window_seqlens))

        def rotary(args, kwargs, freqs):
            cos, sin = mx.cos(freqs), mx.sin(freqs)
            put("vision.rotary.cos", mx.concatenate([cos, cos], axis=-1))
            put("vision.rotary.sin", mx.concatenate([sin, sin], axis=-1))

        def window(args, kwargs, out):
            put("vision.window_index", out[0])

        original_rope = vision_module.apply_rotary_pos_emb_vision

        def rope(tensor, freqs):
            out = original_rope(tensor, freqs)
            name = "attn.q" if state["rope_calls"] % 2 == 0 else "attn.k"
            state["rope_calls"] += 1
            put(block_stage_id(state["block"], name), out.reshape(out.shape[-3:]))  # (tokens, heads, head_dim)
            return out

        def silu(x):
            out = nn.silu(x)
            if state["block"] is not None:
                put(block_stage_id(state["block"], "mlp.act"), out)
            return out

        with ExitStack() as stack:
            enter = stack.enter_context
            enter(_shadow(tower, "patch_embed", _Recording(tower.patch_embed, out_to("vision.patch_embed"))))
            enter(_shadow(tower, "rot_pos_emb", _Recording(tower.rot_pos_emb, rotary)))
            enter(_shadow(tower, "get_window_index", _Recording(tower.get_window_index, window)))
            enter(_module_attr(vision_module, "apply_rotary_pos_emb_vision", rope))
            enter(_module_attr(vision_module, "nn", _NNProxy(nn, silu)))
            for index, block in enumerate(tower.blocks):
                enter(_list_item(tower.blocks, index, self._block_recorder(index, block, full, state, put, put_bounds)))
                if any(sink.wants(block_stage_id(index, s)) for s in ("norm1", "attn.q", "mlp.gate", "norm2")):
                    self._wrap_substages(enter, index, block, put, in_to, out_to, both_to)
            merger = tower.merger
            enter(_shadow(merger, "ln_q", _Recording(merger.ln_q, out_to("vision.merger.norm"))))
            enter(_list_item(merger.mlp, 1, _Recording(merger.mlp[1], out_to("vision.merger.hidden"))))
            enter(_shadow(tower, "merger", _Recording(merger, out_to("vision.merger.window"))))
            self.put_inputs(inputs, sink)
            out = tower(*self._pixels(inputs))
            put("vision.merger", out)
            state["block"] = None

    @staticmethod
    def _block_recorder(index: int, block: Any, full: set[int], state: dict, put, put_bounds):
        def call(hidden_states, cu_seqlens, rotary_pos_emb):
            state["block"], state["rope_calls"] = index, 0
            if index in full:
                put("vision.cu_seqlens", cu_seqlens)
            else:
                put_bounds(cu_seqlens)
            out = block(hidden_states, cu_seqlens=cu_seqlens, rotary_pos_emb=rotary_pos_emb)
            put(block_stage_id(index), out)
            return out

        return call

    @staticmethod
    def _wrap_substages(enter, index: int, block: Any, put, in_to, out_to, both_to) -> None:
        attn, mlp = block.attn, block.mlp
        heads = attn.num_heads

        def qkv(args, kwargs, out):
            put(block_stage_id(index, "attn.v"), out.reshape(out.shape[0], 3, heads, -1)[:, 2])

        enter(_shadow(block, "norm1", _Recording(block.norm1, out_to(block_stage_id(index, "norm1")))))
        enter(_shadow(attn, "qkv", _Recording(attn.qkv, qkv)))
        enter(_shadow(attn, "proj", _Recording(attn.proj, in_to(block_stage_id(index, "attn.context")))))
        enter(_shadow(block, "attn", _Recording(attn, out_to(block_stage_id(index, "attn.out")))))
        enter(
            _shadow(
                block,
                "norm2",
                _Recording(block.norm2, both_to(block_stage_id(index, "residual1"), block_stage_id(index, "norm2"))),
            )
        )
        enter(_shadow(mlp, "gate_proj", _Recording(mlp.gate_proj, out_to(block_stage_id(index, "mlp.gate")))))
        enter(_shadow(mlp, "up_proj", _Recording(mlp.up_proj, out_to(block_stage_id(index, "mlp.up")))))
        enter(
            _shadow(
                mlp,
                "down_proj",
                _Recording(
                    mlp.down_proj, both_to(block_stage_id(index, "mlp.product"), block_stage_id(index, "mlp.down"))
                ),
            )
        )

    can_replay = True

    def _capture_text(self, inputs: VisionInputs, sink: StageSink) -> None:
        """mlx-vlm's full model: merged embeddings and M-RoPE from its own code, prefill, greedy decode."""
        import mlx.core as mx
        from mlx_vlm.models.cache import make_prompt_cache

        from .base import put_greedy

        model, text = self.model, inputs.text
        ids = mx.array(text.input_ids[None])
        pixels, grid = self._pixels(inputs)
        features = model.get_input_embeddings(ids, pixels, image_grid_thw=grid)
        embeds = to_numpy(features.inputs_embeds[0])
        rows = to_numpy(model.language_model.model.embed_tokens(ids)[0])
        self.put_text_inputs(
            inputs, sink, embeds, rows, np.array(features.position_ids).reshape(3, -1), np.array(features.rope_deltas)
        )
        inner = model.language_model.model
        layers = inner.layers

        def last(stage_id):
            return lambda args, kwargs, out: sink.put(stage_id, to_numpy(out[0, -1]))

        cache = make_prompt_cache(model.language_model)
        with ExitStack() as stack:  # recorders only during the prefill
            for index, layer in enumerate(layers):
                stack.enter_context(_list_item(layers, index, _Recording(layer, last(f"text.layer.{index}.last"))))
            stack.enter_context(_shadow(inner, "norm", _Recording(inner.norm, last("text.norm.last"))))
            logits = model(ids, pixel_values=pixels, cache=cache, image_grid_thw=grid).logits
            mx.eval(logits)
        last = to_numpy(logits[0, -1])
        sink.put("text.logits.last", last)
        put_greedy(
            sink,
            last,
            lambda token: to_numpy(model.language_model(mx.array([[token]]), cache=cache).logits[0, -1]),
            text.max_new_tokens,
        )

    def replay(self, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
        """mlx-vlm's own modules (in the policy's dtype) applied to ``inputs``."""
        import mlx.core as mx
        import mlx.nn as nn
        from mlx_vlm.models.qwen2_5_vl import vision as vision_module

        from ..replay.context import parse_stage

        self.load()
        tower = self.tower
        dtype = tower.patch_embed.proj.weight.dtype
        args = [mx.array(np.ascontiguousarray(x, dtype=np.float32)).astype(dtype) for x in inputs]
        block, kind = parse_stage(stage_id)
        if block is None:
            merger = tower.merger
            if kind == "merger.norm":
                out = merger.ln_q(args[0])
            elif kind == "merger.hidden":
                out = merger.mlp[1](merger.mlp[0](args[0].reshape(-1, merger.hidden_size)))
            else:
                out = merger.mlp[2](args[0])
            return to_numpy(out)
        blk = tower.blocks[block]
        # mlx-vlm rotates with angles (it takes cos/sin itself): recover them from the reference's tables
        half = ctx.cos.shape[1] // 2
        freqs = mx.array(np.arctan2(ctx.sin[:, :half], ctx.cos[:, :half]).astype(np.float32))
        bounds = mx.array(ctx.bounds(block).astype(np.int32))
        attn, mlp = blk.attn, blk.mlp
        if kind == "block":
            out = blk(args[0], cu_seqlens=bounds, rotary_pos_emb=freqs)
        elif kind == "norm1":
            out = blk.norm1(args[0])
        elif kind in ("attn.q", "attn.k", "attn.v"):
            rows = args[0].shape[0]
            q, k, v = mx.split(attn.qkv(args[0]).reshape(rows, 3, attn.num_heads, -1).transpose(1, 0, 2, 3), 3)
            if kind == "attn.v":
                out = v[0]
            else:
                out = vision_module.apply_rotary_pos_emb_vision(q if kind == "attn.q" else k, freqs)[0]
        elif kind == "attn.context":
            q, k, v = (t.transpose(1, 0, 2)[None] for t in args)  # [1, heads, rows, head_dim]
            splits = [mx.split(t, ctx.bounds(block)[1:-1].tolist(), axis=2) for t in (q, k, v)]
            parts = [
                mx.fast.scaled_dot_product_attention(qs, ks, vs, scale=attn.scale, mask=None)
                for qs, ks, vs in zip(*splits, strict=True)
            ]
            out = mx.concatenate(parts, axis=2).transpose(0, 2, 1, 3).reshape(args[0].shape[0], -1)
        elif kind == "attn.out":
            out = attn.proj(args[0])
        elif kind == "residual1":
            out = args[0] + args[1]
        elif kind == "norm2":
            out = blk.norm2(args[0])
        elif kind == "mlp.gate":
            out = mlp.gate_proj(args[0])
        elif kind == "mlp.act":
            out = nn.silu(args[0])
        elif kind == "mlp.up":
            out = mlp.up_proj(args[0])
        elif kind == "mlp.product":
            out = args[0] * args[1]
        elif kind == "mlp.down":
            out = mlp.down_proj(args[0])
        else:
            raise KeyError(stage_id)
        mx.eval(out)
        return to_numpy(out)
