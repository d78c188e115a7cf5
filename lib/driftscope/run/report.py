"""The versioned JSON report: written atomically at every step, re-judgeable from saved TapSets."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driftscope.core.atomic import write_json_atomic
from driftscope.errors import OutputError, ReportError, TapFileError
from driftscope.judge.compare import ComparisonRow
from driftscope.run.report_schema import schema_problem
from driftscope.taps.stages import Stage, StagePlan
from driftscope.taps.tapset import TapSet

SCHEMA_VERSION = 1


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
        problem = schema_problem(data)
        if problem:
            raise ReportError(
                f"{path} is not a valid driftscope report: {problem}",
                "re-run the investigation (or `driftscope rejudge` a complete run) to write it again",
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
        cause = err if isinstance(err, OSError | OutputError) else err.__cause__
        if isinstance(cause, OSError | OutputError):  # e.g. a full disk: which file, and the errno
            path = getattr(cause, "path", None) or getattr(cause, "filename", None)
            self.data["error"].update(errno=cause.errno, path=None if path is None else str(path))
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

    def activations(self, label: str) -> str | None:
        """The activation dtype the runtime labelled ``label`` computed in, as its policy says (None: not said)."""
        entry = next((r for r in self.data.get("runtimes", []) if r.get("label") == label), None)
        policy = (entry or {}).get("policy")
        return policy.get("activations") if isinstance(policy, dict) else None

    def runtime_spec(self, label: str) -> dict | None:
        """The parameter file's entry for the runtime labelled ``label`` (its runtime, policy, patch, options)."""
        runtimes = (self.data.get("parameters") or {}).get("runtimes", [])
        return next((spec for spec in runtimes if spec.get("label") == label), None)

    def pair_tapsets(self, key: str) -> tuple:
        """The (reference, candidate) TapSets of runtime pair ``key``, with the stages narrowing added to them."""
        from driftscope.taps.tapunion import with_extras

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

    def conclusion(self, key: str) -> dict:
        """The judge's one conclusion for runtime pair ``key`` (empty where the run has none yet)."""
        return (self.data.get("conclusions") or {}).get(key) or {}

    def pair_title(self, key: str) -> str:
        for pair in self.data.get("pairs", []):
            if pair["key"] == key:
                return f"{pair['candidate']} vs {pair['reference']}"
        return f"{key} vs {self.data.get('reference')}"

    def frame(self):
        from driftscope.judge.compare import rows_frame

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
