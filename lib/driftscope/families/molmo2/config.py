"""Molmo2 config facts, read the same way from the hub layout and transformers' native layout; what mlx-vlm
0.7.10's port reads of them (``mlx_config``) and cannot represent (``unrepresentable``)."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path

from ...errors import CheckpointError

# Molmo2 config facts, read the same way from the hub layout and transformers' native layout.
#
# Hub layout (allenai's config.json): top-level ``vit_config`` / ``adapter_config`` with the original
# key names; ``vit_config`` declares 27 layers and ``adapter_config.vit_layers`` is ``[-3, -9]``. These
# are authoritative over a ``vision_config`` (mlx-vlm inserts an empty one as a compatibility object).
# Native layout (transformers 5.24 ``save_pretrained``): ``vision_config`` / ``adapter_config`` with
# ``vision_feature_layer``. Negative layer indices resolve against the DECLARED depth ([-3, -9] of 27
# -> [24, 18]); the execution depth is the largest selected layer + 1 (the checkpoint persists only that
# prefix); the configured order is kept when the selected layers are concatenated.
#
# ``mlx_config`` adapts either layout to what mlx-vlm 0.7.10 reads, passing the configured layers
# through unchanged (so mlx-vlm's own resolution, right or wrong, is what runs); ``mlx.load_mlx_model``
# builds mlx-vlm's Molmo2 ``Model`` from a checkpoint.


@dataclass(frozen=True)
class VitFacts:
    hidden_size: int
    intermediate_size: int
    declared_depth: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    patch_size: int
    num_positions: int
    image_size: tuple[int, int]
    hidden_act: str
    eps: float

    @property
    def patch_dim(self) -> int:
        return self.patch_size * self.patch_size * 3

    @property
    def position_grid(self) -> int:
        """Side of the learned position-embedding grid (27 for 729 positions)."""
        side = int(round(self.num_positions**0.5))
        if side * side != self.num_positions:
            raise CheckpointError(
                f"ViT num_position_embeddings {self.num_positions} is not a square grid",
                "check vit_config.image_num_pos / vision_config.num_position_embeddings",
            )
        return side


@dataclass(frozen=True)
class AdapterFacts:
    hidden_size: int
    intermediate_size: int
    text_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_act: str
    configured_layers: tuple[int, ...]


@dataclass(frozen=True)
class TextFacts:
    hidden_size: int
    intermediate_size: int
    layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    additional_vocab_size: int
    rope_theta: float
    rope_type: str
    eps: float
    qkv_bias: bool
    qk_norm_type: str
    norm_after: bool


@dataclass(frozen=True)
class Molmo2Facts:
    layout: str  # "hub" | "native"
    vit: VitFacts
    adapter: AdapterFacts
    text: TextFacts
    image_patch_id: int
    tie_word_embeddings: bool

    @property
    def selected_layers(self) -> tuple[int, ...]:
        """The configured ``vit_layers`` resolved against the declared depth, in configured order."""
        return resolve_layers(self.adapter.configured_layers, self.vit.declared_depth)

    @property
    def execution_depth(self) -> int:
        """ViT layers that run: up to the deepest selected one."""
        return max(self.selected_layers) + 1


def resolve_layers(layers: tuple[int, ...], depth: int) -> tuple[int, ...]:
    """Negative indices count from ``depth``; every index must name one of ``depth`` layers."""
    bad = [layer for layer in layers if not -depth <= layer < depth]
    if bad or not layers:
        raise CheckpointError(
            f"vit_layers {list(layers)} do not index a {depth}-layer ViT",
            "fix adapter_config.vit_layers (or vision_feature_layer) in config.json",
        )
    return tuple(layer % depth for layer in layers)


def layout_of(config: dict) -> str:
    """``hub`` when top-level ``vit_config`` is present (authoritative), else ``native``."""
    if config.get("vit_config"):
        return "hub"
    if config.get("vision_config"):
        return "native"
    raise CheckpointError(
        "config.json has neither vit_config (hub layout) nor vision_config (transformers layout)",
        "use a Molmo2 checkpoint from the hub or saved by transformers' save_pretrained",
    )


def read_facts(config: dict) -> Molmo2Facts:
    """The config facts of a Molmo2 checkpoint config (either layout)."""
    layout = layout_of(config)
    adapter = dict(config.get("adapter_config") or {})
    text = dict(config.get("text_config") or {})
    if layout == "hub":
        v = dict(config["vit_config"])
        vit = VitFacts(
            hidden_size=int(v.get("hidden_size", 1152)),
            intermediate_size=int(v.get("intermediate_size", 4304)),
            declared_depth=int(v.get("num_hidden_layers", 27)),
            num_heads=int(v.get("num_attention_heads", 16)),
            num_kv_heads=int(v.get("num_key_value_heads", 16)),
            head_dim=int(v.get("head_dim", 72)),
            patch_size=int(v.get("image_patch_size", 14)),
            num_positions=int(v.get("image_num_pos", 729)),
            image_size=tuple(v.get("image_default_input_size", (378, 378))),
            hidden_act=str(v.get("hidden_act", "gelu_pytorch_tanh")),
            eps=float(v.get("layer_norm_eps", 1e-6)),
        )
        layers = adapter.get("vit_layers", [-3, -9])
    else:
        v = dict(config["vision_config"])
        image_size = tuple(v.get("image_size") or (378, 378))
        patch = int(v.get("patch_size", 14))
        vit = VitFacts(
            hidden_size=int(v.get("hidden_size", 1152)),
            intermediate_size=int(v.get("intermediate_size", 4304)),
            declared_depth=int(v.get("num_hidden_layers", 25)),
            num_heads=int(v.get("num_attention_heads", 16)),
            num_kv_heads=int(v.get("num_key_value_heads", 16)),
            head_dim=int(v.get("head_dim", 72)),
            patch_size=patch,
            num_positions=int(v.get("num_position_embeddings") or (image_size[0] // patch) * (image_size[1] // patch)),
            image_size=image_size,
            hidden_act=str(v.get("hidden_act", "gelu_pytorch_tanh")),
            eps=float(v.get("layer_norm_eps", 1e-6)),
        )
        layers = adapter.get("vision_feature_layer", adapter.get("vit_layers", [24, 18]))
    if vit.hidden_act != "gelu_pytorch_tanh":
        raise CheckpointError(
            f"ViT hidden_act {vit.hidden_act!r} is not Molmo2's", "Molmo2's ViT uses gelu_pytorch_tanh"
        )
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    facts = Molmo2Facts(
        layout=layout,
        vit=vit,
        adapter=AdapterFacts(
            hidden_size=int(adapter.get("hidden_size", 1152)),
            intermediate_size=int(adapter.get("intermediate_size", 18944)),
            text_hidden_size=int(adapter.get("text_hidden_size", text.get("hidden_size", 3584))),
            num_heads=int(adapter.get("num_attention_heads", 16)),
            num_kv_heads=int(adapter.get("num_key_value_heads", 16)),
            head_dim=int(adapter.get("head_dim", 72)),
            hidden_act=str(adapter.get("hidden_act", "silu")),
            configured_layers=tuple(int(layer) for layer in layers),
        ),
        text=TextFacts(
            hidden_size=int(text.get("hidden_size", 4096)),
            intermediate_size=int(text.get("intermediate_size", 12288)),
            layers=int(text.get("num_hidden_layers", 36)),
            num_heads=int(text.get("num_attention_heads", 32)),
            num_kv_heads=int(text.get("num_key_value_heads", 8)),
            head_dim=int(text.get("head_dim", 128)),
            vocab_size=int(text.get("vocab_size", 151936)),
            additional_vocab_size=int(text.get("additional_vocab_size", 128)),
            rope_theta=float(rope.get("rope_theta", text.get("rope_theta", 1e6))),
            rope_type=str(rope.get("rope_type", rope.get("type", "default"))),
            eps=float(text.get("rms_norm_eps", text.get("layer_norm_eps", 1e-6))),
            qkv_bias=bool(text.get("attention_bias", text.get("qkv_bias", False))),
            qk_norm_type=str(text.get("qk_norm_type", "qwen3")),
            norm_after=bool(text.get("norm_after", False)),
        ),
        image_patch_id=int(config.get("image_patch_id", 151938)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
    )
    facts.selected_layers  # noqa: B018 - validates the configured layers
    return facts


def mlx_config(config: dict) -> dict:
    """The config mlx-vlm 0.7.10's Molmo2 reads: hub-layout ``vit_config`` / ``adapter_config.vit_layers``
    and text keys ``qkv_bias`` / ``layer_norm_eps`` / ``rope_theta``. Layer indices pass through unchanged."""
    adapted = copy.deepcopy(config)
    facts = read_facts(config)
    if facts.layout == "native":
        vit, adapter = facts.vit, facts.adapter
        adapted["vit_config"] = {
            "model_type": "molmo2",
            "hidden_size": vit.hidden_size,
            "intermediate_size": vit.intermediate_size,
            "num_hidden_layers": vit.declared_depth,
            "num_attention_heads": vit.num_heads,
            "num_key_value_heads": vit.num_kv_heads,
            "head_dim": vit.head_dim,
            "image_patch_size": vit.patch_size,
            "image_num_pos": vit.num_positions,
            "image_default_input_size": list(vit.image_size),
            "hidden_act": vit.hidden_act,
            "layer_norm_eps": vit.eps,
        }
        adapted["adapter_config"] = {
            "model_type": "molmo2",
            "hidden_size": adapter.hidden_size,
            "intermediate_size": adapter.intermediate_size,
            "text_hidden_size": adapter.text_hidden_size,
            "num_attention_heads": adapter.num_heads,
            "num_key_value_heads": adapter.num_kv_heads,
            "head_dim": adapter.head_dim,
            "hidden_act": adapter.hidden_act,
            "vit_layers": list(adapter.configured_layers),
        }
    text = dict(adapted.get("text_config") or {})
    text["qkv_bias"] = facts.text.qkv_bias
    text["layer_norm_eps"] = facts.text.eps
    text["rope_theta"] = facts.text.rope_theta
    rope = dict(text.pop("rope_parameters", None) or {})
    if rope and rope.get("rope_type", "default") != "default":
        text["rope_scaling"] = rope
    adapted["text_config"] = text
    adapted["vision_config"] = {}  # mlx-vlm rebuilds it from vit_config / adapter_config
    return adapted


# What mlx-vlm 0.7.10's Molmo2 port cannot represent, each limit checked before loading and named by its
# setting (the port is the limit there, not config.json; the MLX runtime says so and the run goes on without it).
#
# - a selected ViT layer at or past the 25 it builds (it caps the hub's 27 declared layers at 25);
# - a checkpoint storing fewer ViT layers than it builds (``min(declared, 25)``: it loads every one strictly);
# - ``text_config.qk_norm_type`` other than ``qwen3`` (its decoder norms q and k per head only), with
#   ``use_qk_norm``;
# - ``text_config.norm_after`` (its decoder layers normalize each sublayer's input only: pre-norm).

#: The ViT layers mlx-vlm 0.7.10's Molmo2 builds whatever the config declares (it caps the hub's 27 at 25).
MLX_VIT_LAYERS = 25
#: a stored ViT layer's tensors, in either layout (``...image_vit.transformer.resblocks.N.`` or ``...layers.N.``)
_VIT_LAYER = re.compile(r"(?:image_vit|vision_tower|vision_model).*?\.(?:resblocks|layers)\.(\d+)\.")


def stored_vit_layers(path: str | Path) -> int | None:
    """How many ViT layers the checkpoint's weights hold (the highest stored index + 1; None: none found)."""
    from driftscope.model.weightfile import TensorFiles

    found = [int(m.group(1)) for name in TensorFiles(path).names() for m in [_VIT_LAYER.search(name)] if m]
    return max(found) + 1 if found else None


def unrepresentable(config: dict, path: str | Path | None = None) -> list[str]:
    """The settings of ``config`` (and of the weights at ``path``) mlx-vlm's Molmo2 port cannot represent, each
    naming its key."""
    facts = read_facts(config)
    limits = []
    deep = [layer for layer in facts.selected_layers if layer >= MLX_VIT_LAYERS]
    key = "adapter_config.vit_layers" if facts.layout == "hub" else "vision_feature_layer"
    if deep:
        limits.append(
            f"{key} {list(facts.adapter.configured_layers)} selects layer {', '.join(map(str, deep))} of the "
            f"{facts.vit.declared_depth} declared ViT layers; mlx-vlm's Molmo2 keeps only {MLX_VIT_LAYERS}"
        )
    built = min(facts.vit.declared_depth, MLX_VIT_LAYERS)
    stored = stored_vit_layers(path) if path is not None else None
    if stored is not None and stored < built:
        limits.append(
            f"the weights store {stored} ViT layers (the prefix the selected layers need) where mlx-vlm's Molmo2 "
            f"builds {built} of the {facts.vit.declared_depth} declared and loads every one"
        )
    text = facts.text
    if text.qk_norm_type != "qwen3" and _uses_qk_norm(config):
        limits.append(
            f"text_config.qk_norm_type {text.qk_norm_type!r}: mlx-vlm's Molmo2 decoder norms q and k per head "
            "('qwen3') only"
        )
    if text.norm_after:
        limits.append("text_config.norm_after true: mlx-vlm's Molmo2 decoder layers are pre-norm only")
    return limits


def _uses_qk_norm(config: dict) -> bool:
    text = config.get("text_config") or config.get("llm_config") or config
    return bool(text.get("use_qk_norm", True))
