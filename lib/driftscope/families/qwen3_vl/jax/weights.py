"""What Qwen3-VL's JAX model reads from a checkpoint: its vision and text specs from config.json, and its
weights, checked tensor by tensor against them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from driftscope.errors import CheckpointError
from driftscope.model.weightfile import TensorFiles

# The vision and text settings the emitter needs, read from a checkpoint's config.json.

#: The vision MLP activations the emitter computes, by the config's ``hidden_act``: approximate (tanh) or not.
GELU_FORMS = {"gelu_pytorch_tanh": True, "gelu": False}


def _section(config: dict, key: str, fix: str) -> dict:
    section = dict(config.get(key) or {})
    if not section:
        raise CheckpointError(f"config.json has no {key}", fix)
    return section


@dataclass(frozen=True)
class VisionSpec:
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    num_position_embeddings: int
    deepstack_visual_indexes: tuple[int, ...]
    rope_theta: float = 10000.0
    hidden_act: str = "gelu_pytorch_tanh"
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size**2

    @property
    def merged_hidden(self) -> int:
        return self.hidden_size * self.merge_unit

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def grid_side(self) -> int:
        return int(round(self.num_position_embeddings**0.5))

    @property
    def tanh_gelu(self) -> bool:
        return GELU_FORMS[self.hidden_act]

    def branch(self, block: int) -> int | None:
        """The DeepStack branch fed by ``block`` (None: that block feeds none)."""
        indexes = self.deepstack_visual_indexes
        return indexes.index(block) if block in indexes else None

    @classmethod
    def from_config(cls, config: dict) -> VisionSpec:
        vision = _section(config, "vision_config", "use a Qwen3-VL checkpoint saved by transformers")
        act = vision.get("hidden_act", "gelu_pytorch_tanh")
        if act not in GELU_FORMS:
            raise CheckpointError(
                f"vision hidden_act {act!r} is not supported by the Qwen3-VL emitter",
                f"use one of {sorted(GELU_FORMS)} (Qwen3-VL checkpoints say gelu_pytorch_tanh)",
            )
        depth = int(vision.get("depth", 27))
        indexes = tuple(int(i) for i in vision.get("deepstack_visual_indexes", (8, 16, 24)))
        if any(not 0 <= i < depth for i in indexes):
            raise CheckpointError(
                f"deepstack_visual_indexes {list(indexes)} reach outside the {depth} vision blocks",
                "fix vision_config.deepstack_visual_indexes or depth",
            )
        rope = vision.get("rope_parameters") or {}
        return cls(
            depth=depth,
            hidden_size=int(vision.get("hidden_size", 1152)),
            num_heads=int(vision.get("num_heads", 16)),
            intermediate_size=int(vision.get("intermediate_size", 4304)),
            out_hidden_size=int(vision.get("out_hidden_size", 3584)),
            in_channels=int(vision.get("in_channels", 3)),
            patch_size=int(vision.get("patch_size", 16)),
            temporal_patch_size=int(vision.get("temporal_patch_size", 2)),
            spatial_merge_size=int(vision.get("spatial_merge_size", 2)),
            num_position_embeddings=int(vision.get("num_position_embeddings", 2304)),
            deepstack_visual_indexes=indexes,
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            hidden_act=act,
        )


@dataclass(frozen=True)
class TextSpec:
    layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float
    mrope_section: tuple[int, ...]  # always interleaved: transformers and mlx-vlm ignore mrope_interleaved
    eps: float
    tie_word_embeddings: bool

    @classmethod
    def from_config(cls, config: dict) -> TextSpec:
        text = _section(config, "text_config", "use a full Qwen3-VL checkpoint to follow the prompt past the tower")
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        heads = int(text["num_attention_heads"])
        return cls(
            layers=int(text["num_hidden_layers"]),
            hidden_size=int(text["hidden_size"]),
            num_heads=heads,
            num_kv_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=int(text.get("head_dim") or int(text["hidden_size"]) // heads),
            intermediate_size=int(text["intermediate_size"]),
            vocab_size=int(text["vocab_size"]),
            rope_theta=float(rope.get("rope_theta", text.get("rope_theta", 5e6))),
            mrope_section=tuple(int(s) for s in rope.get("mrope_section", (24, 20, 20))),
            eps=float(text.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        )


# Vision and text weights from the checkpoint's safetensors, checked tensor by tensor against the config.

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
