"""What mlx-vlm 0.7.10's Molmo2 port cannot represent, each limit checked before loading and named by its
setting (the port is the limit there, not config.json; the MLX runtime says so and the run goes on without it).

- a selected ViT layer at or past the 25 it builds (it caps the hub's 27 declared layers at 25);
- a checkpoint storing fewer ViT layers than it builds (``min(declared, 25)``: it loads every one strictly);
- ``text_config.qk_norm_type`` other than ``qwen3`` (its decoder norms q and k per head only), with
  ``use_qk_norm``;
- ``text_config.norm_after`` (its decoder layers normalize each sublayer's input only: pre-norm).
"""

from __future__ import annotations

import re
from pathlib import Path

from .config import read_facts

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
