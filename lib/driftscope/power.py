"""Fixture power: would this run have caught a real defect? Run every mutation against the oracle."""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from .compare import ComparisonRow, compare_tapsets, first_divergence
from .contract import Contract
from .families import get_family
from .families.base import Mutation
from .inputs import ModelInputs
from .runtimes import get_runtime
from .runtimes.base import Runtime
from .stages import StagePlan
from .tapset import TapSet


def mutated_runtime(checkpoint, policy: str, mutation: Mutation) -> Runtime:
    """The family's mutation runtime with ``mutation`` installed (its label says which): the model changed at
    load, its ``during`` context active for the whole capture (vision and text), its inputs (a processor
    defect) in place of the run's."""
    base = get_runtime(get_family(checkpoint.family).mutation_runtime)

    class Mutated(base):
        def _load(self) -> Any:
            model = super()._load()
            if mutation.install is not None:
                mutation.install(model, dict(mutation.settings))
            return model

        def capture(self, inputs, plan, out_base, progress=None) -> TapSet:
            if mutation.inputs is not None:
                inputs = mutation.inputs(self.checkpoint, inputs, dict(mutation.settings))
            self.load()
            with ExitStack() as stack:
                if mutation.during is not None:
                    stack.enter_context(mutation.during(self.model, dict(mutation.settings)))
                return super().capture(inputs, plan, out_base, progress)

    return Mutated(checkpoint, policy, None, {"label": f"{base.name}:{policy}+{mutation.name}"})


def _margin(rows: list[ComparisonRow]) -> float:
    """The worst element's |a - e| over its tolerance, across all float stages (>= 1 means detected)."""
    worst = 0.0
    for row in rows:
        if row.integer:
            if row.failures:
                return float("inf")
            continue
        if row.status not in ("pass", "fail"):
            continue
        bound = row.atol + row.rtol * abs(row.max_reference_value or 0.0)
        if bound > 0:
            worst = max(worst, row.max_abs / bound)
    return worst


def fixture_power(
    reference: TapSet,
    checkpoint,
    inputs: ModelInputs,
    plan: StagePlan,
    contract: Contract,
    out_dir: Path,
    names: list[str] | None = None,
    policy: str = "f32",
    log=None,
) -> dict:
    """Per mutation: detected, first divergence, the declared stage, whether they match, the margin, why blind."""
    family = get_family(checkpoint.family)
    mutations = family.mutation_registry()
    results = []
    for name in names or mutations.names():
        mutation = mutations.get(name)
        runtime = mutated_runtime(checkpoint, policy, mutation)
        start = time.perf_counter()
        tapset = runtime.capture(inputs, plan, Path(out_dir) / name)
        rows = compare_tapsets(reference, tapset, contract, plan)
        first = first_divergence(rows)
        declared = mutation.declared_stage(plan)
        blind = mutation.blind(inputs, plan)
        margin = _margin(rows)
        detected = first is not None
        reason = None
        if not detected:
            reason = blind or (
                f"the defect stays inside the contract on this fixture (worst element at {margin:.2g} of its tolerance)"
            )
        results.append(
            {
                "mutation": name,
                "description": mutation.description,
                "detected": detected,
                "first_divergence": first.stage if first else None,
                "declared_stage": declared,
                "at_declared_stage": bool(first and first.stage == declared),
                "margin": margin,
                "blind_reason": reason,
                "tapset": str(tapset.tensor_path),
                "rows": [
                    {"stage": r.stage, "max_abs": r.max_abs, "rms": r.rms, "failures": r.failures, "status": r.status}
                    for r in rows
                ],
                "seconds": time.perf_counter() - start,
            }
        )
        if log:
            log(f"  mutation {name}: " + (f"detected at {first.stage}" if detected else f"NOT detected ({reason})"))
    return {"runtime": f"{family.mutation_runtime}:{policy}", "mutations": results}


def power_gate(power: dict, required: list[str]) -> list[str]:
    """Reasons the run must fail because its fixture cannot detect a required mutation."""
    by_name = {m["mutation"]: m for m in power["mutations"]}
    reasons = []
    for name in required:
        entry = by_name.get(name)
        if entry is None:
            reasons.append(f"required mutation {name!r} was not run")
        elif not entry["detected"]:
            reasons.append(f"the fixture cannot detect {name}: {entry['blind_reason']}")
    return reasons
