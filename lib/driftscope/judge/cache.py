"""The KV cache, per decoder layer and head: each runtime's keys (after RoPE) and values of every position at the end
of the prefill (``text.cache.prefill.*``) and after the last teacher-forced step (``text.cache.forced.*``: prompt
plus the reference's tokens, the same inputs in every runtime), ``[layers, kv_heads, positions, head_dim]``.

Per stage, layer and head: the relative L-inf error ``max|c - r| / max|r|`` and relative L2 error ``||c - r|| /
||r||``, and the first position whose error breaks the stage's contract tolerance (an element with ``|c - r| >
atol + rtol * |r|``, or a non-finite value the reference lacks). A position at or past the prompt length was
written by decode step ``position - prompt length + 1`` (the call that fed the answer's token there); one before
it by step 0, the prefill (``STEPS``: the one step numbering of the report). The pair's **first difference** is
the lowest layer whose cache breaks the contract, at its earliest position (and the head there): a decode-only
defect (a wrong position offset, an entry written one slot off, a stale entry) has a clean prefill cache and a
forced one that breaks from the step it starts at.
"""

from __future__ import annotations

import numpy as np

from driftscope.judge.bounds import derived_bound
from driftscope.judge.contract import Contract
from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapSet

PHASES = ("prefill", "forced")
KINDS = ("keys", "values")


#: the one step numbering of the answer (report, pages, docs/tapfile.md): decode calls
STEPS = (
    "step 0 is the prefill (it writes the prompt's cache entries and gives the first token); step i is the i-th "
    "decode call, which feeds token i - 1 at position prompt length + i - 1 and gives logits row i (token i)"
)


def cache_stage(phase: str, kind: str) -> str:
    return f"text.cache.{phase}.{kind}"


def decode_step(position: int, prompt: int) -> int:
    """The step that wrote a cache position (``STEPS``): 0 for the prompt's, ``position - prompt + 1`` after it."""
    return 0 if position < prompt else position - prompt + 1


def _relative(error: np.ndarray, reference: np.ndarray, order) -> float:
    scale = float(np.linalg.norm(reference.reshape(-1), order))
    value = float(np.linalg.norm(error.reshape(-1), order))
    return value / scale if scale > 0 else (0.0 if value == 0 else float("inf"))


def _stage(
    reference: TapSet, candidate: TapSet, stage_id: str, prompt: int, contract: Contract, plan: StagePlan | None
) -> dict:
    shape, other = tuple(reference.shape(stage_id)), tuple(candidate.shape(stage_id))
    if shape != other or len(shape) != 4:
        return {"status": "shape_mismatch", "note": f"{list(shape)} vs {list(other)}", "layers": []}
    tolerance = contract.tolerance(stage_id)
    derived = derived_bound(plan[stage_id], reference, candidate) if plan and stage_id in plan else None
    layers = []
    for layer in range(shape[0]):  # a layer at a time, read from disk
        r = np.asarray(reference.rows(stage_id, layer, layer + 1)[0], dtype=np.float64)
        c = np.asarray(candidate.rows(stage_id, layer, layer + 1)[0], dtype=np.float64)
        bad = np.isfinite(r) & ~np.isfinite(c)
        error = np.where(bad, 0.0, np.abs(c - r))
        bound = tolerance.bound(r) + (0.0 if derived is None else derived.rows(r[None], layer)[0])
        breaks = ((error > bound) | bad).any(axis=-1)  # [heads, positions]
        heads = []
        for head in range(shape[1]):
            where = np.flatnonzero(breaks[head])
            first = int(where[0]) if where.size else None
            heads.append(
                {
                    "head": head,
                    "rel_linf": _relative(error[head], r[head], np.inf),
                    "rel_l2": _relative(error[head], r[head], 2),
                    "max_abs": float(error[head].max()) if error[head].size else 0.0,
                    "first_position": first,
                    "first_step": None if first is None else decode_step(first, prompt),
                    "positions_failing": int(where.size),
                }
            )
        failing = [h for h in heads if h["first_position"] is not None]
        first = min(failing, key=lambda h: (h["first_position"], h["head"])) if failing else None
        layers.append(
            {
                "layer": layer,
                "heads": heads,
                "status": "fail" if first else "pass",
                "first_position": None if first is None else first["first_position"],
                "first_step": None if first is None else first["first_step"],
                "first_head": None if first is None else first["head"],
            }
        )
    return {
        "status": "fail" if any(entry["status"] == "fail" for entry in layers) else "pass",
        "shape": list(shape),
        "tolerance": {"atol": tolerance.atol, "rtol": tolerance.rtol},
        "bound": "contract" if derived is None else derived.describe(),
        "layers": layers,
    }


def prompt_length(reference: TapSet) -> int | None:
    """How many positions the prompt fills (the prefill cache's, else the prompt's token count)."""
    stage = cache_stage("prefill", "keys")
    if stage in reference:
        return int(reference.shape(stage)[2])
    if "text.input_ids" in reference:
        return int(np.asarray(reference["text.input_ids"]).size)
    return None


def cache_pair(reference: TapSet, candidate: TapSet, contract: Contract, plan: StagePlan | None = None) -> dict | None:
    """The KV cache comparison of one pair (None when either side has no cache stage); ``plan`` declares which
    stages are rotated (the keys: their position-dependent bound, ``judge.bounds``)."""
    present = [
        cache_stage(p, k)
        for p in PHASES
        for k in KINDS
        if cache_stage(p, k) in reference and cache_stage(p, k) in candidate
    ]
    if not present:
        return None
    prompt = prompt_length(reference) or 0
    stages = {stage_id: _stage(reference, candidate, stage_id, prompt, contract, plan) for stage_id in present}
    first = None  # (layer, position, head, order, stage): the lowest layer that breaks, at its earliest position
    order = {cache_stage(phase, kind): n for n, (phase, kind) in enumerate((p, k) for p in PHASES for k in KINDS)}
    for stage_id, entry in stages.items():
        for layer in entry["layers"]:
            if layer["status"] != "fail":
                continue
            # a tie goes to the prefill's cache (written first), then the keys: execution order, not the alphabet
            key = (layer["layer"], layer["first_position"], layer["first_head"], order[stage_id], stage_id)
            first = key if first is None or key < first else first
    return {
        "status": "fail" if first is not None else "pass",
        "prompt_length": prompt,
        "first_layer": None if first is None else first[0],
        "first_position": None if first is None else first[1],
        "first_step": None if first is None else decode_step(first[1], prompt),
        "first_head": None if first is None else first[2],
        "first_stage": None if first is None else first[4],
        "rule": "a position breaks when an element has |c - r| > atol + rtol * |r| (the stage's contract key; "
        "the keys also allow RoPE's position-dependent round-off, docs/bounds.md)",
        "steps": STEPS,
        "stages": stages,
    }
