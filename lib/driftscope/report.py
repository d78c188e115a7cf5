"""The versioned JSON report: written atomically at every step, re-judgeable from saved TapSets."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .atomic import write_json_atomic
from .compare import ComparisonRow, compare_tapsets, first_divergence, growth_stages
from .contract import Contract
from .errors import ReportError, TapFileError
from .lineage import row_lineage
from .runtime_checks import apply_checks
from .stages import Stage, StagePlan
from .tapset import TapSet

SCHEMA_VERSION = 1
DRIFT_FLOOR = 1e-4  # relative RMS above which a stage counts as drifting (float32 round-off is ~1e-7)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Report:
    """Everything a run found; ``save`` writes it atomically (call it after every step)."""

    path: Path
    data: dict = field(default_factory=dict)

    @classmethod
    def start(cls, path: Path, **fields: Any) -> Report:
        data = {
            "schema_version": SCHEMA_VERSION,
            "status": "running",
            "stopped_at": None,
            "error": None,
            "created": _now(),
            "updated": _now(),
            "progress": [],
        }
        data.update(fields)
        report = cls(Path(path), data)
        report.save()
        return report

    @classmethod
    def load(cls, path: str | Path) -> Report:
        """Read a report (or a run directory's), or raise :class:`ReportError` saying what is wrong with it."""
        path = Path(path)
        fix = "pass a run's output directory (outputs/<commit>/<name>/) or its report.json"
        if path.is_dir():
            if not (path / "report.json").exists():
                raise ReportError(f"{path} holds no report.json", fix)
            path = path / "report.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ReportError(f"report {path} does not exist", fix) from None
        except (OSError, UnicodeDecodeError, ValueError) as err:
            raise ReportError(
                f"report {path} is not readable JSON ({err})", "re-run the investigation that writes it"
            ) from None
        version = data.get("schema_version") if isinstance(data, dict) else None
        if version != SCHEMA_VERSION:
            what = f"has schema_version {version!r}" if isinstance(data, dict) else "is not a JSON object"
            raise ReportError(
                f"{path} is not a driftscope report of this version: it {what}",
                f"this driftscope reads schema_version {SCHEMA_VERSION}; re-run the investigation",
            )
        return cls(path, data)

    def save(self) -> None:
        self.data["updated"] = _now()
        write_json_atomic(self.path, self.data)

    def step(self, where: str) -> None:
        """Record that the run reached ``where`` (the report says where a crash stopped it)."""
        self.data["stopped_at"] = where
        self.data["progress"].append({"step": where, "at": _now()})
        self.save()

    def fail(self, err: BaseException) -> None:
        self.data["status"] = "error"
        self.data["error"] = {"type": type(err).__name__, "message": str(err)}
        self.data.setdefault("verdict", {})
        self.data["verdict"] = {"status": "error", "reasons": [f"stopped at {self.data.get('stopped_at')}: {err}"]}
        self.save()

    # the run's state ----------------------------------------------------------------------------
    @property
    def status(self) -> str:
        """``complete``, ``error``, ``running``, or ``dead``: a running report whose process is gone (killed)."""
        status = str(self.data.get("status", "unknown"))
        if status == "running" and not process_alive(self.data.get("pid"), self.data.get("host")):
            return "dead"
        return status

    def stopped(self) -> str:
        """Where an unfinished run stopped and why, in one line (empty for a complete run)."""
        status = self.status
        where = f"stopped at {self.data.get('stopped_at')}"
        if status == "dead":
            return f"{where} (process {self.data.get('pid')} is gone)"
        if status == "running":
            return f"running, at {self.data.get('stopped_at')} (process {self.data.get('pid')})"
        if status == "error":
            error = self.data.get("error") or {}
            return f"{where}: {error.get('type', 'error')}: {error.get('message', '')}"
        return ""

    # convenient views -------------------------------------------------------------------------
    @property
    def rows(self) -> list[ComparisonRow]:
        return [ComparisonRow.from_dict(row) for row in self.data.get("rows", [])]

    @property
    def verdict(self) -> str:
        return str(self.data.get("verdict", {}).get("status", "unknown"))

    @property
    def plan(self) -> StagePlan:
        stages = [Stage.from_dict(s) for s in self.data.get("stage_plan", [])]
        meta = self.data.get("plan_meta", {})
        return StagePlan(self.data.get("family", ""), stages, int(meta.get("depth", 0)), meta)

    @property
    def directory(self) -> Path:
        return self.path.parent

    def tapset(self, label: str) -> TapSet:
        for runtime in self.data.get("runtimes", []):
            if runtime["label"] == label:
                return TapSet(self.directory / runtime["tapset"])
        raise TapFileError(
            f"report has no runtime labelled {label!r}",
            f"use one of {[r['label'] for r in self.data.get('runtimes', [])]}",
        )

    def pair_tapsets(self, key: str) -> tuple:
        """The (reference, candidate) TapSets of runtime pair ``key``, with the stages narrowing added to them."""
        from .tapunion import with_extras

        pair = next((p for p in self.data.get("pairs", []) if p["key"] == key), None)
        labels = (pair["reference"], pair["candidate"]) if pair else (self.data.get("reference"), key)
        sides = [self.tapset(label) for label in labels]
        parts = ((self.data.get("narrowing") or {}).get(key) or {}).get("tapsets") or {}
        return tuple(
            with_extras(side, [TapSet(self.directory / path) for path in parts.get(name, [])])
            for side, name in zip(sides, ("reference", "candidate"), strict=True)
        )

    def narrowed_sides(self) -> dict[str, tuple]:
        """Each narrowed pair's (reference, candidate) TapSets by candidate label, as ``judge`` takes them."""
        return {key: self.pair_tapsets(key) for key in self.data.get("narrowing") or {}}

    def pair_keys(self) -> list[str]:
        """Every judged runtime pair, in report order."""
        if self.data.get("pairs"):
            return [pair["key"] for pair in self.data["pairs"]]
        reference = self.data.get("reference")
        return [r["label"] for r in self.data.get("runtimes", []) if r["label"] != reference]

    def pair_title(self, key: str) -> str:
        for pair in self.data.get("pairs", []):
            if pair["key"] == key:
                return f"{pair['candidate']} vs {pair['reference']}"
        return f"{key} vs {self.data.get('reference')}"

    def frame(self):
        from .compare import rows_frame

        return rows_frame(self.rows)


def process_alive(pid: object, host: object = None) -> bool:
    """Whether process ``pid`` still runs (a zombie does not); a process on another host counts as alive."""
    if host is not None and host != socket.gethostname():
        return True
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def pair_key(reference: str, candidate: str, main_reference: str) -> str:
    """How a runtime pair is named in the report: the candidate's label when judged against the main reference."""
    return candidate if reference == main_reference else f"{candidate} vs {reference}"


def judge(
    reference: TapSet,
    candidates: list[TapSet],
    contract: Contract,
    plan: StagePlan,
    extra_pairs: list[tuple[TapSet, TapSet]] = (),
    compared: dict[tuple[str, str], list[ComparisonRow]] | None = None,
    narrowed: dict[str, tuple] | None = None,
) -> dict:
    """Rows, first divergences (and the lineage of their worst row), growth stages, drift onsets and the verdict
    for every runtime pair.

    Pairs are the reference against each candidate, then ``extra_pairs`` (e.g. mlx against iree).
    ``compared`` holds rows already computed under this contract, by (reference, candidate) label; ``narrowed``
    the (reference, candidate) TapSets, with the stages narrowing added, of each narrowed candidate's pair.
    """
    rows: list[ComparisonRow] = []
    first: dict[str, dict | None] = {}
    growth: dict[str, list[dict]] = {}
    onset: dict[str, str | None] = {}
    absent: dict[str, list[dict]] = {}
    per_candidate: dict[str, str] = {}
    reasons: list[str] = []
    pairs_out: list[dict] = []
    lineage: dict[str, dict | None] = {}
    side = {stage.id for stage in plan if stage.side}
    for ref, candidate in [(reference, c) for c in candidates] + list(extra_pairs):
        key = pair_key(ref.label, candidate.label, reference.label)
        if ref is reference and candidate.label in (narrowed or {}):
            ref, candidate = narrowed[candidate.label]
        pairs_out.append({"key": key, "reference": ref.label, "candidate": candidate.label})
        pair_rows = (compared or {}).get((ref.label, candidate.label)) or compare_tapsets(
            ref, candidate, contract, plan
        )
        for row in pair_rows:
            row.pair = key
        rows.extend(pair_rows)
        divergence = first_divergence(pair_rows)
        first[key] = None if divergence is None else _divergence_record(divergence)
        lineage[key] = None
        if first[key] and first[key]["max_coords"] and divergence.status == "fail":
            lineage[key] = row_lineage(ref, candidate, plan, contract, divergence.stage, first[key]["max_coords"])
        growth[key] = growth_stages(pair_rows, contract.growth_factor, side=side)
        onset[key] = next((row.stage for row in pair_rows if not row.integer and row.relative_rms > DRIFT_FLOOR), None)
        absent[key] = not_compared(pair_rows, ref, candidate)
        compared_rows = [row for row in pair_rows if row.status not in ("missing", "skipped")]
        failed = divergence is not None or not compared_rows
        per_candidate[key] = "fail" if failed else "pass"
        if divergence is not None:
            reasons.append(f"{key}: first divergence at {divergence.stage} ({_divergence_reason(divergence)})")
        if not compared_rows:
            reasons.append(f"{key}: no stage was compared (every stage skipped by the contract or missing)")
        for row in pair_rows:
            if row.warning:
                reasons.append(f"{key}: {row.stage}: {row.warning}")
    warnings = contract.warnings(plan.ids())
    status = "fail" if any(v == "fail" for v in per_candidate.values()) else "pass"
    return {
        "pairs": pairs_out,
        "rows": [row.to_dict() for row in rows],
        "first_divergence": first,
        "lineage": lineage,
        "growth": growth,
        "drift_onset": onset,
        "not_compared": {key: groups for key, groups in absent.items() if groups},
        "warnings": warnings,
        "verdict": {"status": status, "per_candidate": per_candidate, "reasons": reasons},
    }


def not_compared(rows: list[ComparisonRow], reference: TapSet, candidate: TapSet) -> list[dict]:
    """Stages one side of a pair did not capture, grouped by stage family (``text.generate.*``), with why.

    They are not compared and never count toward the verdict; the runtime checks say whether a capture is
    incomplete. ``why`` names the capability the runtime lacks when it declares one (e.g. it does not decode)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        if row.status == "missing":
            side = "reference" if row.note.endswith("reference") else "candidate"
            groups.setdefault((side, row.stage.rsplit(".", 1)[0]), []).append(row.stage)
    out = []
    for (side, prefix), stages in groups.items():
        tapset = reference if side == "reference" else candidate
        out.append(
            {
                "side": side,
                "runtime": tapset.label,
                "stages": stages,
                "pattern": stages[0] if len(stages) == 1 else f"{prefix}.*",
                "why": _why_absent(tapset, prefix),
            }
        )
    return out


def _why_absent(tapset: TapSet, prefix: str) -> str:
    """Why a runtime has no stages under ``prefix``: a capability its runtime declares it lacks, else plainly."""
    from .errors import DriftscopeError
    from .runtimes import get_runtime

    name = str(tapset.meta.get("runtime") or tapset.label)
    try:
        runtime = get_runtime(name)
    except DriftscopeError:
        runtime = None
    if prefix.startswith("text.generate"):
        if (tapset.meta.get("options") or {}).get("decode") is False:
            return f"{name} does not decode (options.decode: false)"
        if runtime is not None and not _decodes(runtime, str(tapset.meta.get("family") or "")):
            return f"{name} does not decode"
    return f"{tapset.label} did not capture them"


def _decodes(runtime, family: str) -> bool:
    """Whether ``runtime`` declares greedy decoding for ``family`` (its general answer when the family is not
    known)."""
    from .errors import DriftscopeError

    try:
        return runtime.decodes_with(family)
    except DriftscopeError:
        return runtime.decodes


def _divergence_record(row: ComparisonRow) -> dict:
    """The first divergent stage of a pair and the element to look at: the first non-finite one, else the
    failing element furthest over its own tolerance (not the largest |difference|, which may pass)."""
    nonfinite, worst = row.first_nonfinite, row.worst_failing
    where = nonfinite or worst
    return {
        "stage": row.stage,
        "status": row.status,
        "failures": row.failures,
        "elements": row.elements,
        "max_abs": row.max_abs,
        "max_coords": where["coords"] if where else row.max_coords,
        "reference_value": where["reference"] if where else row.max_reference_value,
        "candidate_value": where["candidate"] if where else row.max_candidate_value,
        "tolerance": None if nonfinite or not worst else worst["tolerance"],
        "excess": None if nonfinite or not worst else worst["excess"],
        "atol_bound_failures": row.atol_bound_failures,
        "nonfinite_mismatch": row.nonfinite_mismatch,
        "note": row.note,
    }


def _divergence_reason(row: ComparisonRow) -> str:
    if row.first_nonfinite:
        where = row.first_nonfinite
        return (
            f"{row.nonfinite_mismatch} non-finite value(s) the other side lacks; first at {where['coords']}: "
            f"reference {where['reference']}, candidate {where['candidate']}"
        )
    return f"{row.failures}/{row.elements} elements over tolerance"


def _rejudge_replay(report: Report, rows: list[dict], contract: Contract) -> tuple[dict, dict]:
    """Every replay's labels and every pair's conclusion again, under ``contract``."""
    from .replay.conclusion import conclude
    from .replay.drilldown import judge_replay

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
            conclusions[label] = conclude(drill, accumulated, report.plan)
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
    data["replay"], data["conclusions"] = _rejudge_replay(report, data["rows"], contract)
    if data.get("peer_relative"):
        from .relative import peer_verdict

        rows = [ComparisonRow.from_dict(row) for row in data["rows"]]
        data["peer_relative"] = peer_verdict(
            rows, reference_label, data["peer_relative"]["peer"], contract, report.plan
        )
    if data.get("linear_replay"):  # the linear controls' rows stand; their stage labels follow the new contract
        from .quant.linear_controls import linear_verdict

        data["linear_replay"] = {
            label: linear_verdict(entry, data["replay"].get(label, {}).get("labels", []), label)
            for label, entry in data["linear_replay"].items()
        }
    data["contract"] = contract.to_dict()
    data["rejudged_from"] = str(report.path)
    target = Path(out_path) if out_path else report.path
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
