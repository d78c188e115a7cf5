"""The versioned JSON report: written atomically at every step, re-judgeable from saved TapSets."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .atomic import write_json_atomic
from .compare import ComparisonRow, compare_tapsets, first_divergence, growth_stages
from .contract import Contract
from .errors import TapFileError
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
        path = Path(path)
        if path.is_dir():
            path = path / "report.json"
        data = json.loads(path.read_text())
        if data.get("schema_version") != SCHEMA_VERSION:
            raise TapFileError(
                f"report {path} has schema_version {data.get('schema_version')}",
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
) -> dict:
    """Rows, first divergences, growth stages, drift onsets and the verdict for every runtime pair.

    Pairs are the reference against each candidate, then ``extra_pairs`` (e.g. mlx against iree).
    ``compared`` holds rows already computed under this contract, by (reference, candidate) label.
    """
    rows: list[ComparisonRow] = []
    first: dict[str, dict | None] = {}
    growth: dict[str, list[dict]] = {}
    onset: dict[str, str | None] = {}
    per_candidate: dict[str, str] = {}
    reasons: list[str] = []
    pairs_out: list[dict] = []
    side = {stage.id for stage in plan if stage.side}
    for ref, candidate in [(reference, c) for c in candidates] + list(extra_pairs):
        key = pair_key(ref.label, candidate.label, reference.label)
        pairs_out.append({"key": key, "reference": ref.label, "candidate": candidate.label})
        pair_rows = (compared or {}).get((ref.label, candidate.label)) or compare_tapsets(
            ref, candidate, contract, plan
        )
        for row in pair_rows:
            row.pair = key
        rows.extend(pair_rows)
        divergence = first_divergence(pair_rows)
        first[key] = (
            None
            if divergence is None
            else {
                "stage": divergence.stage,
                "status": divergence.status,
                "failures": divergence.failures,
                "elements": divergence.elements,
                "max_abs": divergence.max_abs,
                "max_coords": divergence.max_coords,
                "reference_value": divergence.max_reference_value,
                "candidate_value": divergence.max_candidate_value,
                "note": divergence.note,
            }
        )
        growth[key] = growth_stages(pair_rows, contract.growth_factor, side=side)
        onset[key] = next((row.stage for row in pair_rows if not row.integer and row.relative_rms > DRIFT_FLOOR), None)
        missing = [row.stage for row in pair_rows if row.status == "missing"]
        failed = divergence is not None
        per_candidate[key] = "fail" if failed else "pass"
        if failed:
            reasons.append(
                f"{key}: first divergence at {divergence.stage} "
                f"({divergence.failures}/{divergence.elements} elements over tolerance)"
            )
        if missing:
            reasons.append(f"{key}: {len(missing)} stages captured by only one side (e.g. {missing[0]})")
    status = "fail" if any(v == "fail" for v in per_candidate.values()) else "pass"
    return {
        "pairs": pairs_out,
        "rows": [row.to_dict() for row in rows],
        "first_divergence": first,
        "growth": growth,
        "drift_onset": onset,
        "verdict": {"status": status, "per_candidate": per_candidate, "reasons": reasons},
    }


def _rejudge_replay(report: Report, reference: TapSet, rows: list[dict], contract: Contract) -> dict:
    from .replay.drilldown import judge_replay

    out = {}
    for label, entry in (report.data.get("replay") or {}).items():
        accumulated = [ComparisonRow.from_dict(row) for row in rows if row.get("pair") == label]
        drill = judge_replay(
            reference,
            TapSet(report.directory / entry["tapset"]),
            accumulated,
            contract,
            report.plan,
            label,
            entry["candidate"],
        )
        out[label] = dict(drill.to_dict(), tapset=entry["tapset"])
    return out


def rejudge(report_path: str | Path, contract: Contract, out_path: str | Path | None = None) -> Report:
    """Re-apply another contract to a saved run's TapSets; no runtime is run again."""
    report = Report.load(report_path)
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
    data.update(judge(reference, candidates, contract, report.plan, extra))
    apply_checks(data, data.get("checks") or {})
    data["replay"] = _rejudge_replay(report, reference, data["rows"], contract)
    data["contract"] = contract.to_dict()
    data["rejudged_from"] = str(report.path)
    target = Path(out_path) if out_path else report.path
    if target.resolve().parent != report.directory.resolve():
        data["runtimes"] = [dict(r, tapset=str((report.directory / r["tapset"]).resolve())) for r in data["runtimes"]]
        data["replay"] = {
            k: dict(v, tapset=str((report.directory / v["tapset"]).resolve())) for k, v in data["replay"].items()
        }
    new = Report(target, data)
    new.save()
    return new
