"""The replay operators of a Qwen vision block both families share, in transformers and in mlx-vlm: its attention
(q/k after RoPE, v, the context over each attention span) and the operators both libraries hold on modules of the
same names."""

from __future__ import annotations

from typing import Any

import numpy as np


def attention_replay(blk: Any, kind: str, args: list, rotary: tuple[Any, Any], bounds: Any, modeling: Any) -> Any:
    """A transformers vision block's ``attn.q``/``attn.k`` (after RoPE), ``attn.v`` (from the block's input) or
    ``attn.context`` (from q, k, v), each attention span apart as ``bounds`` (cu_seqlens) cut them, with the
    modeling module's own RoPE and eager attention."""
    import torch

    if kind == "attn.context":
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in args)
        lengths = (bounds[1:] - bounds[:-1]).tolist()
        parts = [
            modeling.eager_attention_forward(blk.attn, qs, ks, vs, None, scaling=blk.attn.scaling)[0]
            for qs, ks, vs in zip(*(torch.split(t, lengths, dim=2) for t in (q, k, v)), strict=True)
        ]
        return torch.cat(parts, dim=1).reshape(args[0].shape[0], -1)
    rows = args[0].shape[0]
    q, k, v = blk.attn.qkv(args[0]).reshape(rows, 3, blk.attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
    q, k = modeling.apply_rotary_pos_emb_vision(q, k, *rotary)
    return {"attn.q": q, "attn.k": k, "attn.v": v}[kind]


def mlx_rotary_angles(ctx: Any) -> Any:
    """The rotary angles mlx-vlm's vision RoPE takes (it computes cos/sin itself), recovered from the reference's
    tables (``ctx.cos``, ``ctx.sin``)."""
    import mlx.core as mx

    half = ctx.cos.shape[1] // 2
    return mx.array(np.arctan2(ctx.sin[:, :half], ctx.cos[:, :half]).astype(np.float32))


def mlx_attention_replay(blk: Any, kind: str, args: list, freqs: Any, bounds: np.ndarray, vision_module: Any) -> Any:
    """An mlx-vlm vision block's ``attn.q``/``attn.k`` (after RoPE, ``freqs`` its angles), ``attn.v`` or
    ``attn.context`` (from q, k, v, each attention span apart as ``bounds`` cut them), with ``vision_module``'s RoPE
    (the tower's module: the block's own class may be a patch's wrapper) and mlx's fused attention."""
    import mlx.core as mx

    attn = blk.attn
    if kind == "attn.context":
        q, k, v = (t.transpose(1, 0, 2)[None] for t in args)  # [1, heads, rows, head_dim]
        splits = [mx.split(t, bounds[1:-1].tolist(), axis=2) for t in (q, k, v)]
        parts = [
            mx.fast.scaled_dot_product_attention(qs, ks, vs, scale=attn.scale, mask=None)
            for qs, ks, vs in zip(*splits, strict=True)
        ]
        return mx.concatenate(parts, axis=2).transpose(0, 2, 1, 3).reshape(args[0].shape[0], -1)
    rows = args[0].shape[0]
    q, k, v = mx.split(attn.qkv(args[0]).reshape(rows, 3, attn.num_heads, -1).transpose(1, 0, 2, 3), 3)
    if kind == "attn.v":
        return v[0]
    return vision_module.apply_rotary_pos_emb_vision(q if kind == "attn.q" else k, freqs)[0]


def block_operator(blk: Any, kind: str, args: list, act: Any = None) -> Any:
    """A vision block's own operator for substage ``kind`` on ``args``, on the module names both libraries and both
    Qwen towers use (``norm1``, ``attn.proj``, ``norm2``; the MLP's ``gate_proj``/``up_proj``/``down_proj`` in
    Qwen2.5-VL, ``linear_fc1``/``linear_fc2`` in Qwen3-VL); ``act`` is the MLP's activation (default: its own
    ``act_fn``). A ``kind`` no operator computes raises KeyError."""
    mlp = blk.mlp
    operators = {
        "norm1": lambda: blk.norm1(args[0]),
        "attn.out": lambda: blk.attn.proj(args[0]),
        "residual1": lambda: args[0] + args[1],
        "norm2": lambda: blk.norm2(args[0]),
        "mlp.gate": lambda: mlp.gate_proj(args[0]),
        "mlp.up": lambda: mlp.up_proj(args[0]),
        "mlp.product": lambda: args[0] * args[1],
        "mlp.down": lambda: mlp.down_proj(args[0]),
        "mlp.fc1": lambda: mlp.linear_fc1(args[0]),
        "mlp.act": lambda: (act or mlp.act_fn)(args[0]),
        "mlp.fc2": lambda: mlp.linear_fc2(args[0]),
    }
    return operators[kind]()
