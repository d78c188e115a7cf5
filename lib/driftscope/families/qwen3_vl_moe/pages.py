"""What the generic views ask of Qwen3-VL-MoE: Qwen3-VL's view hooks, the tokens routed to other experts than
the reference's, and the family's sentences on the pages (``PROSE``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from driftscope.taps.tapset import TapSet

from ..capabilities import HooksCapabilities
from ..qwen3_vl import pages as dense
from ..qwen3_vl.pages import (  # noqa: F401 (view hooks of this family)
    geometry_report,
    geometry_sections,
    input_overlay,
    token_layout,
)
from .plan import text_config

# Qwen3-VL-MoE's view hooks: Qwen3-VL's (the same tower and processor), with the sparse layers' axes sized.


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


# A token routed differently is a finding of its own: per sparse layer, the tokens whose chosen experts differ
# between two captures, and how much of that layer's mixture-of-experts error (the squared difference of
# ``text.layer.N.mlp``) sits on those tokens.


@dataclass(frozen=True)
class Rerouted:
    """One sparse layer's routing difference."""

    layer: int
    tokens: tuple[int, ...]  # prompt positions routed to another expert set
    entries: int  # chosen-expert entries that differ
    explained: float  # share of the layer's squared MoE-output error on those tokens (0..1)

    def sentence(self) -> str:
        count = len(self.tokens)
        return (
            f"text layer {self.layer}: {count} token{'' if count == 1 else 's'} routed to other experts "
            f"(positions {', '.join(map(str, self.tokens))}), {self.explained:.0%} of the layer's expert-mixture error"
        )


def rerouted(reference: TapSet, candidate: TapSet) -> list[Rerouted]:
    """Every sparse layer both captures hold where at least one token's chosen experts differ: the view hook of the
    router section (``views/choices.py``), per sparse layer the tokens routed to other experts than the
    reference's and the share of the layer's expert-mixture error on them."""
    found = []
    for stage in reference.stage_ids():
        if not stage.endswith(".mlp.chosen") or stage not in candidate:
            continue
        layer = int(stage.split(".")[2])
        ours, theirs = np.asarray(reference[stage]), np.asarray(candidate[stage])
        moved = np.flatnonzero((ours != theirs).any(axis=-1))
        if not moved.size:
            continue
        output = f"text.layer.{layer}.mlp"
        explained = float("nan")
        if output in reference and output in candidate:
            error = ((np.asarray(reference[output], np.float64) - np.asarray(candidate[output], np.float64)) ** 2).sum(
                -1
            )
            explained = float(error[moved].sum() / error.sum()) if error.sum() > 0 else 0.0
        found.append(Rerouted(layer, tuple(int(t) for t in moved), int((ours != theirs).sum()), explained))
    return found


CAPABILITIES = HooksCapabilities(rerouted=rerouted)


# Qwen3-VL-MoE's sentences on the generic notebook pages (``Family.text``).

PROSE = {
    "inputs": (
        "Drawn over each resized image: its merged-token grid (2x2 patches per token). The tower attends over the "
        "whole image at once; its learned position table is interpolated to this grid."
    ),
    "mutations": (
        "the routing weights left unnormalized over the chosen experts, a DeepStack branch "
        "dropped, nearest-neighbour position-table interpolation"
    ),
    "answer": (
        "the M-RoPE positions, the DeepStack additions at the image slots of the first decoder layers, and in "
        "each sparse layer the router's logits, the experts it chose per token (compared exactly), their "
        "weights and each chosen expert's output"
    ),
}
