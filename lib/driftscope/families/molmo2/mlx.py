"""Molmo2 in mlx-vlm: loading (config adapted in memory), where to record each stage of the tower and the
decoder, the replay operators."""

from __future__ import annotations

import copy
import glob
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from driftscope.families.capabilities import MLXCapabilities
from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.mlx_hooks import Recording, SiluProxy, cache_snapshot, dtype_name, module_attr, shadow, to_numpy
from driftscope.taps.module_taps import tapped
from driftscope.taps.sink import StageSink, put_greedy

from ...errors import CheckpointError
from .config import mlx_config, read_facts, unrepresentable
from .plan import adapter_taps, parse_stage, selected_slot, text_taps, vit_taps

# Molmo2 in mlx-vlm: loading (config adapted in memory), where to record each stage, the replay operators.
#
# The stages a module's output or input holds are declared in ``plan``; wrappers stand in for a method
# (``encode_image``) and for mlx-vlm's ``nn`` inside its vision module (the projector's SiLU); each is removed again
# afterwards, restoring whatever a hypothesis patch put there. ``vision.selected.L`` is the slice of the
# features mlx-vlm actually concatenated, named by the layer the checkpoint config selects: a runtime that
# reads another layer diverges there. Replays run mlx-vlm's own code wherever it is inline (the attention
# context, the pooler's gather, query and mask, the decoder's mask) by feeding it the reference's values.

CAPABILITIES = MLXCapabilities(unrepresentable=unrepresentable)  # the runtime asks it before loading


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
    """One pass of mlx-vlm's image path with the declared module stages tapped (``plan``), recorders on
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


# Molmo2's decoder in mlx-vlm: where to record the text stages (every layer at every position), greedy decoding,
# and the text replay operators (mlx-vlm's own embedding, blocks, final norm and head; its mask built by its own
# code, or a hypothesis patch's, for the mask's replay; a block replay reads the mask it is given).


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


# mlx-vlm's Molmo2 ``Model`` loaded from a checkpoint (config adapted in memory by ``mlx_config``).


def _resplit_embedding(weights: dict, vocab_size: int) -> dict:
    """Word embedding as ``vocab_size`` + additional rows (transformers 5.24 saves two equal halves)."""
    import mlx.core as mx

    base, extra = "model.transformer.wte.embedding", "model.transformer.wte.new_embedding"
    if base in weights and extra in weights and weights[base].shape[0] != vocab_size:
        table = mx.concatenate([weights[base], weights[extra]], axis=0)
        weights[base], weights[extra] = table[:vocab_size], table[vocab_size:]
    return weights


def load_mlx_model(path: str | Path, config: dict, dtype: str = "float32") -> Any:
    """mlx-vlm's Molmo2 ``Model`` with the checkpoint's weights (strict; an MLX-community directory's quantized
    layers as quantized modules), its code unchanged.

    The checkpoint's own config.json is kept on the model as ``driftscope_source_config`` (hypothesis
    patches read the declared ViT depth from it; mlx-vlm's config no longer has it).
    """
    from driftscope.model.blas import mlx_blas

    mlx_blas()  # before the first `import mlx.core`
    import mlx.core as mx
    from mlx_vlm import utils

    adapted = mlx_config(config)
    model_module, _ = utils.get_model_and_args(config=adapted)
    model_config = model_module.ModelConfig.from_dict(adapted)
    model_config = utils.update_module_configs(model_config, model_module, adapted, ["text", "vision"])
    model = model_module.Model(model_config)
    weights: dict[str, Any] = {}
    for weight_file in sorted(glob.glob(str(Path(path) / "*.safetensors"))):
        weights.update(mx.load(weight_file))
    weights = _resplit_embedding(weights, read_facts(config).text.vocab_size)
    weights = utils.sanitize_weights(model, weights)
    weights = utils.sanitize_weights(model_module.LanguageModel, weights, model_config.text_config)
    try:  # mlx-vlm's own install: an MLX-community checkpoint's quantized layers become quantized modules
        utils.load_model_weights(model, adapted, weights, Path(path), strict=True)
    except ValueError as err:
        raise CheckpointError(
            f"checkpoint {path} does not match mlx-vlm's Molmo2 model: {err}",
            "check that config.json describes these weights (depth, hidden sizes, vocabulary)",
        ) from err
    if dtype != "float32":
        model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    model.eval()
    object.__setattr__(model, "driftscope_source_config", copy.deepcopy(config))
    return model
