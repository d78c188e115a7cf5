"""Molmo2's spec for the compiled path (from config.json) and its weights, checked against it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from driftscope.model.weightfile import TensorFiles

from ....errors import CheckpointError
from ..config import AdapterFacts, TextFacts, VitFacts, read_facts

# The settings the emitter needs: the config facts plus the resolved layers and the execution depth.


@dataclass(frozen=True)
class Molmo2Spec:
    """Hashable (a static argument of the jitted functions)."""

    vit: VitFacts
    adapter: AdapterFacts
    text: TextFacts
    selected_layers: tuple[int, ...]  # resolved against the declared depth, configured order
    execution_depth: int
    image_patch_id: int

    @property
    def pool_dim(self) -> int:
        return self.vit.hidden_size * len(self.selected_layers)

    @classmethod
    def from_config(cls, config: dict) -> Molmo2Spec:
        facts = read_facts(config)
        if facts.text.norm_after or facts.text.qk_norm_type not in ("qwen3", "olmo"):
            raise CheckpointError(
                "the emitter follows pre-norm Molmo2 decoders with qwen3/olmo q/k norms",
                "use a Molmo2 checkpoint with norm_after: false",
            )
        if facts.text.rope_type != "default":
            raise CheckpointError(
                f"the emitter's RoPE is the default one, the config asks for {facts.text.rope_type!r}",
                "use a Molmo2 checkpoint with default rope_parameters",
            )
        if facts.vit.num_heads != facts.vit.num_kv_heads or facts.adapter.num_heads != facts.adapter.num_kv_heads:
            raise CheckpointError(
                "the emitter's ViT and pooler expect as many key/value heads as query heads",
                "use a Molmo2 checkpoint (its ViT and pooler are multi-head, not grouped)",
            )
        return cls(
            vit=facts.vit,
            adapter=facts.adapter,
            text=facts.text,
            selected_layers=facts.selected_layers,
            execution_depth=facts.execution_depth,
            image_patch_id=facts.image_patch_id,
        )


# Weights from the checkpoint's safetensors (the original layout transformers also saves), renamed
# to the emitter's names and checked tensor by tensor against the config.
#
# Only the ViT layers that run (the execution depth) are read. The text decoder's fused projections are
# split: ``att_proj`` into q, k, v rows; ``ff_proj`` into up (first half) and gate (second half); the two
# word-embedding tables are concatenated (base vocabulary, then the additional rows).

VIT = "model.vision_backbone.image_vit."
ADAPTER = "model.vision_backbone."
TEXT = "model.transformer."

_VIT_LAYER = {
    "norm1": "attention_norm",
    "norm2": "ffn_norm",
    "attn.q": "attention.wq",
    "attn.k": "attention.wk",
    "attn.v": "attention.wv",
    "attn.o": "attention.wo",
    "mlp.fc1": "feed_forward.w1",
    "mlp.fc2": "feed_forward.w2",
}


def checkpoint_names(spec: Molmo2Spec) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{emitter name: (checkpoint key, shape)}`` for every tensor read as is."""
    vit, adapter, text = spec.vit, spec.adapter, spec.text
    d, inner, attn = vit.hidden_size, vit.intermediate_size, vit.num_heads * vit.head_dim
    names = {
        "vit.patch_embed.weight": (VIT + "patch_embedding.weight", (d, vit.patch_dim)),
        "vit.patch_embed.bias": (VIT + "patch_embedding.bias", (d,)),
        "vit.pos_embed": (VIT + "positional_embedding", (vit.num_positions, d)),
    }
    shapes = {"norm1": (d,), "norm2": (d,), "attn.q": (attn, d), "attn.k": (attn, d), "attn.v": (attn, d)}
    shapes.update({"attn.o": (d, attn), "mlp.fc1": (inner, d), "mlp.fc2": (d, inner)})
    for layer in range(spec.execution_depth):
        for name, source in _VIT_LAYER.items():
            key = f"{VIT}transformer.resblocks.{layer}.{source}"
            names[f"vit.layers.{layer}.{name}.weight"] = (key + ".weight", shapes[name])
            names[f"vit.layers.{layer}.{name}.bias"] = (key + ".bias", (shapes[name][0],))
    pool_attn = adapter.num_heads * adapter.head_dim
    for name in ("q", "k", "v"):
        names[f"pool.{name}.weight"] = (f"{ADAPTER}image_pooling_2d.w{name}.weight", (pool_attn, spec.pool_dim))
        names[f"pool.{name}.bias"] = (f"{ADAPTER}image_pooling_2d.w{name}.bias", (pool_attn,))
    names["pool.o.weight"] = (f"{ADAPTER}image_pooling_2d.wo.weight", (adapter.hidden_size, pool_attn))
    names["pool.o.bias"] = (f"{ADAPTER}image_pooling_2d.wo.bias", (adapter.hidden_size,))
    a, p = adapter.hidden_size, adapter.intermediate_size
    names["projector.gate.weight"] = (f"{ADAPTER}image_projector.w1.weight", (p, a))
    names["projector.down.weight"] = (f"{ADAPTER}image_projector.w2.weight", (adapter.text_hidden_size, p))
    names["projector.up.weight"] = (f"{ADAPTER}image_projector.w3.weight", (p, a))
    h, hd = text.hidden_size, text.head_dim
    norm = (hd,) if text.qk_norm_type == "qwen3" else None
    for layer in range(text.layers):
        prefix = f"{TEXT}blocks.{layer}."
        names[f"text.layers.{layer}.input_norm.weight"] = (prefix + "attn_norm.weight", (h,))
        names[f"text.layers.{layer}.post_norm.weight"] = (prefix + "ff_norm.weight", (h,))
        names[f"text.layers.{layer}.attn.o.weight"] = (prefix + "self_attn.attn_out.weight", (h, text.num_heads * hd))
        names[f"text.layers.{layer}.mlp.down.weight"] = (prefix + "mlp.ff_out.weight", (h, text.intermediate_size))
        names[f"text.layers.{layer}.attn.q_norm.weight"] = (
            prefix + "self_attn.q_norm.weight",
            norm or (text.num_heads * hd,),
        )
        names[f"text.layers.{layer}.attn.k_norm.weight"] = (
            prefix + "self_attn.k_norm.weight",
            norm or (text.num_kv_heads * hd,),
        )
    names["text.norm.weight"] = (TEXT + "ln_f.weight", (h,))
    names["text.lm_head.weight"] = ("lm_head.weight", (text.vocab_size, h))
    return names


def load_weights(
    path: str | Path, spec: Molmo2Spec, parts: tuple[str, ...] = ("vision", "text")
) -> dict[str, np.ndarray]:
    """``{emitter name: float32 array}``: ``vision`` (the ViT prefix that runs, the pooler and the projector) and
    ``text`` (the decoder; names start with ``text.``)."""
    files = TensorFiles(path)
    note = f" (the execution depth is {spec.execution_depth}: layers {list(spec.selected_layers)} are read)"
    weights = {
        name: files.read_checked(key, shape, note)
        for name, (key, shape) in checkpoint_names(spec).items()
        if ("text" if name.startswith("text.") else "vision") in parts
    }
    if "text" in parts:
        weights.update(_text_weights(files, spec))
    return {name: np.ascontiguousarray(value) for name, value in weights.items()}


def _text_weights(files: TensorFiles, spec: Molmo2Spec) -> dict[str, np.ndarray]:
    """The decoder's fused projections split, and the two word-embedding tables joined."""
    weights = {}
    text = spec.text
    h, hd = text.hidden_size, text.head_dim
    q_rows, kv_rows = text.num_heads * hd, text.num_kv_heads * hd
    for layer in range(text.layers):
        prefix = f"{TEXT}blocks.{layer}."
        fused = files.read_checked(prefix + "self_attn.att_proj.weight", (q_rows + 2 * kv_rows, h))
        weights[f"text.layers.{layer}.attn.q.weight"] = fused[:q_rows]
        weights[f"text.layers.{layer}.attn.k.weight"] = fused[q_rows : q_rows + kv_rows]
        weights[f"text.layers.{layer}.attn.v.weight"] = fused[q_rows + kv_rows :]
        if text.qkv_bias:
            bias = files.read_checked(prefix + "self_attn.att_proj.bias", (q_rows + 2 * kv_rows,))
            weights[f"text.layers.{layer}.attn.q.bias"] = bias[:q_rows]
            weights[f"text.layers.{layer}.attn.k.bias"] = bias[q_rows : q_rows + kv_rows]
            weights[f"text.layers.{layer}.attn.v.bias"] = bias[q_rows + kv_rows :]
        ff = files.read_checked(prefix + "mlp.ff_proj.weight", (2 * text.intermediate_size, h))
        weights[f"text.layers.{layer}.mlp.up.weight"] = ff[: text.intermediate_size]
        weights[f"text.layers.{layer}.mlp.gate.weight"] = ff[text.intermediate_size :]
    base = files.read_checked(TEXT + "wte.embedding", None)
    extra = files.read_checked(TEXT + "wte.new_embedding", None)
    rows = text.vocab_size + text.additional_vocab_size
    if base.shape[0] + extra.shape[0] != rows or base.shape[1:] != (h,) or extra.shape[1:] != (h,):
        raise CheckpointError(
            f"word embeddings have {base.shape[0]} + {extra.shape[0]} rows of width {base.shape[1]}, "
            f"the config implies {text.vocab_size} + {text.additional_vocab_size} of {h}",
            "the weights and config.json disagree: re-save the checkpoint or fix the config",
        )
    weights["text.embed.weight"] = np.concatenate([base, extra])
    return weights
