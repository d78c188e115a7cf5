"""Qwen2.5-VL on mlx-vlm: loading (the config adapted in memory where mlx-vlm needs it, what its port cannot
represent), the declared stages tapped by class-call watching, the text side, and the replay operators."""

from __future__ import annotations

import copy
import functools
import glob
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from driftscope.errors import CheckpointError
from driftscope.families.capabilities import MLXCapabilities
from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.mlx_hooks import Recording, SiluProxy, dtype_name, module_attr, shadow, to_numpy
from driftscope.taps.module_taps import tapped
from driftscope.taps.sink import StageSink

from ..qwen_shared.block_replay import block_operator, mlx_attention_replay, mlx_rotary_angles
from ..qwen_shared.mlx_text import mlx_pixels, mlx_vision_kwargs, put_decoded, put_prompt, replay_text
from ..qwen_shared.text import text_taps, tied_head
from .geometry import unique_consecutive
from .plan import block_stage_id, parse_stage, tower_taps
from .torch import put_unused_bounds

# Load a transformers-5 Qwen2.5-VL checkpoint (or an MLX-community quantized one) with mlx-vlm's model code.
#
# mlx-vlm 0.7 reads the older config layout: text settings at the top level and ``rope_scaling``
# with ``type: mrope``. transformers 5 nests them under ``text_config`` with ``rope_parameters``.
# ``adapt_config`` converts in memory; the checkpoint directory is never copied or edited.


#: The model type mlx-vlm builds this family's model from (it picks its model code by ``model_type``).
MLX_MODEL_TYPE = "qwen2_5_vl"


def adapt_config(config: dict) -> dict:
    """The mlx-vlm view of a transformers-5 Qwen2.5-VL config (a new dict), under mlx-vlm's Qwen2.5-VL model type
    whatever type the checkpoint declares (a family copied under another model type runs the same port)."""
    adapted = copy.deepcopy(config)
    adapted["model_type"] = MLX_MODEL_TYPE
    text = dict(adapted.get("text_config") or {})
    rope = dict(text.pop("rope_parameters", None) or adapted.pop("rope_parameters", None) or {})
    if "rope_scaling" not in text and rope:
        text["rope_scaling"] = {
            "type": "mrope" if "mrope_section" in rope else rope.get("rope_type", "default"),
            "mrope_section": rope.get("mrope_section", [16, 24, 24]),
            "rope_type": rope.get("rope_type", "default"),
        }
        text.setdefault("rope_theta", rope.get("rope_theta", 1e6))
    text["model_type"] = adapted.get("model_type", "qwen2_5_vl")
    for key, value in text.items():
        if key not in ("vision_config", "text_config"):
            adapted.setdefault(key, value)
            if key in ("rope_scaling", "rope_theta"):
                adapted[key] = value
    adapted["text_config"] = text
    vision = dict(adapted.get("vision_config") or {})
    vision["model_type"] = adapted.get("model_type", "qwen2_5_vl")
    vision.setdefault("out_hidden_size", text.get("hidden_size"))
    adapted["vision_config"] = vision
    return adapted


#: The spatial merge mlx-vlm 0.7.10's Qwen2.5-VL merger is built with, whatever the config says.
MLX_SPATIAL_MERGE = 2


def unrepresentable(config: dict, path=None) -> list[str]:
    """The settings of ``config`` mlx-vlm's Qwen2.5-VL port cannot represent, each naming its key."""
    merge = int((config.get("vision_config") or {}).get("spatial_merge_size", MLX_SPATIAL_MERGE))
    if merge == MLX_SPATIAL_MERGE:
        return []
    return [f"vision_config.spatial_merge_size is {merge}; mlx-vlm's merger always merges {MLX_SPATIAL_MERGE}x2"]


def load_mlx_model(path: Path, config: dict) -> Any:
    """mlx-vlm's Qwen2.5-VL ``Model`` with the checkpoint's safetensors weights (strict)."""
    import mlx.core as mx
    from mlx_vlm import utils

    adapted = adapt_config(config)
    model_module, _ = utils.get_model_and_args(config=adapted)
    model_config = model_module.ModelConfig.from_dict(adapted)
    model_config = utils.update_module_configs(model_config, model_module, adapted, ["text", "vision"])
    model = model_module.Model(model_config)
    weight_files = sorted(glob.glob(str(Path(path) / "*.safetensors")))
    weights: dict[str, Any] = {}
    for weight_file in weight_files:
        weights.update(mx.load(weight_file))
    for name in tied_head(config):  # derived from the embedding: mlx-vlm's tied model has no such parameter
        weights.pop(name, None)
    weights = utils.sanitize_weights(model, weights)
    weights = utils.sanitize_weights(model_module.VisionModel, weights, model_config.vision_config)
    weights = utils.sanitize_weights(model_module.LanguageModel, weights, model_config.text_config)
    try:  # mlx-vlm's own install: an MLX-community checkpoint's quantized layers become quantized modules
        utils.load_model_weights(model, adapted, weights, Path(path), strict=True)
    except ValueError as err:
        raise CheckpointError(
            f"checkpoint {path} does not match mlx-vlm's Qwen2.5-VL model: {err}",
            "check that config.json describes these weights (depth, hidden sizes)",
        ) from err
    mx.eval(model.parameters())
    model.eval()
    return model


# Qwen2.5-VL in mlx-vlm: loading (with the config adapted), where to record each stage, the replay operators.
#
# The stages a module's output or input holds are declared in ``plan.tower_taps``; q/k are recorded from mlx-vlm's
# own RoPE function (called for q, then k, in every block) and SiLU from the activation call inside its MLP.

CAPABILITIES = MLXCapabilities(unrepresentable=unrepresentable)  # the runtime asks it before loading


def load(path: Path, config: dict) -> Any:
    """mlx-vlm's model with the checkpoint's weights (its config adapted to the layout mlx-vlm reads)."""
    return load_mlx_model(path, config)


def rms_norms(model: Any) -> list[tuple[Any, str]]:
    """Every RMSNorm of the vision tower, as (owner, attribute)."""
    tower = model.vision_tower
    sites = [(block, name) for block in tower.blocks for name in ("norm1", "norm2")]
    return sites + [(tower.merger, "ln_q")]


def run_vision(model: Any, inputs: ModelInputs):
    """The plain vision forward (no taps): merged features in raster order."""
    return model.vision_tower(*mlx_pixels(model, inputs))


def capture(model: Any, inputs: ModelInputs, sink: StageSink) -> Any:
    """One tower forward with the declared module stages tapped (``plan.tower_taps``) and recorders on what no module
    gives (the rotary angles, the window index, RoPE, the SiLU, each block's bounds); returns the tower's output
    (``capture_text``'s ``tower``)."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_vlm.models.qwen2_5_vl import vision as vision_module

    tower = model.vision_tower
    state: dict[str, Any] = {"block": None, "rope_calls": 0}
    full = set(tower.fullatt_block_indexes)

    def put(stage_id: str, value: Any) -> None:
        if sink.wants(stage_id):
            sink.put(stage_id, to_numpy(value), native_dtype=dtype_name(value))

    def before_block(index: int):
        def run(args, kwargs) -> None:
            state["block"], state["rope_calls"] = index, 0
            if index in full:
                put("vision.cu_seqlens", kwargs["cu_seqlens"])
            elif sink.wants("vision.cu_window_seqlens"):
                sink.put_bounds("vision.cu_window_seqlens", to_numpy(kwargs["cu_seqlens"]))

        return run

    def rotary(args, kwargs, freqs):
        cos, sin = mx.cos(freqs), mx.sin(freqs)
        put("vision.rotary.cos", mx.concatenate([cos, cos], axis=-1))
        put("vision.rotary.sin", mx.concatenate([sin, sin], axis=-1))

    def window(args, kwargs, out):
        put("vision.window_index", out[0])
        state["cu_window"] = unique_consecutive(to_numpy(out[1]).astype(np.int64))

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

    before = {f"blocks.{index}": before_block(index) for index in range(len(tower.blocks))}
    with ExitStack() as stack:
        enter = stack.enter_context
        enter(tapped("mlx", tower, tower_taps(tower), sink, before))
        enter(shadow(tower, "rot_pos_emb", Recording(tower.rot_pos_emb, rotary)))
        enter(shadow(tower, "get_window_index", Recording(tower.get_window_index, window)))
        enter(module_attr(vision_module, "apply_rotary_pos_emb_vision", rope))
        enter(module_attr(vision_module, "nn", SiluProxy(nn, silu)))
        out = tower(*mlx_pixels(model, inputs))
        put("vision.merger", out)
        state["block"] = None
    put_unused_bounds(sink, inputs["grid_thw"], state.get("cu_window"))
    return out


def capture_text(model: Any, inputs: ModelInputs, sink: StageSink, tower: Any = None) -> None:
    """mlx-vlm's full model: merged embeddings and M-RoPE from its own code, prefill, greedy decode. ``tower``
    (the output ``capture`` returned for these inputs) goes in as mlx-vlm's cached image features, so the
    tower does not run again for the embeddings and the prefill."""
    import mlx.core as mx
    from mlx_vlm.models.cache import make_prompt_cache

    text = inputs.text
    ids = mx.array(text.input_ids[None])
    if inputs.video_paths:
        prefill = _video_prefill(model, inputs, ids, tower)
        features = prefill.features
    else:
        pixels, grid = mlx_pixels(model, inputs)
        cached = {"cached_image_features": tower} if tower is not None else {}
        features = model.get_input_embeddings(ids, pixels, image_grid_thw=grid, **cached)
        prefill = functools.partial(model, ids, pixel_values=pixels, image_grid_thw=grid, **cached)
    put_prompt(model, inputs, sink, ids, features)
    inner = model.language_model.model
    cache = make_prompt_cache(model.language_model)
    with tapped("mlx", inner, text_taps(len(inner.layers)), sink, native=False):  # during the prefill only
        logits = prefill(cache=cache).logits
        mx.eval(logits)
    put_decoded(model, sink, logits, cache, text)


def replay(model: Any, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
    """mlx-vlm's own modules (in the policy's dtype) applied to ``inputs``."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_vlm.models.qwen2_5_vl import vision as vision_module

    if stage_id.startswith("text."):
        return replay_text(model, stage_id, inputs, ctx, functools.partial(_merge, model))
    tower = model.vision_tower
    dtype = tower.patch_embed.proj.weight.dtype
    args = [mx.array(np.ascontiguousarray(x, dtype=np.float32)).astype(dtype) for x in inputs]
    block, kind = parse_stage(stage_id)
    if block is None:
        out = _replay_tower_piece(tower, kind, args, inputs, ctx)
        mx.eval(out)
        return to_numpy(out)
    blk = tower.blocks[block]
    freqs = mlx_rotary_angles(ctx)
    bounds = ctx.bounds(block).astype(np.int32)
    if kind == "block":
        out = blk(args[0], cu_seqlens=mx.array(bounds), rotary_pos_emb=freqs)
    elif kind in ("attn.q", "attn.k", "attn.v", "attn.context"):
        out = mlx_attention_replay(blk, kind, args, freqs, bounds, vision_module)
    else:
        out = block_operator(blk, kind, args, nn.silu)
    mx.eval(out)
    return to_numpy(out)


def _replay_tower_piece(tower: Any, kind: str, args: list, inputs: list[np.ndarray], ctx: Any):
    """The stem (patch embedding, rotary tables from the grid) and the merger's pieces, as mlx-vlm runs them."""
    import mlx.core as mx

    merger = tower.merger
    if kind == "patch_embed":
        return tower.patch_embed(args[0])
    if kind in ("rotary.cos", "rotary.sin"):
        freqs = tower.rot_pos_emb(mx.array(np.asarray(inputs[0], dtype=np.int64)))
        table = mx.cos(freqs) if kind == "rotary.cos" else mx.sin(freqs)
        return mx.concatenate([table, table], axis=-1)
    if kind == "merger.norm":
        return merger.ln_q(args[0])
    if kind == "merger.hidden":
        return merger.mlp[1](merger.mlp[0](args[0].reshape(-1, merger.hidden_size)))
    if kind == "merger.window":
        return merger.mlp[2](args[0])
    if kind == "merger":
        return args[0][mx.argsort(mx.array(ctx.window_index), axis=0)]
    raise KeyError(f"vision.{kind}")


def _merge(model: Any, features, embeds, ids):
    """mlx-vlm's own merge of the tower's features into the image slots, then the rest into the video slots.
    Adapted for a prompt holding both: mlx-vlm's merge fills the image slots alone when there are any (its video
    slots only in a prompt without images), so each kind is merged by its own call of that merge."""
    import mlx.core as mx

    config = model.config
    image, video = config.image_token_id, getattr(config, "video_token_id", config.image_token_id)
    count = int(mx.sum(ids == image).item())
    if count == 0 or int(mx.sum(ids == video).item()) == 0:
        return model.merge_input_ids_with_image_features(image, video, features, embeds, ids)
    embeds = model.merge_input_ids_with_image_features(image, image, features[:count], embeds, ids)
    return model.merge_input_ids_with_image_features(video, video, features[count:], embeds, ids)


def _video_prefill(model: Any, inputs: ModelInputs, ids, tower: Any = None):
    """A prompt with videos, through mlx-vlm's own pieces: the tower's packed output merged (:func:`_merge`), the
    M-RoPE positions from its ``get_rope_index`` with the image and video grids, and a prefill of its language
    model on those embeddings (its ``Model.get_input_embeddings`` takes the images' or the videos' pixels and
    grids, not both). Returns ``prefill(cache=...)`` with ``.features`` (embeddings, positions, deltas)."""
    from mlx_vlm.models.base import InputEmbeddingsFeatures

    vision = mlx_vision_kwargs(model, inputs)
    pixels = vision["pixel_values"] if vision["pixel_values"] is not None else vision["pixel_values_videos"]
    image_grid, video_grid = vision.get("image_grid_thw"), vision.get("video_grid_thw")
    if tower is None:
        tower = model.vision_tower(*mlx_pixels(model, inputs), output_hidden_states=False)
    language = model.language_model
    embeds = _merge(model, tower, language.model.embed_tokens(ids), ids)
    positions, deltas = language.get_rope_index(ids, image_grid, video_grid, None)

    def prefill(cache):
        return language(
            ids, embeds, cache=cache, pixel_values=pixels, image_grid_thw=image_grid, video_grid_thw=video_grid
        )

    prefill.features = InputEmbeddingsFeatures(inputs_embeds=embeds, position_ids=positions, rope_deltas=deltas)
    return prefill
