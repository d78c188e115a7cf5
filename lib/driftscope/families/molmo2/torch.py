"""Molmo2 in transformers: the model class, the stages tapped (declared in ``plan``), the replay operators.

ViT stages are [crops, patches, ...]; ``attn.q/k/v`` are split into heads. ``vision.selected.L`` is the slice
of the features transformers actually concatenated (the adapter's input), named by the layer the checkpoint
config selects. The pooler's stages come from its attention's arguments and output; the decoder's mask
from the language model's ``attention_mask`` (0 where a row may read a column, the float minimum where not).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from driftscope.families.capabilities import TransformersCapabilities
from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.module_taps import tapped
from driftscope.taps.sink import StageSink, put_greedy
from driftscope.taps.torch_hooks import cache_snapshot
from driftscope.taps.torch_hooks import to_numpy as _np

from .plan import adapter_taps, parse_stage, text_taps, vit_taps

MODEL_CLASS = "Molmo2ForConditionalGeneration"
CAPABILITIES = TransformersCapabilities()  # nothing beyond the defaults


class _Stop(Exception):
    """Raised by a hook once it has what a replay needs (the rest of the forward is not run)."""


def _dtype(model: Any):
    return next(model.model.vision_tower.parameters()).dtype


def _image_kwargs(model: Any, inputs: ModelInputs) -> dict:
    import torch

    return {
        "pixel_values": torch.from_numpy(inputs["pixel_values"]).to(_dtype(model)),
        "image_token_pooling": torch.from_numpy(inputs["pooling"]),
        "image_grids": torch.from_numpy(inputs["grids"]),
    }


def run_vision(model: Any, inputs: ModelInputs):
    """The plain image path (no taps): the projected features of every pooled token, image after image."""
    import torch

    with torch.no_grad():
        out = model.model.get_image_features(**_image_kwargs(model, inputs))
    return torch.cat(out.pooler_output)


def capture(model: Any, inputs: ModelInputs, sink: StageSink) -> None:
    """One pass of the image path with the declared module stages tapped (``plan``), then the position
    table (a parameter)."""
    import torch

    vision = model.model.vision_tower
    head_dim = next((layer.self_attn.head_dim for layer in vision.layers), 1)
    taps = [*vit_taps(len(vision.layers), head_dim), *adapter_taps(list(sink.plan.meta.get("selected_layers", [])))]
    with tapped("torch", model.model, taps, sink), torch.no_grad():
        model.model.get_image_features(**_image_kwargs(model, inputs))
    if sink.wants("vision.pos_embed"):
        sink.put("vision.pos_embed", _np(vision.positional_embedding))


def allowed(mask: Any, seq: int) -> np.ndarray:
    """A decoder attention mask as 1 where query row ``i`` may read key ``j`` ([seq, seq] int64)."""
    import torch

    if mask is None:  # no mask: every row reads every column
        return np.ones((seq, seq), dtype=np.int64)
    mask = mask[0, 0] if mask.dim() == 4 else mask
    if mask.dtype == torch.bool:
        return _np(mask).astype(np.int64)
    return _np(mask > torch.finfo(mask.dtype).min / 2).astype(np.int64)


def capture_text(model: Any, inputs: ModelInputs, sink: StageSink) -> None:
    """Prefill the whole model with ``mm_token_type_ids`` (hooks on the decoder), then greedy decode."""
    import torch

    text = inputs.text
    language = model.model.language_model
    seen: dict[str, Any] = {}

    def decoder_input(args, kwargs) -> None:
        seen.update(embeds=kwargs.get("inputs_embeds"), mask=kwargs.get("attention_mask"))

    ids = torch.from_numpy(text.input_ids)[None]
    with tapped("torch", language, text_taps(len(language.layers)), sink, {"": decoder_input}), torch.no_grad():
        out = model(
            input_ids=ids,
            mm_token_type_ids=torch.from_numpy(text.mm_token_type_ids)[None],
            use_cache=True,
            **_image_kwargs(model, inputs),
            image_num_crops=torch.from_numpy(inputs["num_crops"]),
        )
    embeds = _np(seen["embeds"][0])
    image = text.input_ids == text.image_token_id
    sink.put("text.input_ids", text.input_ids)
    sink.put("text.token_types", text.mm_token_type_ids)
    sink.put("text.embeds.image", embeds[image])
    sink.put("text.embeds.text", embeds[~image])
    sink.put("text.attention_mask", allowed(seen["mask"], len(text.input_ids)))
    logits = _np(out.logits[0, -1])
    sink.put("text.logits.last", logits)
    cache = out.cache

    def step(token: int) -> np.ndarray:
        with torch.no_grad():
            return _np(model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True).logits[0, -1])

    step.rewind = lambda count: cache.crop(-count)  # drop the last ``count`` tokens
    step.cache_snapshot = cache_snapshot(cache)  # the cache's keys and values, layer by layer
    put_greedy(sink, logits, step, text.max_new_tokens, forced=text.forced)


def _adapter(model: Any, features: Any, pooling: np.ndarray, query: Any = None) -> dict[str, Any]:
    """The adapter on ``features`` with ``pooling`` (its own gather, query and mask); ``query`` replaces the
    query its attention reads. Returns what its attention read and gave."""
    import torch

    pooler = model.model.multi_modal_projector.image_pooling_2d
    seen: dict[str, Any] = {}

    def before(module, args, kwargs):
        seen.update(query=args[0][:, 0], gathered=args[1])
        return ((args[0] if query is None else query[:, None]), *args[1:]), kwargs

    handles = [
        pooler.register_forward_pre_hook(before, with_kwargs=True),
        pooler.register_forward_hook(lambda m, a, out: seen.update(output=out[0][:, 0])),
    ]
    try:
        model.model.multi_modal_projector(features, torch.from_numpy(pooling))
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _mask(model: Any, ids: np.ndarray, types: np.ndarray) -> np.ndarray:
    """The decoder mask transformers builds for this prompt (the forward stops at the decoder's door)."""
    import torch

    seen: dict[str, Any] = {}

    def stop(module, args, kwargs):
        seen["mask"] = kwargs.get("attention_mask")
        raise _Stop

    handle = model.model.language_model.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        model.model(
            input_ids=torch.from_numpy(ids.astype(np.int64))[None],
            mm_token_type_ids=torch.from_numpy(types.astype(np.int64))[None],
        )
    except _Stop:
        pass
    finally:
        handle.remove()
    return allowed(seen["mask"], len(ids))


def _selected_layer(model: Any, blocks: list, slot: int):
    """What transformers concatenates at ``slot``: ``hidden_states[layer + 1]`` (``[layer]`` if negative),
    where ``hidden_states[0]`` is the ViT's input and ``hidden_states[i + 1]`` block ``i``'s output."""
    layer = model.config.adapter_config.vision_feature_layer[slot]
    hidden = [None, *blocks]
    return hidden[layer + 1 if layer >= 0 else layer]


def replay(model: Any, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
    """The stage's own torch modules (the ones the forward ran) applied to ``inputs``."""
    import torch
    from transformers.models.molmo2 import modeling_molmo2 as modeling

    vision, adapter = model.model.vision_tower, model.model.multi_modal_projector
    if stage_id == "text.attention_mask":
        return _mask(model, *inputs)
    if stage_id.startswith("text."):
        return _replay_text(model, stage_id, inputs, ctx)
    dtype = _dtype(model)
    args = [torch.from_numpy(np.ascontiguousarray(x)).to(dtype) for x in inputs]
    block, kind = parse_stage(stage_id)
    with torch.no_grad():
        if block is not None:
            return _np(_block_replay(vision.layers[block], kind, args, modeling))
        if stage_id == "vision.patch_embed":
            out = vision.patch_embedding(args[0])
        elif stage_id == "vision.positioned":
            out = args[0] + vision.positional_embedding[None]
        elif stage_id.startswith("vision.selected."):
            out = _selected_layer(model, args, ctx.slot(int(stage_id.rsplit(".", 1)[1])))
        elif stage_id == "vision.concatenated":
            out = torch.cat(args, dim=-1)
        elif stage_id == "pool.gathered":
            out = _adapter(model, args[0], ctx.pooling)["gathered"]
        elif stage_id == "pool.query":
            out = _adapter(model, args[0], ctx.flat_pooling())["query"]
        elif stage_id == "pool.output":
            out = _adapter(model, args[1], ctx.flat_pooling(), query=args[0])["output"]
        else:
            projector = adapter.image_projector
            out = {
                "projector.gate": lambda: projector.gate_proj(args[0]),
                "projector.act": lambda: projector.act_fn(args[0]),
                "projector.up": lambda: projector.up_proj(args[0]),
                "projector.product": lambda: args[0] * args[1],
                "projector.output": lambda: projector.down_proj(args[0]),
            }[stage_id]()
    return _np(out)


def _block_replay(layer: Any, kind: str, args: list, modeling: Any):
    attn = layer.self_attn
    if kind == "block":
        return layer(args[0], None)
    if kind in ("attn.q", "attn.k", "attn.v"):
        proj = {"attn.q": attn.q_proj, "attn.k": attn.k_proj, "attn.v": attn.v_proj}[kind]
        out = proj(args[0])
        return out.reshape(*out.shape[:-1], -1, attn.head_dim)
    if kind == "attn.context":
        q, k, v = (t.transpose(1, 2) for t in args)  # [crops, heads, patches, head_dim]
        out, _ = modeling.eager_attention_forward(attn, q, k, v, None, scaling=attn.scaling)
        return out.reshape(*out.shape[:2], -1)
    return {
        "norm1": lambda: layer.layer_norm1(args[0]),
        "attn.out": lambda: attn.o_proj(args[0]),
        "residual1": lambda: args[0] + args[1],
        "norm2": lambda: layer.layer_norm2(args[0]),
        "mlp.fc1": lambda: layer.mlp.fc1(args[0]),
        "mlp.act": lambda: layer.mlp.activation_fn(args[0]),
        "mlp.fc2": lambda: layer.mlp.fc2(args[0]),
    }[kind]()


def _replay_text(model: Any, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
    """The decoder's own modules on given inputs: the embedding (features added at the ``<im_patch>`` slots, as
    the forward adds them), one layer (the given mask, RoPE at the sequence's indices), the final norm, the head."""
    import torch

    language = model.model.language_model
    dtype = language.embed_tokens.weight.dtype
    with torch.no_grad():
        if stage_id == "text.embeds.text":
            return _np(language.embed_tokens(torch.from_numpy(inputs[0]).long()))[~ctx.image_slots]
        if stage_id == "text.embeds.image":
            embeds = language.embed_tokens(torch.from_numpy(ctx.input_ids))
            features = torch.from_numpy(np.ascontiguousarray(inputs[0])).to(dtype)
            return _np(embeds[torch.from_numpy(ctx.image_slots)] + features)
        x = torch.from_numpy(np.ascontiguousarray(inputs[0])).to(dtype)
        if stage_id == "text.norm.last":
            return _np(language.norm(x))
        if stage_id == "text.logits.last":
            return _np(model.lm_head(x))
        index = int(stage_id.split(".")[2])
        x, seq = x[None], x.shape[0]
        allowed = torch.from_numpy(np.asarray(inputs[1]).astype(bool))
        mask = torch.zeros((1, 1, seq, seq), dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
        positions = torch.arange(seq)[None]
        rotary = language.rotary_emb if language.rope_types[index] == "scaled" else language.rotary_emb_unscaled
        layer = language.layers[index]
        out = layer(x, position_embeddings=rotary(x, positions), attention_mask=mask, position_ids=positions)
        out = (out[0] if isinstance(out, tuple) else out)[0]
        return _np(out[-1] if stage_id.endswith(".last") else out)
