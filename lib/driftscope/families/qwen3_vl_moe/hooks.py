"""Qwen3-VL-MoE's view hooks: Qwen3-VL's (the same tower and processor), with the sparse layers' axes sized."""

from __future__ import annotations

from ..capabilities import HooksCapabilities
from ..qwen3_vl import pages as dense
from ..qwen3_vl.pages import (  # noqa: F401 (view hooks of this family)
    geometry_report,
    geometry_sections,
    input_overlay,
    token_layout,
)
from .plan import text_config


def geometry_claims(image_paths: list, checkpoint=None) -> list:
    """Qwen3-VL's answers (the same tower, processor and position table), each naming only the mutations this
    family registers."""
    from dataclasses import replace

    from .mutations import MUTATIONS

    registered = set(MUTATIONS.names())
    return [
        replace(claim, mutations=tuple(name for name in claim.mutations if name in registered))
        for claim in dense.geometry_claims(image_paths, checkpoint)
    ]


def axis_sizes(config: dict, inputs=None) -> dict[str, int | str]:
    """Qwen3-VL's axes, and the router's: ``experts`` and ``top_k``."""
    text = text_config(config)
    sizes = dense.axis_sizes(config, inputs)
    sizes["experts"] = int(text.get("num_experts", text.get("num_local_experts", 0)))
    sizes["top_k"] = int(text.get("num_experts_per_tok", 0))
    return sizes


def shapes_note(config: dict) -> str:
    return dense.shapes_note(config) + "; each sparse layer's router has experts columns and picks top_k per token"


def rerouted(reference, candidate) -> list:
    """The view hook of the router section (``views/choices.py``): per sparse layer, the tokens routed to other
    experts than the reference's and the share of the layer's expert-mixture error on them."""
    from .routing import rerouted as find

    return find(reference, candidate)


CAPABILITIES = HooksCapabilities(rerouted=rerouted)
