"""A token routed differently is a finding of its own: per sparse layer, the tokens whose chosen experts differ
between two captures, and how much of that layer's mixture-of-experts error (the squared difference of
``text.layer.N.mlp``) sits on those tokens."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from driftscope.taps.tapset import TapSet


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
    """Every sparse layer both captures hold where at least one token's chosen experts differ."""
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
