"""Molmo2 in mlx-vlm: loading (config adapted in memory), where to record each stage, the replay operators.

The stages a module's output or input holds are declared in ``module_stages``; wrappers stand in for a method
(``encode_image``) and for mlx-vlm's ``nn`` inside its vision module (the projector's SiLU); each is removed again
afterwards, restoring whatever a hypothesis patch put there. ``vision.selected.L`` is the slice of the
features mlx-vlm actually concatenated, named by the layer the checkpoint config selects: a runtime that
reads another layer diverges there. Replays run mlx-vlm's own code wherever it is inline (the attention
context, the pooler's gather, query and mask, the decoder's mask) by feeding it the reference's values.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from driftscope.families.capabilities import MLXCapabilities
from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.mlx_hooks import Recording, SiluProxy, dtype_name, module_attr, shadow, to_numpy
from driftscope.taps.module_taps import tapped
from driftscope.taps.sink import StageSink

from .config import load_mlx_model
from .mlx_limits import unrepresentable
from .mlx_text import capture_text, decoder, replay_text
from .module_stages import adapter_taps, selected_slot, vit_taps
from .plan import parse_stage

CAPABILITIES = MLXCapabilities(unrepresentable=unrepresentable)  # the runtime asks it before loading

__all__ = ["capture", "capture_text", "decoder", "load", "replay", "rms_norms", "run_vision"]


def load(path: Path, config: dict) -> Any:
    """mlx-vlm's Molmo2 ``Model`` with the checkpoint's weights (its code unchanged, its defects included)."""
    return load_mlx_model(path, config)


def rms_norms(model: Any) -> list[tuple[Any, str]]:
    """Every RMSNorm (the decoder's; the ViT normalizes with LayerNorm), as (owner, attribute)."""
    text = decoder(model)
    sites = [(block, name) for block in text.blocks for name in ("attn_norm", "ff_norm")]
    return sites + [(text, "ln_f")]


def _tower_inputs(model: Any, inputs: ModelInputs):
    """[1, crops, patches, pixels] and [1, tokens, slots]: one example holding every image's crops (the
    indices already offset across images, as mlx-vlm's own batching makes them)."""
    import mlx.core as mx

    dtype = model.vision_tower.image_vit.patch_embedding.weight.dtype
    return mx.array(inputs["pixel_values"])[None].astype(dtype), mx.array(inputs["pooling"])[None]


def run_vision(model: Any, inputs: ModelInputs):
    """The plain image path (no taps): the projected features of every pooled token."""
    return model.vision_tower(*_tower_inputs(model, inputs))


def capture(model: Any, inputs: ModelInputs, sink: StageSink) -> None:
    """One pass of mlx-vlm's image path with the declared module stages tapped (``module_stages``), recorders on
    the selected layers' features (what ``encode_image`` returns) and the projector's SiLU."""
    import mlx.core as mx
    from mlx_vlm.models.molmo2 import vision as vision_module

    tower = model.vision_tower
    vit = tower.image_vit
    layers = list(sink.plan.meta.get("selected_layers", []))

    def put(stage_id: str, value: Any) -> None:
        if sink.wants(stage_id):
            sink.put(stage_id, to_numpy(value), native_dtype=dtype_name(value))

    def encoded(args, kwargs, out):
        features = out[0]
        for slot, layer in enumerate(layers):  # an MLX array sliced as transformers' side slices its numpy one
            put(f"vision.selected.{layer}", selected_slot(slot, len(layers))(features))
        put("vision.concatenated", features)

    def silu(x):
        y = nn_silu(x)
        put("projector.act", y[0])
        return y

    nn_silu = vision_module.nn.silu
    head_dim = next((block.attention.head_dim for block in vit.transformer), 1)
    taps = [*vit_taps(len(vit.transformer), head_dim), *adapter_taps(layers)]
    with ExitStack() as stack:
        enter = stack.enter_context
        enter(tapped("mlx", tower, taps, sink))
        enter(shadow(tower, "encode_image", Recording(tower.encode_image, encoded)))
        enter(module_attr(vision_module, "nn", SiluProxy(vision_module.nn, silu)))
        mx.eval(tower(*_tower_inputs(model, inputs)))
    # the valid slots of the indices handed to the pooler (mlx-vlm derives its denominator and mask inline)
    sink.put("pool.valid_counts", (np.asarray(inputs["pooling"]) >= 0).sum(axis=-1))
    table = vit.positional_embedding
    if tuple(vit.config.image_num_patch) == (int(round(table.shape[0] ** 0.5)),) * 2:
        put("vision.pos_embed", table)  # mlx-vlm adds the table as is (it resizes it for another grid)


def _pooler(model: Any, features: Any, pooling: np.ndarray, query: Any = None) -> dict[str, Any]:
    """mlx-vlm's pooler on ``features`` ([1, rows, dim]) with ``pooling`` (its own gather, query, denominator and
    mask); ``query`` replaces the query its attention reads. Returns what the attention read and gave."""
    import mlx.core as mx

    tower = model.vision_tower
    seen: dict[str, Any] = {}
    attention = tower.image_pooling_2d

    def pool(q, kv, attn_mask=None):
        seen.update(query=q[:, 0], gathered=kv)
        out = attention(q if query is None else query[:, None], kv, attn_mask=attn_mask)
        seen["output"] = out[:, 0]
        return out

    with shadow(tower, "encode_image", lambda images: features), shadow(tower, "image_pooling_2d", pool):
        mx.eval(tower(mx.zeros((1, 1, 1, 1)), mx.array(pooling)[None]))
    return seen


def replay(model: Any, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
    """mlx-vlm's own modules (in the policy's dtype) applied to ``inputs``."""
    import mlx.core as mx
    from mlx_vlm.models.molmo2 import vision as vision_module

    if stage_id.startswith("text."):
        return replay_text(model, stage_id, inputs, ctx)
    tower = model.vision_tower
    vit = tower.image_vit
    dtype = vit.patch_embedding.weight.dtype
    args = [mx.array(np.ascontiguousarray(x, dtype=np.float32)).astype(dtype) for x in inputs]
    block, kind = parse_stage(stage_id)
    projector = tower.image_projector
    if block is not None:
        out = _block_replay(vit.transformer[block], kind, args)
    elif stage_id == "vision.patch_embed":
        out = vit.patch_embedding(args[0])
    elif stage_id == "vision.positioned":
        out = vit.add_pos_emb(args[0], vit.config.image_num_patch)
    elif stage_id.startswith("vision.selected."):  # the layers mlx-vlm concatenates at this slot
        out = args[tower.vit_layers[ctx.slot(int(stage_id.rsplit(".", 1)[1]))]]
    elif stage_id == "vision.concatenated":
        out = mx.concatenate(args, axis=-1)
    elif stage_id == "pool.gathered":
        out = _pooler(model, args[0][None], ctx.pooling)["gathered"]
    elif stage_id == "pool.query":
        out = _pooler(model, args[0].reshape(1, -1, args[0].shape[-1]), ctx.flat_pooling())["query"]
    elif stage_id == "pool.output":
        gathered = args[1].reshape(1, -1, args[1].shape[-1])
        out = _pooler(model, gathered, ctx.flat_pooling(), query=args[0])["output"]
    else:
        out = {
            "projector.gate": lambda: projector.w1(args[0]),
            "projector.act": lambda: vision_module.nn.silu(args[0]),
            "projector.up": lambda: projector.w3(args[0]),
            "projector.product": lambda: args[0] * args[1],
            "projector.output": lambda: projector.w2(args[0]),
        }[stage_id]()
    mx.eval(out)
    return to_numpy(out)


def _block_replay(block: Any, kind: str, args: list):
    attn, mlp = block.attention, block.feed_forward
    if kind == "block":
        return block(args[0])
    if kind in ("attn.q", "attn.k", "attn.v"):
        out = {"attn.q": attn.wq, "attn.k": attn.wk, "attn.v": attn.wv}[kind](args[0])
        return out.reshape(*out.shape[:-1], attn.num_heads, attn.head_dim)
    if kind == "attn.context":  # mlx-vlm's inline attention, fed these q/k/v, before its output projection
        q, k, v = (t.reshape(*t.shape[:2], -1) for t in args)
        with shadow(attn, "wq", lambda x: q), shadow(attn, "wk", lambda x: k), shadow(attn, "wv", lambda x: v):
            with shadow(attn, "wo", lambda x: x):
                return attn(q)
    return {
        "norm1": lambda: block.attention_norm(args[0]),
        "attn.out": lambda: attn.wo(args[0]),
        "residual1": lambda: args[0] + args[1],
        "norm2": lambda: block.ffn_norm(args[0]),
        "mlp.fc1": lambda: mlp.w1(args[0]),
        "mlp.act": lambda: mlp.act(args[0]),
        "mlp.fc2": lambda: mlp.w2(args[0]),
    }[kind]()
