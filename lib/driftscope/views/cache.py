"""Notebook 06's KV cache: per candidate, a layer x head heat map of the teacher-forced cache's error (relative
L-inf, keys and values) and the sentence saying which layer's cache first differs, at which decode step and head."""

from __future__ import annotations

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from driftscope.run.report import Report

from .notebook import describe

COLUMNS = 4  # panels per row of the heat map (one per pair)


def _cache_pairs(report: Report) -> list[dict]:
    return [pair for pair in (report.data.get("answer") or {}).get("pairs", []) if pair.get("cache")]


def cache_sentence(pair: dict) -> str:
    """ "layer L's cache first differs at step S (head H)", or that the cache agrees, for one answer pair."""
    cache, who = pair["cache"], f"{pair['candidate']} vs {pair['reference']}"
    if cache["first_layer"] is None:
        return f"{who}: every layer's cache agrees within the contract, prefill and teacher-forced"
    where = "in the prefill (step 0)" if not cache["first_step"] else f"at step {cache['first_step']}"
    stage = cache["first_stage"].rsplit(".", 1)[1]
    return (
        f"{who}: layer {cache['first_layer']}'s cache first differs {where} (head {cache['first_head']}, "
        f"{stage}, position {cache['first_position']})"
    )


def _or(value, instead: str):
    return instead if value is None else value


def cache_frame(report: Report):
    """One row per pair: the sentence, and the first layer, step, head and stage whose cache differs."""
    import pandas as pd

    rows = [
        {
            "pair": f"{pair['candidate']} vs {pair['reference']}",
            "first layer": _or(pair["cache"]["first_layer"], "none"),
            "first step": _or(pair["cache"]["first_step"], ""),
            "head": _or(pair["cache"]["first_head"], ""),
            "stage": _or(pair["cache"]["first_stage"], ""),
            "summary": cache_sentence(pair),
        }
        for pair in _cache_pairs(report)
    ]
    return pd.DataFrame(rows)


def _errors(cache: dict, phase: str) -> np.ndarray | None:
    """[layers, 2 * heads] relative L-inf of ``phase``'s keys then values (None: not captured)."""
    blocks = []
    for kind in ("keys", "values"):
        stage = cache["stages"].get(f"text.cache.{phase}.{kind}")
        if stage is None or not stage["layers"]:
            return None
        blocks.append([[head["rel_linf"] for head in layer["heads"]] for layer in stage["layers"]])
    return np.concatenate([np.array(block, dtype=float) for block in blocks], axis=1)


def cache_heatmap(report: Report, phase: str = "forced") -> Figure:
    """Per pair, the relative L-inf error of each layer (rows) and head (columns: keys, then values) of the
    ``phase`` cache; an x marks a layer and head whose cache breaks the contract."""
    pairs = [pair for pair in _cache_pairs(report) if _errors(pair["cache"], phase) is not None]
    columns = min(max(len(pairs), 1), COLUMNS)
    rows = -(-max(len(pairs), 1) // columns)
    figure = Figure(figsize=(1.5 + 3.2 * columns, 0.6 + 3.0 * rows), layout="constrained")
    grid = figure.subplots(rows, columns, squeeze=False)
    axes = list(grid.ravel())
    for spare in axes[len(pairs) :] if pairs else []:
        spare.set_axis_off()
    image, exact = None, 0
    colours = matplotlib.colormaps["magma"].with_extremes(bad="#ffffff")
    for axis, pair in zip(axes, pairs, strict=False):
        errors = _errors(pair["cache"], phase)
        heads = errors.shape[1] // 2
        exact += int((errors == 0).sum())
        shown = np.log10(np.where(errors == 0, np.nan, np.maximum(errors, 1e-8)))  # 0: exactly equal, white
        image = axis.imshow(shown, aspect="auto", cmap=colours, vmin=-8, vmax=0)
        for kind_index, kind in enumerate(("keys", "values")):
            stage = pair["cache"]["stages"][f"text.cache.{phase}.{kind}"]
            for layer in stage["layers"]:
                for head in layer["heads"]:
                    if head["first_position"] is not None:
                        column = kind_index * heads + head["head"]
                        axis.text(column, layer["layer"], "x", ha="center", va="center", color="#00e0ff")
        axis.set_xticks(range(2 * heads), [f"k{h}" for h in range(heads)] + [f"v{h}" for h in range(heads)],
                        rotation=90 if heads > 3 else 0, fontsize=7 if heads > 3 else 9)  # fmt: skip
        axis.set_yticks(range(errors.shape[0]))  # one tick per decoder layer, never a half layer
        axis.set_ylabel("layer")
        axis.set_xlabel("head (k: keys, v: values)")
        axis.set_title(f"{pair['candidate']} vs {pair['reference']}", fontsize=9)  # one title per pair
    if image is not None:
        equal = f"; white: exactly equal ({exact} layer-heads)" if exact else ""
        figure.colorbar(image, ax=axes, label="log10 relative L-inf")
        figure.suptitle(f"The {phase} KV cache: relative L-inf error from 1e-8 (x: breaks the contract{equal})",
                        fontsize=9)  # fmt: skip
    return describe(figure, f"The {phase} KV cache's relative error per layer and head for {len(pairs)} pairs.")
