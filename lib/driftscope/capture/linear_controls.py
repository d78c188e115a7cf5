"""Same-input controls for quantized linears, next to the stage replay.

Every planned stage that is one linear layer's output (the family's ``QuantProfile.linears``) is replayed twice on
the reference's own input to the layer: through MLX's fused quantized matmul and as a dense matmul with the same
codes dequantized (:func:`~driftscope.capture.linear_replay.replay_linear`). With the stage replay's label
(introduced, inherited, ...) this says whether a block's error is introduced by the fused kernel, by the
activation dtype, or inherited. The rows do not depend on the contract; :func:`linear_verdict` joins them with the
replay's labels (and is re-run when a report is re-judged).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from driftscope.capture.linear_replay import LinearReplay, layer_of, replay_linear

if TYPE_CHECKING:
    from driftscope.families.base import Family
    from driftscope.taps.stages import StagePlan
    from driftscope.taps.tapset import TapSet

#: what a linear's own label and its stage's replay label say together
CAUSES = {
    "fused kernel": "the fused kernel",
    "activation dtype": "the activation dtype (the dequantized path errs as much)",
    "fused kernel + activation dtype": "the fused kernel and the activation dtype together",
    "none": "neither (this linear adds only float32 round-off)",
}


def replay_linears(model: Any, family: Family, reference: TapSet, plan: StagePlan, activations: str) -> dict:
    """Each quantized linear of ``plan`` fused and dequantized on ``reference``'s input; layers left dense listed."""
    profile = family.quant_profile()
    ctx = family.replay_context(reference, plan)
    modules = dict(model.named_modules())
    rows, dense = [], []
    for stage in plan:
        site = profile.linears(stage.id)
        needs = family.replay_inputs(stage.id, plan) if site is not None else None
        if site is None or not needs or len(needs) != 1 or stage.id not in reference:
            continue
        module = modules.get(site.module)
        if module is None:
            raise KeyError(f"the family's linear {site.module!r} (stage {stage.id}) is not a module of the model")
        if "scales" not in module:  # a layer the checkpoint or the group size left dense
            dense.append({"stage": stage.id, "module": site.module})
            continue
        x = ctx.stage(reference, needs[0])
        if x is None:
            continue
        tensor, bias = layer_of(module)
        expected = np.asarray(reference[stage.id], dtype=np.float32)
        both = replay_linear(np.asarray(x).reshape(-1, tensor.shape[-1]), tensor, bias, activations, name=site.module)
        replay = LinearReplay(
            site.module,
            both.activations,
            site.stage_value(both.fused, expected.shape),
            site.stage_value(both.dequantized, expected.shape),
            expected,
        )
        rows.append({"stage": stage.id, "module": site.module, **replay.to_dict()})
    return {"activations": activations, "rows": rows, "dense": dense}


def linear_verdict(controls: dict, labels: Sequence[dict], candidate: str) -> dict:
    """``controls`` with each row's stage label (from the stage replay) and the verdict line; a new dict."""
    by_stage = {label["stage"]: label["label"] for label in labels}
    rows = [dict(row, stage_label=by_stage.get(row["stage"])) for row in controls.get("rows", [])]
    introduced = [row for row in rows if row["stage_label"] == "introduced"]
    fused = next((row for row in introduced if row["label"].startswith("fused kernel")), None)
    if fused is not None:
        verdict = (
            f"{candidate}: the first quantized linear whose error is introduced is {fused['module']} "
            f"({fused['stage']}), by {CAUSES[fused['label']]}: on the reference's input the fused path is "
            f"{fused['fused_vs_dequantized']:.2g} (relative RMS) from the dequantized one, which is "
            f"{fused['dequantized_vs_reference']:.2g} from the reference"
        )
    elif introduced:
        first = introduced[0]
        verdict = f"{candidate}: {first['stage']} introduces error, by {CAUSES[first['label']]}"
    elif rows:
        verdict = f"{candidate}: no quantized linear introduces error ({len(rows)} replayed fused and dequantized)"
    else:
        verdict = f"{candidate}: no planned stage is a quantized linear's output (plan substages to replay them)"
    first_fused = next((row["stage"] for row in rows if row["label"] == "fused kernel"), None)
    return {**controls, "rows": rows, "first_fused_kernel": first_fused, "verdict": verdict}
