"""Re-judging a finished run under another contract from its saved TapSets, without running anything."""

from __future__ import annotations

from pathlib import Path

from driftscope.capture.runtime_checks import apply_checks
from driftscope.errors import ReportError
from driftscope.judge.compare import ComparisonRow
from driftscope.judge.contract import Contract
from driftscope.judge.verdict import judge
from driftscope.judge.yardstick import apply_yardsticks, yardsticks
from driftscope.run.report import Report
from driftscope.taps.tapset import TapSet


def _runtime_of(report: Report, label: str) -> tuple[str, str | None]:
    """(the runtime ``mlx``, ``iree``..., its own patch's target) the run ran as ``label``."""
    spec = report.runtime_spec(label)
    if spec is None:
        return label.split(":")[0], None
    return spec["runtime"], (spec.get("patch") or {}).get("callable")


def _rejudge_replay(report: Report, rows: list[dict], contract: Contract) -> tuple[dict, dict]:
    """Every replay's labels and every pair's conclusion again, under ``contract``."""
    from driftscope.judge.decode_site import decode_site
    from driftscope.replay.conclusion import conclude
    from driftscope.replay.drilldown import judge_replay
    from driftscope.run.candidates import with_ready_patches

    out, conclusions = {}, {}
    for label in report.pair_keys():
        accumulated = [ComparisonRow.from_dict(row) for row in rows if row.get("pair") == label]
        entry = (report.data.get("replay") or {}).get(label)
        drill = None
        if entry:
            drill = judge_replay(
                report.pair_tapsets(label)[0],
                TapSet(report.directory / entry["tapset"]),
                accumulated,
                contract,
                report.plan,
                label,
                entry["candidate"],
            )
            out[label] = dict(drill.to_dict(), tapset=entry["tapset"])
        if label in (report.data.get("conclusions") or {}):
            runtime, own = _runtime_of(report, label)
            decode = decode_site(accumulated, *report.pair_tapsets(label), contract, report.plan)
            concluded = conclude(drill, accumulated, report.plan, decode)
            model_type, activations = report.plan.meta.get("model_type"), report.activations(label)
            conclusions[label] = with_ready_patches(
                concluded, report.plan.family, runtime, own, model_type, activations
            )
    return out, conclusions


def rejudge(report_path: str | Path, contract: Contract, out_path: str | Path | None = None) -> Report:
    """Re-apply another contract to a saved run's TapSets; no runtime is run again.

    Only a complete run is re-judged: a failed, killed or running one has not captured every runtime."""
    report = Report.load(report_path)
    if report.status != "complete":
        raise ReportError(
            f"{report.path} is of a run that did not complete ({report.status}: {report.stopped()})",
            "rejudge re-applies a contract to a finished run; run it to the end first (driftscope run)",
        )
    labels = [runtime["label"] for runtime in report.data["runtimes"]]
    reference_label = report.data["reference"]
    reference = report.tapset(reference_label)
    candidates = [report.tapset(label) for label in labels if label != reference_label]
    extra = [
        (report.tapset(pair["reference"]), report.tapset(pair["candidate"]))
        for pair in report.data.get("pairs", [])
        if pair["reference"] != reference_label
    ]
    data = dict(report.data)
    data.update(judge(reference, candidates, contract, report.plan, extra, narrowed=report.narrowed_sides()))
    data["warnings"] = data["warnings"] + list((data.get("inputs") or {}).get("warnings", []))
    apply_checks(data, data.get("checks") or {})
    relative = (data.get("parameters") or {}).get("relative")
    apply_yardsticks(data, yardsticks(data.get("runtimes") or [], relative, reference_label))
    data["replay"], data["conclusions"] = _rejudge_replay(report, data["rows"], contract)
    if data.get("peer_relative"):
        from driftscope.judge.relative import peer_verdict

        rows = [ComparisonRow.from_dict(row) for row in data["rows"]]
        data["peer_relative"] = peer_verdict(
            rows, reference_label, data["peer_relative"]["peer"], contract, report.plan
        )
    if data.get("linear_replay"):  # the linear controls' rows stand; their stage labels follow the new contract
        from driftscope.capture.linear_controls import linear_verdict

        data["linear_replay"] = {
            label: linear_verdict(entry, data["replay"].get(label, {}).get("labels", []), label)
            for label, entry in data["linear_replay"].items()
        }
    if data.get("answer"):  # the teacher-forced answer's top-k maps and flip labels, under the new tolerances
        import copy

        from driftscope.judge.forced import forced_pair

        data["answer"] = copy.deepcopy(data["answer"])  # the saved run's own report stays as it was
        for pair in data["answer"].get("pairs", []):
            if pair.get("forced") is not None:
                tapsets = report.tapset(pair["reference"]), report.tapset(pair["candidate"])
                pair["forced"] = forced_pair(*tapsets, contract)
            if pair.get("cache") is not None:
                from driftscope.judge.cache import cache_pair

                tapsets = report.tapset(pair["reference"]), report.tapset(pair["candidate"])
                pair["cache"] = cache_pair(*tapsets, contract, report.plan)
        if data["answer"].get("three_way"):  # the peer's bounds (peer_factor, peer_floor) follow the new contract
            from driftscope.judge.three_way import three_way

            entry = data["answer"]["three_way"]
            tapsets = {r["label"]: report.tapset(r["label"]) for r in data.get("runtimes", [])}
            data["answer"]["three_way"] = three_way(tapsets, entry["reference"], entry["peer"], contract)
        untaken = [
            r["label"] for r in data.get("runtimes", []) if (r.get("answer_evidence") or {}).get("in_question") is False
        ]
        if untaken:  # decided at capture under the run's own tolerances (taps.answer_question)
            data["warnings"] = list(data.get("warnings") or []) + [
                f"{', '.join(untaken)}: no teacher-forced answer or KV cache to re-judge (the answer was not in "
                "question under the run's contract); run again under this contract to weigh it again"
            ]
    data["contract"] = contract.to_dict()
    data["rejudged_from"] = str(report.path)
    target = Path(out_path) if out_path else report.path
    if target.is_dir():  # a directory to write the re-judged report into
        target = target / "report.json"
    if target.resolve().parent != report.directory.resolve():
        data["runtimes"] = [dict(r, tapset=str((report.directory / r["tapset"]).resolve())) for r in data["runtimes"]]
        data["replay"] = {
            k: dict(v, tapset=str((report.directory / v["tapset"]).resolve())) for k, v in data["replay"].items()
        }
        data["narrowing"] = {
            key: dict(entry, tapsets={s: [str((report.directory / p).resolve()) for p in ps] for s, ps in parts})
            for key, entry in (data.get("narrowing") or {}).items()
            for parts in [entry["tapsets"].items()]
        }
    new = Report(target, data)
    new.save()
    return new
