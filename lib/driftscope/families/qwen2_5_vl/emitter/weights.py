"""Vision weights from the checkpoint's safetensors, checked tensor by tensor against the config."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from driftscope.model.weightfile import TensorFiles

from ....errors import CheckpointError
from .config import VisionSpec

PREFIXES = ("visual.", "model.visual.")  # transformers 5 saves the legacy "visual." keys


def expected_shapes(spec: VisionSpec) -> dict[str, tuple[int, ...]]:
    """Every vision tensor the emitter reads, by its name under the ``visual.`` prefix."""
    d, i, merged = spec.hidden_size, spec.intermediate_size, spec.hidden_size * spec.merge_unit
    p, t, c = spec.patch_size, spec.temporal_patch_size, spec.in_channels
    shapes = {"patch_embed.proj.weight": (d, c, t, p, p)}
    for b in range(spec.depth):
        shapes.update(
            {
                f"blocks.{b}.norm1.weight": (d,),
                f"blocks.{b}.norm2.weight": (d,),
                f"blocks.{b}.attn.qkv.weight": (3 * d, d),
                f"blocks.{b}.attn.qkv.bias": (3 * d,),
                f"blocks.{b}.attn.proj.weight": (d, d),
                f"blocks.{b}.attn.proj.bias": (d,),
                f"blocks.{b}.mlp.gate_proj.weight": (i, d),
                f"blocks.{b}.mlp.gate_proj.bias": (i,),
                f"blocks.{b}.mlp.up_proj.weight": (i, d),
                f"blocks.{b}.mlp.up_proj.bias": (i,),
                f"blocks.{b}.mlp.down_proj.weight": (d, i),
                f"blocks.{b}.mlp.down_proj.bias": (d,),
            }
        )
    shapes.update(
        {
            "merger.ln_q.weight": (d,),
            "merger.mlp.0.weight": (merged, merged),
            "merger.mlp.0.bias": (merged,),
            "merger.mlp.2.weight": (spec.out_hidden_size, merged),
            "merger.mlp.2.bias": (spec.out_hidden_size,),
        }
    )
    return shapes


def load_vision_weights(path: str | Path, spec: VisionSpec) -> dict[str, np.ndarray]:
    """``{name: aligned float32 array}`` for every vision tensor; a missing or misshapen tensor is named."""
    files = TensorFiles(path)
    prefix = next((p for p in PREFIXES if any(name.startswith(p) for name in files.names())), None)
    if prefix is None:
        raise CheckpointError(
            f"checkpoint {path} has no vision tensors (no key starts with {PREFIXES})",
            "use a Qwen2.5-VL checkpoint that includes the vision tower",
        )
    weights: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes(spec).items():
        weights[name] = files.read_checked(prefix + name, shape, f" (the config's depth is {spec.depth})")
    return weights
