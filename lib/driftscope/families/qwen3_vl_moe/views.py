"""Qwen3-VL-MoE's view hooks: Qwen3-VL's (the same tower and processor), with the sparse layers' axes sized."""

from __future__ import annotations

from ..qwen3_vl import views as dense
from ..qwen3_vl.views import geometry_report, geometry_sections, input_overlay, token_layout  # noqa: F401
from .plan import text_config


def axis_sizes(config: dict, inputs=None) -> dict[str, int | str]:
    """Qwen3-VL's axes, and the router's: ``experts`` and ``top_k``."""
    text = text_config(config)
    sizes = dense.axis_sizes(config, inputs)
    sizes["experts"] = int(text.get("num_experts", text.get("num_local_experts", 0)))
    sizes["top_k"] = int(text.get("num_experts_per_tok", 0))
    return sizes


def shapes_note(config: dict) -> str:
    return dense.shapes_note(config) + "; each sparse layer's router has experts columns and picks top_k per token"
