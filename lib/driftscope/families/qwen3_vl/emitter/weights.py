"""Vision and text weights from the checkpoint's safetensors, checked tensor by tensor against the config."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from driftscope.model.weightfile import TensorFiles

from ....errors import CheckpointError
from .config import TextSpec, VisionSpec

VISION_PREFIXES = ("model.visual.", "visual.")
TEXT_PREFIXES = ("model.language_model.", "model.")


def _merger_shapes(prefix: str, spec: VisionSpec, postshuffle: bool) -> dict[str, tuple[int, ...]]:
    merged = spec.merged_hidden
    norm = merged if postshuffle else spec.hidden_size
    return {
        f"{prefix}norm.weight": (norm,),
        f"{prefix}norm.bias": (norm,),
        f"{prefix}linear_fc1.weight": (merged, merged),
        f"{prefix}linear_fc1.bias": (merged,),
        f"{prefix}linear_fc2.weight": (spec.out_hidden_size, merged),
        f"{prefix}linear_fc2.bias": (spec.out_hidden_size,),
    }


def vision_shapes(spec: VisionSpec) -> dict[str, tuple[int, ...]]:
    """Every vision tensor the emitter reads, by its name under the ``model.visual.`` prefix."""
    d, i = spec.hidden_size, spec.intermediate_size
    p, t, c = spec.patch_size, spec.temporal_patch_size, spec.in_channels
    shapes = {
        "patch_embed.proj.weight": (d, c, t, p, p),
        "patch_embed.proj.bias": (d,),
        "pos_embed.weight": (spec.num_position_embeddings, d),
    }
    for b in range(spec.depth):
        for norm in ("norm1", "norm2"):
            shapes[f"blocks.{b}.{norm}.weight"] = (d,)
            shapes[f"blocks.{b}.{norm}.bias"] = (d,)
        shapes.update(
            {
                f"blocks.{b}.attn.qkv.weight": (3 * d, d),
                f"blocks.{b}.attn.qkv.bias": (3 * d,),
                f"blocks.{b}.attn.proj.weight": (d, d),
                f"blocks.{b}.attn.proj.bias": (d,),
                f"blocks.{b}.mlp.linear_fc1.weight": (i, d),
                f"blocks.{b}.mlp.linear_fc1.bias": (i,),
                f"blocks.{b}.mlp.linear_fc2.weight": (d, i),
                f"blocks.{b}.mlp.linear_fc2.bias": (d,),
            }
        )
    shapes.update(_merger_shapes("merger.", spec, postshuffle=False))
    for k in range(len(spec.deepstack_visual_indexes)):
        shapes.update(_merger_shapes(f"deepstack_merger_list.{k}.", spec, postshuffle=True))
    return shapes


def text_shapes(spec: TextSpec) -> dict[str, tuple[int, ...]]:
    """Every text tensor the emitter reads, by its name under the ``model.language_model.`` prefix."""
    d, i, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    shapes = {"embed_tokens.weight": (spec.vocab_size, d), "norm.weight": (d,)}
    for n in range(spec.layers):
        shapes.update(
            {
                f"layers.{n}.input_layernorm.weight": (d,),
                f"layers.{n}.post_attention_layernorm.weight": (d,),
                f"layers.{n}.self_attn.q_proj.weight": (spec.num_heads * hd, d),
                f"layers.{n}.self_attn.k_proj.weight": (spec.num_kv_heads * hd, d),
                f"layers.{n}.self_attn.v_proj.weight": (spec.num_kv_heads * hd, d),
                f"layers.{n}.self_attn.o_proj.weight": (d, spec.num_heads * hd),
                f"layers.{n}.self_attn.q_norm.weight": (hd,),
                f"layers.{n}.self_attn.k_norm.weight": (hd,),
                f"layers.{n}.mlp.gate_proj.weight": (i, d),
                f"layers.{n}.mlp.up_proj.weight": (i, d),
                f"layers.{n}.mlp.down_proj.weight": (d, i),
            }
        )
    return shapes


def _read(files: TensorFiles, keys: dict[str, str], shapes: dict[str, tuple[int, ...]], what: str) -> dict:
    weights: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        weights[name] = files.read_checked(keys[name], shape, f" ({what})")
    return weights


def load_vision_weights(path: str | Path, spec: VisionSpec) -> dict[str, np.ndarray]:
    """``{name: aligned float32 array}`` for every vision tensor; a missing or misshapen tensor is named."""
    files = TensorFiles(path)
    prefix = next((p for p in VISION_PREFIXES if f"{p}patch_embed.proj.weight" in files), None)
    if prefix is None:
        raise CheckpointError(
            f"checkpoint {path} has no vision tensors (no {VISION_PREFIXES[0]}patch_embed.proj.weight)",
            "use a Qwen3-VL checkpoint that includes the vision tower",
        )
    shapes = vision_shapes(spec)
    what = f"depth {spec.depth}, DeepStack branches {list(spec.deepstack_visual_indexes)}"
    return _read(files, {name: prefix + name for name in shapes}, shapes, what)


def load_text_weights(path: str | Path, spec: TextSpec) -> dict[str, np.ndarray]:
    """Text tensors keyed without their prefix, plus ``lm_head.weight`` (the embedding when tied)."""
    files = TensorFiles(path)
    prefix = next((p for p in TEXT_PREFIXES if f"{p}embed_tokens.weight" in files), None)
    if prefix is None:
        raise CheckpointError(
            f"checkpoint {path} has no text embedding (model.language_model.embed_tokens.weight)",
            "use a full Qwen3-VL checkpoint to follow the prompt past the vision tower",
        )
    shapes = text_shapes(spec)
    shapes["lm_head.weight"] = (spec.vocab_size, spec.hidden_size)
    keys = {name: prefix + name for name in shapes}
    keys["lm_head.weight"] = prefix + "embed_tokens.weight" if spec.tie_word_embeddings else "lm_head.weight"
    return _read(files, keys, shapes, f"{spec.layers} text layers")
