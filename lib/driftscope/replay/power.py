"""Fixture power: would this run have caught a real defect? Run every mutation against the oracle."""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from driftscope.capture.runtimes import get_runtime
from driftscope.capture.runtimes.base import Runtime
from driftscope.families import get_family
from driftscope.families.base import Mutation
from driftscope.inputs.processor_output import ModelInputs
from driftscope.judge.compare import ComparisonRow, compare_tapsets, first_divergence
from driftscope.judge.contract import Contract
from driftscope.judge.rows import share_of_tolerance
from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapSet


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


def _margin(rows: list[ComparisonRow]) -> tuple[float, str | None]:
    """The largest share of its tolerance any float stage's worst element uses (>= 1: an element fails), and
    that stage; integer stages, compared exactly, have no tolerance to measure against."""
    judged = [row for row in rows if not row.integer and row.status in ("pass", "fail")]
    if not judged:
        return 0.0, None
    worst = max(judged, key=share_of_tolerance)
    return share_of_tolerance(worst), worst.stage


def _needs_precision(mutation: Mutation, policy: str) -> str | None:
    """Why a precision defect cannot show under ``policy`` (its activations wider than the defect's dtype)."""
    from driftscope.model.policies import get_policy

    if mutation.precision is None:
        return None
    activations = get_policy(policy).activations
    if activations == mutation.precision or activations in ("float16", "bfloat16"):
        return None
    return (
        f"needs a half-precision policy: the defect lives in {mutation.precision} arithmetic, and power.policy "
        f"{policy!r} computes in {activations}, where it is exact (run the audit with power: {{policy: f16}})"
    )


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
    capture=None,
) -> dict:
    """Per mutation: detected, first divergence, the declared stage, whether they match, the margin, why blind.

    ``capture(runtime, inputs, plan, base, mutation) -> TapSet``: how a mutated runtime captures (default its own
    ``capture``; an investigation passes one that reuses cached captures, ``run.refcache``)."""
    family = get_family(checkpoint.family)
    mutations = family.mutation_registry()
    results = []
    for name in names or mutations.names():
        mutation = mutations.get(name)
        runtime = mutated_runtime(checkpoint, policy, mutation)
        start = time.perf_counter()
        base = Path(out_dir) / name
        tapset = (
            runtime.capture(inputs, plan, base) if capture is None else capture(runtime, inputs, plan, base, mutation)
        )
        rows = compare_tapsets(reference, tapset, contract, plan)
        first = first_divergence(rows)
        declared = mutation.declared_stage(plan)
        blind = mutation.blind(inputs, plan) or _needs_precision(mutation, policy)
        margin, margin_stage = _margin(rows)
        detected = first is not None
        reason = None
        if not detected:
            reason = blind or (
                f"the defect stays inside the contract on this fixture (worst element at {margin:.2g} of its tolerance)"
            )
        exact = first is not None and first.integer
        results.append(
            {
                "mutation": name,
                "description": mutation.description,
                "detected": detected,
                "first_divergence": first.stage if first else None,
                "declared_stage": declared,
                "at_declared_stage": bool(first and first.stage == declared),
                "margin": margin,
                "margin_stage": margin_stage,
                # an exact (integer) first divergence: how many of its entries differ, in place of a margin
                "exact_failures": [first.failures, first.elements] if exact else None,
                "blind_reason": reason,
                "tapset": str(tapset.tensor_path),
                "rows": [
                    {
                        "stage": r.stage,
                        "max_abs": r.max_abs,
                        "rms": r.rms,
                        "failures": r.failures,
                        "status": r.status,
                        "tolerance_used": share_of_tolerance(r) if r.status in ("pass", "fail") else None,
                    }
                    for r in rows
                ],
                "seconds": time.perf_counter() - start,
            }
        )
        if log:
            log(f"  mutation {name}: " + (f"detected at {first.stage}" if detected else f"NOT detected ({reason})"))
    return {
        "runtime": f"{family.mutation_runtime}:{policy}",
        # a port with known defects is corrected by their ready patch first: each mutation plants its defect
        # on a port that agrees with the oracle (some by leaving one of those fixes out)
        "patched_with": family.known_defects.get(family.mutation_runtime),
        "mutations": results,
    }


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
