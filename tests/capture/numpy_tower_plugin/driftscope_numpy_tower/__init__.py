"""A NumPy reference of the Qwen2.5-VL vision tower as a driftscope runtime: the minimum a runtime implements.

Written from the model's definition (patch embedding, 2D rotary, window and full attention, SwiGLU MLP, the 2x2
merger) in float64 NumPy, rounded to float32 where it hands a stage over; the window order and the rotary
positions come from driftscope's own integer geometry.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from driftscope.capture.runtimes.base import Runtime, package_versions
from driftscope.families.qwen2_5_vl.geometry import window_layout
from driftscope.families.qwen_shared.grids import cu_seqlens, position_ids
from safetensors.numpy import load_file

_erf = np.vectorize(math.erf)


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def _linear(x: np.ndarray, weights: dict, name: str) -> np.ndarray:
    out = x @ weights[f"{name}.weight"].T
    return out + weights[f"{name}.bias"] if f"{name}.bias" in weights else out


def _rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Softmax attention inside each segment ``bounds[i]:bounds[i+1]``; q, k, v ``[tokens, heads, head_dim]``."""
    out = np.zeros_like(q)
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        qs, ks, vs = (a[start:end].transpose(1, 0, 2) for a in (q, k, v))
        scores = qs @ ks.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        out[start:end] = ((scores / scores.sum(-1, keepdims=True)) @ vs).transpose(1, 0, 2)
    return out


class NumpyRuntime(Runtime):
    """Qwen2.5-VL's vision tower in NumPy (float32 policy only; no text side, no single-stage replay)."""

    name = "numpy"
    policies = ("f32",)
    REQUIRES = {"numpy": "numpy", "safetensors": "safetensors"}

    def _load(self) -> dict:
        path = Path(self.checkpoint.path)
        weights: dict[str, np.ndarray] = {}
        for file in sorted(path.glob("*.safetensors")):
            weights.update(load_file(str(file)))
        prefix = next(name.split("patch_embed")[0] for name in weights if "patch_embed" in name)
        self.vision = json.loads((path / "config.json").read_text())["vision_config"]
        return {k.removeprefix(prefix): v.astype(np.float64) for k, v in weights.items() if k.startswith(prefix)}

    def versions(self) -> dict[str, str]:
        return package_versions("numpy", "safetensors")

    def _capture(self, inputs, sink) -> None:
        self.put_inputs(inputs, sink)
        w, cfg = self.model, self.vision
        grid = np.asarray(inputs.arrays["grid_thw"]).reshape(-1, 3)
        merge = int(cfg["spatial_merge_size"])
        unit = merge * merge
        heads = int(cfg["num_heads"])

        def put(stage_id: str, value: np.ndarray) -> None:
            if sink.wants(stage_id):
                sink.put(stage_id, np.asarray(value, dtype=value.dtype if value.dtype.kind == "i" else np.float32))

        pixels = np.asarray(inputs.arrays["pixel_values"], dtype=np.float64)
        kernel = w["patch_embed.proj.weight"]
        x = pixels.reshape(len(pixels), -1) @ kernel.reshape(len(kernel), -1).T
        put("vision.patch_embed", x)

        head_dim = x.shape[1] // heads
        dim = head_dim // 2
        inv_freq = 1.0 / (cfg.get("rope_parameters", {}).get("rope_theta", 10000.0) ** (np.arange(0, dim, 2) / dim))
        positions = position_ids(grid, merge)
        angles = (positions[..., None] * inv_freq).reshape(len(positions), -1)  # [patches, head_dim / 2]
        emb = np.concatenate([angles, angles], axis=-1)
        put("vision.rotary.cos", np.cos(emb))
        put("vision.rotary.sin", np.sin(emb))

        layout = window_layout(grid, merge, int(cfg["window_size"]), int(cfg["patch_size"]))
        order, windows, full = layout.window_index, layout.cu_window_seqlens, cu_seqlens(grid)
        put("vision.window_index", order)
        sink.put_bounds("vision.cu_window_seqlens", layout.cu_window_seqlens_raw)
        put("vision.cu_seqlens", full)

        def to_window(rows: np.ndarray) -> np.ndarray:
            return rows.reshape(len(order), unit, -1)[order].reshape(rows.shape)

        h, cos, sin = to_window(x), to_window(np.cos(emb))[:, None], to_window(np.sin(emb))[:, None]
        for block in range(int(cfg["depth"])):
            p = f"blocks.{block}."
            bounds = full if block in cfg.get("fullatt_block_indexes", []) else windows
            normed = _rms_norm(h, w[p + "norm1.weight"])
            q, k, v = _linear(normed, w, p + "attn.qkv").reshape(len(h), 3, heads, head_dim).transpose(1, 0, 2, 3)
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            h = h + _linear(_attention(q, k, v, bounds).reshape(len(h), -1), w, p + "attn.proj")
            normed = _rms_norm(h, w[p + "norm2.weight"])
            gate = _linear(normed, w, p + "mlp.gate_proj")
            h = h + _linear(gate / (1 + np.exp(-gate)) * _linear(normed, w, p + "mlp.up_proj"), w, p + "mlp.down_proj")
            put(f"vision.block.{block}", h)

        normed = _rms_norm(h, w["merger.ln_q.weight"])
        put("vision.merger.norm", normed)
        fc1 = _linear(normed.reshape(-1, unit * normed.shape[1]), w, "merger.mlp.0")
        hidden = 0.5 * fc1 * (1 + _erf(fc1 / math.sqrt(2)))  # exact (erf) GELU
        put("vision.merger.hidden", hidden)
        merged = _linear(hidden, w, "merger.mlp.2")
        put("vision.merger.window", merged)
        put("vision.merger", merged[np.argsort(order)])
