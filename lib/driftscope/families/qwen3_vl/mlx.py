"""Qwen3-VL on mlx-vlm: loading (the config adapted in memory where mlx-vlm needs it), the declared stages tapped
by class-call watching, the text side, and the replay operators."""

from __future__ import annotations

import copy
import glob
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from driftscope.errors import CheckpointError, ParameterError
from driftscope.families.capabilities import MLXCapabilities
from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.mlx_hooks import Recording, dtype_name, module_attr, shadow, to_numpy
from driftscope.taps.module_taps import tapped
from driftscope.taps.sink import StageSink

from ..qwen_shared.block_replay import block_operator, mlx_attention_replay, mlx_rotary_angles
from ..qwen_shared.mlx_text import mlx_pixels, mlx_vision_kwargs, put_decoded, put_prompt, replay_text
from ..qwen_shared.text import tied_head
from .plan import block_stage_id, decoder_taps, parse_stage, tower_taps
from .torch import merger_replay

# Load a transformers-5 Qwen3-VL checkpoint (or an MLX-community quantized one) with mlx-vlm 0.7.10's model code.
#
# mlx-vlm reads the text RoPE from ``text_config.rope_theta`` and ``rope_scaling {type, mrope_section,
# mrope_interleaved}``; transformers 5 writes ``rope_parameters``. mlx-vlm's vision tower refuses the
# vision ``model_type`` ``qwen3_vl_vision`` that transformers writes and wants ``qwen3_vl``.
# ``adapt_config`` converts in memory; the checkpoint directory is never copied or edited. After
# that, every tensor loads strictly with mlx-vlm's own key sanitizing (no renaming here).
#
# mlx-vlm hard-codes what the config may say otherwise: the tanh GELU in the vision MLP and RoPE
# theta 10000 in the vision tower; ``check_config`` refuses a checkpoint that disagrees.

#: What mlx-vlm 0.7.10's Qwen3-VL vision tower computes whatever the config says.
MLX_VISION_ACT = "gelu_pytorch_tanh"
MLX_VISION_ROPE_THETA = 10000.0


def adapt_config(config: dict, vision_type: str = "qwen3_vl") -> dict:
    """The mlx-vlm view of a transformers-5 Qwen3-VL config (a new dict); ``vision_type`` is the vision
    ``model_type`` mlx-vlm's tower of that model accepts."""
    adapted = copy.deepcopy(config)
    text = dict(adapted.get("text_config") or {})
    rope = dict(text.get("rope_parameters") or adapted.get("rope_parameters") or {})
    if rope:
        text.setdefault("rope_theta", rope.get("rope_theta", 5e6))
        text.setdefault(
            "rope_scaling",
            {
                "type": rope.get("rope_type", "default"),
                "mrope_section": list(rope.get("mrope_section", [24, 20, 20])),
                "mrope_interleaved": bool(rope.get("mrope_interleaved", True)),
            },
        )
    text["model_type"] = adapted.get("model_type", "qwen3_vl")
    if "tie_word_embeddings" in adapted:  # transformers reads the top level (a re-saved MoE config has both)
        text["tie_word_embeddings"] = bool(adapted["tie_word_embeddings"])
    text.setdefault("tie_word_embeddings", False)
    adapted["text_config"] = text
    vision = dict(adapted.get("vision_config") or {})
    vision["model_type"] = vision_type
    adapted["vision_config"] = vision
    return adapted


def check_config(config: dict) -> None:
    """Refuse a checkpoint whose vision settings mlx-vlm would silently replace with its own."""
    vision = dict(config.get("vision_config") or {})
    act = vision.get("hidden_act", MLX_VISION_ACT)
    theta = float((vision.get("rope_parameters") or {}).get("rope_theta", MLX_VISION_ROPE_THETA))
    if act != MLX_VISION_ACT:
        raise CheckpointError(
            f"vision hidden_act is {act!r}; mlx-vlm 0.7.10 computes {MLX_VISION_ACT!r} regardless",
            "compare this checkpoint through transformers and the JAX emitter only, or patch mlx-vlm's vision MLP",
        )
    if theta != MLX_VISION_ROPE_THETA:
        raise CheckpointError(
            f"vision rope_theta is {theta}; mlx-vlm 0.7.10 uses {MLX_VISION_ROPE_THETA} regardless",
            "compare this checkpoint through transformers and the JAX emitter only, or patch mlx-vlm's vision RoPE",
        )


def load_mlx_model(path: str | Path, config: dict, vision_type: str = "qwen3_vl", prepare=None) -> Any:
    """mlx-vlm's Qwen3-VL ``Model`` with the checkpoint's safetensors weights (strict load); ``prepare`` (tensors
    -> tensors) puts a layout mlx-vlm's sanitizing does not expect into the one it does, before it runs."""
    from driftscope.model.blas import mlx_blas

    mlx_blas()  # before the first `import mlx.core`
    import mlx.core as mx
    from mlx_vlm import utils

    check_config(config)
    adapted = adapt_config(config, vision_type)
    model_module, _ = utils.get_model_and_args(config=adapted)
    model_config = model_module.ModelConfig.from_dict(adapted)
    model_config = utils.update_module_configs(model_config, model_module, adapted, ["text", "vision"])
    model = model_module.Model(model_config)
    weight_files = sorted(glob.glob(str(Path(path) / "*.safetensors")))
    if not weight_files:
        raise CheckpointError(f"checkpoint {path} has no *.safetensors files", "save it with save_pretrained")
    weights: dict[str, Any] = {}
    for weight_file in weight_files:
        weights.update(mx.load(weight_file))
    for name in tied_head(config):  # derived from the embedding: mlx-vlm's tied model has no such parameter
        weights.pop(name, None)
    if prepare is not None:
        weights = prepare(weights)
    weights = utils.sanitize_weights(model, weights)
    weights = utils.sanitize_weights(model_module.VisionModel, weights, model_config.vision_config)
    weights = utils.sanitize_weights(model_module.LanguageModel, weights, model_config.text_config)
    try:  # mlx-vlm's own install: an MLX-community checkpoint's quantized layers become quantized modules
        utils.load_model_weights(model, adapted, weights, Path(path), strict=True)
    except ValueError as err:
        raise CheckpointError(
            f"mlx-vlm's {vision_type} model does not take checkpoint {path}'s tensors as they are: {err}",
            "where transformers loads this checkpoint, config.json describes these weights and the MLX port is the "
            "limit: leave mlx out for it (the run's other runtimes still run); otherwise re-save config.json and "
            "the weights together with save_pretrained",
        ) from err
    mx.eval(model.parameters())
    model.eval()
    return model


# Qwen3-VL in mlx-vlm: loading (with the config adapted), where to record each stage, the replay operators.
#
# The stages a module's output or input holds are declared in ``plan.tower_taps``; wrappers call the original method
# or function and record what it returned; q/k come from mlx-vlm's own vision RoPE function (called for q, then k,
# in every block). The text side records a decoder layer's own
# output (``text.layer.N``, its last position and its image slots) and what the next layer receives after the
# DeepStack add (``text.layer.N.deepstack``), as the transformers side does.

CAPABILITIES = MLXCapabilities()  # nothing beyond the defaults


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


def run_vision(model: Any, inputs: ModelInputs):
    """The plain vision forward (no taps): the merged features and every DeepStack feature."""
    return model.vision_tower(*mlx_pixels(model, inputs))


def capture(model: Any, inputs: ModelInputs, sink: StageSink) -> None:
    """Every vision stage of one forward of mlx-vlm's tower (in the policy's dtype, widened to float32): the
    declared module stages (``plan``), the position table, rotary tables and q/k from what computes them."""
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

    def before_block(index: int):
        def run(args, kwargs) -> None:
            put("vision.cu_seqlens", kwargs["cu_seqlens"])
            state["block"], state["rope_calls"] = index, 0

        return run

    before = {f"blocks.{index}": before_block(index) for index in range(len(tower.blocks))}
    with ExitStack() as stack:
        enter = stack.enter_context
        enter(tapped("mlx", tower, tower_taps(tower), sink, before))
        interpolate = Recording(tower.fast_pos_embed_interpolate, lambda a, k, o: put("vision.pos_embed", o))
        enter(shadow(tower, "fast_pos_embed_interpolate", interpolate))
        enter(shadow(tower, "rot_pos_emb", Recording(tower.rot_pos_emb, rotary)))
        enter(module_attr(vision_module, "apply_rotary_pos_emb_vision", rope))
        mx.eval(*tower(*mlx_pixels(model, inputs)))


def capture_text(model: Any, inputs: ModelInputs, sink: StageSink) -> None:
    """mlx-vlm's full model: merged embeddings and M-RoPE from its own code, prefill (each layer's output and
    the hidden state after each DeepStack add), greedy decode."""
    import mlx.core as mx
    from mlx_vlm.models.cache import make_prompt_cache

    text = inputs.text
    ids = mx.array(text.input_ids[None])
    vision = mlx_vision_kwargs(model, inputs)  # mlx-vlm's own image and video inputs (its processor's keys)
    pixels = vision.pop("pixel_values")
    features = model.get_input_embeddings(ids, pixels, **vision)
    put_prompt(model, inputs, sink, ids, features)
    inner = model.language_model.model
    branches = len(model.vision_tower.deepstack_visual_indexes)
    taps = decoder_taps(len(inner.layers), branches, text.vision_slots)  # the image slots, then the video slots
    cache = make_prompt_cache(model.language_model)
    with tapped("mlx", inner, taps, sink, native=False):  # during the prefill only
        logits = model(ids, pixel_values=pixels, cache=cache, **vision).logits
        mx.eval(logits)
    put_decoded(model, sink, logits, cache, text)


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
            out = merger_replay(tower.deepstack_merger_list[branch], kind.split(".", 1)[1], args[0])
        elif block is None:
            out = merger_replay(tower.merger, kind.split(".", 1)[1], args[0])
        else:
            out = _block_replay(tower.blocks[block], kind, args, ctx, sys.modules[type(tower).__module__])
    mx.eval(out)
    return to_numpy(out)


def _block_replay(blk, kind: str, args: list, ctx: Any, vision_module: Any):
    """One block stage by mlx-vlm's own block ``blk`` (perhaps wrapped by a patch) and the tower's module
    ``vision_module`` (its rotary helper: the block's own class may be a patch's wrapper)."""
    import mlx.core as mx

    freqs = mlx_rotary_angles(ctx)
    bounds = ctx.cu_seqlens.astype(np.int32)
    if kind == "block":
        return blk(args[0], cu_seqlens=mx.array(bounds), rotary_pos_emb=freqs)
    if kind in ("attn.q", "attn.k", "attn.v", "attn.context"):
        return mlx_attention_replay(blk, kind, args, freqs, bounds, vision_module)
    return block_operator(blk, kind, args)


def _merge(model: Any, features, embeds, ids):
    """mlx-vlm's own merge of the tower's features into the image slots (video slots count as image ones)."""
    config = model.config
    video = getattr(config, "video_token_id", config.image_token_id)
    return model.merge_input_ids_with_image_features(features, embeds, ids, config.image_token_id, video)[0]
