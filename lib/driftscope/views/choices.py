"""Exact per-token choices (a router's, in a mixture-of-experts model) on notebook 01's and 02's pages.

A token whose router picked other experts than the reference's is a finding of its own: from there on the two
runtimes compute different functions of that token. The family finds them (its view hook ``rerouted(reference,
candidate)``: per sparse layer, the tokens routed differently, how many chosen-expert entries differ, and the share
of that layer's expert-mixture error, the squared difference of its output, on those tokens); this module puts
them in words and a table. A family without that hook (no router) gets no section at all.
"""

from __future__ import annotations

import math
from typing import Any

from driftscope.core.markup import code
from driftscope.run.report import Report

from .notebook import plural

INTRO = (
    "Each sparse text layer's router picks its top experts for every token, and the chosen experts are compared "
    "exactly: a token routed to other experts than the reference's is a finding of its own. Per layer: the "
    "tokens routed differently, how many chosen-expert entries differ (the exact comparison of the choice, sorted "
    "by expert id), and the share of that layer's expert-mixture error (the squared difference of its output) "
    "that sits on those tokens: near 100% means the rerouting is the layer's error. After the first rerouted "
    "layer, later layers' inputs have moved already."
)


def _finder(report: Report):
    from driftscope.families import get_family
    from driftscope.families.capabilities import HooksCapabilities, capabilities_of

    try:
        return capabilities_of(get_family(report.data["family"]).view_hooks(), HooksCapabilities).rerouted
    except Exception:  # noqa: BLE001 - a report of an unknown family has no routing section
        return None


def _sparse_layers(reference, candidate) -> tuple[int, int]:
    """(sparse layers both captures hold, tokens per layer)."""
    stages = [s for s in reference.stage_ids() if s.endswith(".mlp.chosen") and s in candidate]
    tokens = int(reference[stages[0]].shape[0]) if stages else 0
    return len(stages), tokens


def choice_rows(report: Report, pairs: list[str] | None = None) -> tuple[list[dict], list[str]]:
    """The rerouted layers of each pair (table rows) and a line per pair routed like the reference throughout
    (or whose captures hold no router choice)."""
    finder = _finder(report)
    rows: list[dict] = []
    lines: list[str] = []
    if finder is None:
        return rows, lines
    for pair in pairs or report.pair_keys():
        try:
            reference, candidate = report.pair_tapsets(pair)
        except Exception:  # noqa: BLE001 - a pair that could not run has no captures to read
            continue
        layers, tokens = _sparse_layers(reference, candidate)
        if not layers:
            lines.append(f"- {code(pair)}: no router choice captured on both sides")
            continue
        found = finder(reference, candidate)
        if not found:
            lines.append(
                f"- {code(pair)}: every token chose the reference's experts in {plural(layers, 'sparse layer')}"
            )
            continue
        for position, layer in enumerate(found):
            shown = ", ".join(map(str, layer.tokens[:8])) + (", ..." if len(layer.tokens) > 8 else "")
            rows.append(
                {
                    "pair": pair,
                    "text layer": layer.layer,
                    "tokens rerouted": f"{len(layer.tokens)} of {tokens}",
                    "positions": shown,
                    "chosen entries differing": layer.entries,
                    "share of the layer's error": "not captured"
                    if math.isnan(layer.explained)
                    else f"{layer.explained:.0%}",
                    "where": "first rerouted layer" if position == 0 else "inputs already moved",
                }
            )
    return rows, lines


def choice_items(report: Report, pairs: list[str] | None = None) -> list[Any]:
    """The page's router section (heading, what it shows, the per-pair lines, the table); empty for a model
    without a router."""
    if _finder(report) is None:
        return []
    import pandas as pd
    from IPython.display import Markdown

    from .notebook import table

    rows, lines = choice_rows(report, pairs)
    items: list[Any] = [Markdown("## Router choices\n\n" + INTRO + ("\n\n" + "\n".join(lines) if lines else ""))]
    if rows:
        items.append(table(pd.DataFrame(rows), highlight=None))
    return items
