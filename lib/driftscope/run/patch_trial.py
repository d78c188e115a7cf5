"""Change one thing and re-run one cell: capture one block's stages of a runtime pair's candidate again with a
hypothesis patch applied, and compare them with the reference's capture, reusing every capture the run made (a
stage in no block, such as a mask or the positions, is captured alone). A failing run tries each pair's ready patch
this way itself (:mod:`driftscope.run.ready_trial`), so its first screen shows the patch's before and after.

Only the candidate runs again (its model is loaded with the run's own patch, then ``patch``); the reference's
TapSet is the run's own when it holds the block's stages, else they are captured once and kept under
``<run>/recapture/`` for the next call. The run's report is never written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from driftscope.capture.patches import HypothesisPatch, parse_patch
from driftscope.core.names import safe_name
from driftscope.errors import ParameterError
from driftscope.judge.compare import compare_tapsets
from driftscope.judge.contract import Contract
from driftscope.judge.rows import ComparisonRow
from driftscope.run.report import Report
from driftscope.taps.stages import StagePlan, orders_of
from driftscope.taps.tapset import TapSet

FOLDER = "recapture"


@dataclass
class Recapture:
    """One block (or one stage in no block) of a pair captured again: its rows with the patch, and the run's rows
    at the same stages."""

    pair: str
    block: int | None
    patch: str | None
    stages: list[str]
    rows: list[ComparisonRow]
    before: dict[str, ComparisonRow] = field(default_factory=dict)
    tapset: TapSet | None = None
    seconds: float = 0.0

    def markdown(self) -> str:
        """One paragraph: what ran, and the block output's status and tolerance used before and after."""
        from driftscope.core.markup import code, text
        from driftscope.judge.rows import share_of_tolerance

        what = f"with {code(self.patch)}" if self.patch else "with no patch (as the run did)"
        where = f"block {self.block}" if self.block is not None else code(", ".join(self.stages))
        lines = [f"Re-captured {where} of {code(self.pair)} {what} in {self.seconds:.1f} s."]
        failing = [row.stage for row in self.rows if row.failed]
        lines.append(
            f"Failing stages now: {', '.join(code(stage) for stage in failing)}." if failing else "No stage fails now."
        )
        output = self.rows[-1] if self.rows else None
        old = self.before.get(output.stage) if output else None
        if output and old:
            lines.append(
                f"{code(output.stage)}: {text(old.status)} -> **{text(output.status)}**, tolerance used "
                f"{share_of_tolerance(old):.3g} -> {share_of_tolerance(output):.3g}."
            )
        return " ".join(lines)

    def frame(self):
        """Per stage: status, max_abs and share of tolerance used in the run, then with the patch."""
        import pandas as pd

        from driftscope.judge.rows import share_of_tolerance

        records = []
        for row in self.rows:
            old = self.before.get(row.stage)
            records.append(
                {
                    "stage": row.stage,
                    "run: status": old.status if old else "not captured",
                    "run: max |a - e|": old.max_abs if old else None,
                    "run: tolerance used": share_of_tolerance(old) if old and old.status in ("pass", "fail") else None,
                    "patched: status": row.status,
                    "patched: max |a - e|": row.max_abs,
                    "patched: tolerance used": share_of_tolerance(row) if row.status in ("pass", "fail") else None,
                }
            )
        return pd.DataFrame(records)


def _spec(report: Report, label: str) -> dict:
    spec = report.runtime_spec(label)
    if spec is None:
        raise ParameterError(f"the run has no runtime labelled {label!r}", f"use one of {report.pair_keys()}")
    return spec


def _pair(report: Report, pair: str) -> tuple[str, str]:
    for entry in report.data.get("pairs", []):
        if entry["key"] == pair:
            return entry["reference"], entry["candidate"]
    raise ParameterError(f"the run judged no runtime pair {pair!r}", f"use one of {report.pair_keys()}")


def block_plan(plan: StagePlan, block: int) -> StagePlan:
    """The block's stages (its substages and output) and the token-order stages comparing them needs."""
    if not any(stage.block == block for stage in plan):
        raise ParameterError(f"the stage plan has no block {block}", f"use a block from 0 to {plan.depth - 1}")
    return stages_plan(plan, [stage.id for stage in plan if stage.block == block])


def stages_plan(plan: StagePlan, stage_ids: list[str]) -> StagePlan:
    """``stage_ids`` (in the plan's order) and the token-order stages comparing them needs."""
    orders = orders_of(plan).values()
    helpers = {name for order in orders for name in (order.index, order.segments) if name}
    wanted = set(stage_ids)
    kept = [stage for stage in plan if stage.id in wanted or stage.id in helpers]
    return StagePlan(plan.family, kept, plan.depth, dict(plan.meta))


def _focus(plan: StagePlan, wanted: set[str]) -> str:
    """A name for the captured stages' folder: ``block5``, or the one stage's safe name."""
    blocks = {stage.block for stage in plan if stage.id in wanted}
    return f"block{blocks.pop()}" if len(blocks) == 1 and None not in blocks else safe_name("+".join(sorted(wanted)))


@contextlib.contextmanager
def _no_progress_bars():
    """transformers' "Loading weights" bar off (a notebook cell would show it on stderr), then as it was."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _capture(report: Report, label: str, patch: HypothesisPatch | None, plan: StagePlan, inputs, out: Path, log):
    """Capture ``plan`` on ``label``'s runtime (its own patch, then ``patch``) into ``out``."""
    from driftscope.capture.runtimes import get_runtime
    from driftscope.families.checkpoints import open_checkpoint
    from driftscope.families.hypotheses import hypotheses_of

    spec = _spec(report, label)
    checkpoint = open_checkpoint(report.data["checkpoint"], report.data.get("family"))
    own = spec.get("patch")
    runtime = get_runtime(spec["runtime"])(
        checkpoint,
        spec["policy"],
        None if own is None else HypothesisPatch(own["callable"], dict(own.get("kwargs") or {})),
        {**(spec.get("options") or {}), "label": label},
    )
    with _no_progress_bars():
        runtime.load()
    if patch is not None:
        with hypotheses_of(checkpoint.family):
            runtime.model = patch.apply(runtime.model)
    try:
        return runtime.capture(inputs, plan, out, progress=log)
    finally:
        runtime.release()


def _full_plan(report: Report) -> StagePlan:
    """Every stage the checkpoint's family can tap (the run's plan holds only the stages it selected): the vision
    plan, and the text stages too where the run followed a prompt."""
    from driftscope.families import get_family
    from driftscope.families.checkpoints import open_checkpoint

    checkpoint = open_checkpoint(report.data["checkpoint"], report.data.get("family"))
    family = get_family(checkpoint.family)
    full = family.plan_for(checkpoint)
    prompt = (report.data.get("parameters") or {}).get("text")
    if not prompt:
        return full
    text = family.text_stages_for(checkpoint, int(prompt.get("max_new_tokens") or 0))
    return StagePlan(full.family, full.stages + text, full.depth, dict(full.meta))


def _inputs(report: Report):
    """The run's processor output again, checked against the digest every capture of the run recorded."""
    from driftscope.families import get_family
    from driftscope.families.checkpoints import open_checkpoint, prepare_inputs

    checkpoint = open_checkpoint(report.data["checkpoint"], report.data.get("family"))
    recorded_inputs = report.data.get("inputs") or {}
    images = [Path(p) for p in recorded_inputs.get("images", [])]
    videos = [Path(video["video"]) for video in recorded_inputs.get("videos", [])]
    family = get_family(checkpoint.family)
    inputs = prepare_inputs(checkpoint, images, videos)
    prompt = (report.data.get("parameters") or {}).get("text")
    if prompt:  # the prompt's ids are part of the digest the captures recorded
        settings = {key: value for key, value in prompt.items() if key != "forced"}  # the decode's, not the prompt's
        inputs.text = family.text_inputs(checkpoint, inputs, **settings)
    recorded = (report.data.get("inputs") or {}).get("digest")
    if recorded and inputs.digest != recorded:
        raise ParameterError(
            f"the run's images now give inputs {inputs.digest}, not the {recorded} its captures recorded",
            "the images or the checkpoint's processor changed since the run: run it again",
        )
    return inputs


def _reference(report: Report, label: str, plan: StagePlan, focus: str, inputs, log) -> TapSet:
    """The run's reference TapSet when it holds every stage of ``plan``, else a capture of them (kept)."""
    tapset = report.tapset(label)
    if all(stage.id in tapset for stage in plan):
        return tapset
    out = report.directory / FOLDER / f"{safe_name(label)}-{focus}"
    if (out.with_suffix(".json")).exists():
        kept = TapSet(out)
        if kept.meta.get("complete") and kept.meta.get("inputs_digest") == inputs.digest:
            return kept
    log(f"the run did not capture {label}'s {focus} stages: capturing them once (kept in {out.parent})")
    return _capture(report, label, None, plan, inputs, out, log)


def recapture_block(
    report: Report | str | Path,
    pair: str,
    block: int,
    patch: str | dict | None = None,
    log: Callable[[str], None] = print,
) -> Recapture:
    """Capture block ``block`` of ``pair``'s candidate again with ``patch`` applied (``"module:function"``,
    ``"file.py:function"`` or ``{callable: ..., kwargs: {...}}``; None: as the run did) and compare it with the
    reference. Nothing else runs again: the reference's capture is the run's (or, when the run did not capture
    this block's substages, one made once and kept)."""
    report = report if isinstance(report, Report) else Report.load(report)
    return _recapture(report, pair, block_plan(_full_plan(report), int(block)), patch, log)


def recapture_stages(
    report: Report | str | Path,
    pair: str,
    stages: list[str],
    patch: str | dict | None = None,
    log: Callable[[str], None] = print,
) -> Recapture:
    """As :func:`recapture_block`, for stages in no block (a mask, the positions, the embeddings): ``stages`` of
    ``pair``'s candidate captured again with ``patch`` and compared with the reference."""
    report = report if isinstance(report, Report) else Report.load(report)
    full = _full_plan(report)
    unknown = [stage for stage in stages if stage not in full]
    if unknown:
        raise ParameterError(f"the checkpoint's family taps no stage {unknown[0]!r}", "use a stage of the run's plan")
    return _recapture(report, pair, stages_plan(full, stages), patch, log)


def _recapture(report: Report, pair: str, plan: StagePlan, patch, log) -> Recapture:
    start = time.perf_counter()
    reference_label, candidate_label = _pair(report, pair)
    blocks = {stage.block for stage in plan if stage.block is not None}
    block = blocks.pop() if len(blocks) == 1 else None
    wanted = {stage.id for stage in plan if (stage.block == block if block is not None else not _helper(plan, stage))}
    focus = _focus(plan, wanted)
    hypothesis = parse_patch(patch)
    if hypothesis is not None:
        hypothesis.resolve()  # an unimportable patch fails here, before a model loads
    inputs = _inputs(report)
    reference = _reference(report, reference_label, plan, focus, inputs, log)
    digest = hashlib.sha256(json.dumps(patch, sort_keys=True, default=str).encode()).hexdigest()[:8]
    out = report.directory / FOLDER / f"{safe_name(candidate_label)}-{focus}-{digest}"
    candidate = _capture(report, candidate_label, hypothesis, plan, inputs, out, log)
    written = report.data["contract"]
    contract = Contract.from_dict({k: v for k, v in written.items() if k != "source"}, written.get("source"))
    compared = compare_tapsets(reference, candidate, contract, plan)
    rows = [r for r in compared if r.stage in wanted]  # a capture may add inputs
    before = {r.stage: r for r in report.rows if (r.pair or r.candidate) == pair and r.stage in plan}
    described = None if hypothesis is None else hypothesis.target
    return Recapture(
        pair, block, described, [r.stage for r in rows], rows, before, candidate, time.perf_counter() - start
    )


def _helper(plan: StagePlan, stage) -> bool:
    """A token-order index stage the comparison needs, not one the caller asked for."""
    return any(stage.id in (order.index, order.segments) for order in orders_of(plan).values())
