"""The sweep: one investigation per model type the generic family names (its model testers' tiny checkpoints),
transformers f32 against MLX f32 under the strict contract, summarised in one table.

Each row says whether the family passes at every aligned stage, or where it first diverges, which operator
replay says introduces it, and the ready patch that closes it (``families.generic.hypotheses``); a family that a
library cannot load says that library's own error. ``driftscope sweep`` writes ``sweep.json`` and ``sweep.md``
into its output folder; ``--docs`` also keeps the JSON as ``docs/sweep.json``, from which the README's family
table is generated (``scripts/families_table.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from driftscope.core.atomic import write_json_atomic, write_text_atomic
from driftscope.core.paths import DEMO_IMAGES, REPO_ROOT, cache_root, outputs_root, repository_of
from driftscope.errors import DriftscopeError

#: what every sweep run compares: the oracle against eager MLX, both float32, under the strict contract
RUNTIMES = [{"runtime": "transformers", "policy": "f32"}, {"runtime": "mlx", "policy": "f32"}]
CONTRACT = "strict"
IMAGE = DEMO_IMAGES / "shapes_448.png"
PROMPT = "Name every shape in the image and its colour."


@dataclass
class SweepRow:
    """One model type's result."""

    model_type: str
    verdict: str  # pass | fail | could not run
    first_divergence: str | None = None
    introduced_by: str | None = None  # the operator (stage) replay names
    conclusion: str = ""
    patch: str | None = None  # the ready patch that closes it, where one is known
    stages: int = 0  # stages compared
    unaligned: dict[str, int] = field(default_factory=dict)  # modules without a partner, per side
    error: str | None = None  # a library's own error, where one could not load or run the checkpoint
    fixed_by: dict[str, str] = field(default_factory=dict)  # runtime -> the patch closing its port's defects
    fixed: str | None = None  # the verdict of the same run with those patches (None: no run with them)
    fixed_divergence: str | None = None  # where that run still first diverges
    seconds: float = 0.0
    report: str = ""

    def cells(self) -> list[str]:
        where = self.first_divergence or "—"
        return [
            f"`{self.model_type}`",
            self.verdict,
            f"`{where}`" if self.first_divergence else where,
            f"`{self.introduced_by}`" if self.introduced_by else "—",
            f"`{self.patch.split(':')[-1]}`" if self.patch else "—",
            self.fixed_cell(),
            str(self.stages),
            " / ".join(str(self.unaligned.get(side, 0)) for side in ("transformers", "mlx")),
        ]

    def fixed_cell(self) -> str:
        if self.fixed is None:
            return "—"
        patches = ", ".join(f"{runtime}: `{patch}`" for runtime, patch in self.fixed_by.items())
        where = f" at `{self.fixed_divergence}`" if self.fixed_divergence else ""
        return f"{self.fixed}{where} ({patches})"


HEADER = [
    "model type",
    "verdict",
    "first divergence",
    "introduced by",
    "ready patch",
    "with every fix",
    "stages",
    "unaligned (tf / mlx)",
]


def parameters(model_type: str, checkpoint: Path) -> dict:
    """The sweep's parameter set for one model type's tiny checkpoint."""
    return {
        "name": f"sweep-{model_type}",
        "description": f"generic family: {model_type} tester checkpoint, transformers f32 vs mlx f32, strict",
        "family": "generic",
        "checkpoint": str(checkpoint),
        "images": [str(IMAGE)],
        "runtimes": [dict(runtime) for runtime in RUNTIMES],  # the caller's to change (a patch on one of them)
        "contract": CONTRACT,
        "stages": {"blocks": True, "substages": "all"},
        # every candidate teacher-forced with its KV cache tapped: a port's position defect (RoPE counted from
        # another origin) leaves tokens and margins alone and shows in the cached keys only
        "text": {"prompt": PROMPT, "max_new_tokens": 4, "forced": "always"},
        "notebooks": [],
    }


def _row(model_type: str, report) -> SweepRow:
    data = report.data
    pair = next(iter((data.get("first_divergence") or {}).keys()), None)
    first = (data.get("first_divergence") or {}).get(pair) if pair else None
    conclusion = (data.get("conclusions") or {}).get(pair) or {}
    compared = sum(1 for row in data.get("rows", []) if row.get("status") in ("pass", "fail"))
    unaligned = ((data.get("plan_meta") or {}).get("generic") or {}).get("unaligned") or {}
    patches = conclusion.get("ready_patches") or []
    return SweepRow(
        model_type,
        str(report.verdict or "could not run"),
        first["stage"] if first else None,
        conclusion.get("operator") or conclusion.get("stage"),
        str(conclusion.get("text") or conclusion.get("summary") or ""),
        patches[0] if patches else None,
        compared,
        {side: len(entries) for side, entries in unaligned.items()},
    )


def _readable(path: Path):
    """The report at ``path``, or None when there is none or it cannot be read."""
    from driftscope.run.report import Report

    try:
        return Report.load(path) if path.exists() else None
    except DriftscopeError:
        return None


def _fixed(row: SweepRow, checkpoint: Path, folder: Path, out: Path) -> None:
    """The same run with every ready patch that closes a defect the sweep found in this model type's ports (each on
    its runtime): whether what the tool localized is all there is."""
    from driftscope.families.generic.fixes import WHOLE
    from driftscope.run.investigation import investigate
    from driftscope.run.params import parse_parameters

    row.fixed_by = dict(WHOLE.get(row.model_type) or {})
    if not row.fixed_by:
        return
    data = parameters(row.model_type, checkpoint)
    data["name"] += "-fixed"
    for spec in data["runtimes"]:
        if spec["runtime"] in row.fixed_by:
            spec["patch"] = f"driftscope.hypotheses:{row.fixed_by[spec['runtime']]}"
    report = investigate(parse_parameters(data, source=None, base=out), folder)
    fixed = _row(row.model_type, report)
    row.fixed, row.fixed_divergence = fixed.verdict, fixed.first_divergence


def sweep(model_types: list[str], out: Path, build: Callable[[str], Path], log=print) -> list[SweepRow]:
    """Investigate each model type's tiny checkpoint (``build(model_type)`` makes it) into ``out/<model_type>``."""
    from driftscope.run.investigation import investigate
    from driftscope.run.params import parse_parameters

    rows = []
    for model_type in model_types:
        start = time.perf_counter()
        folder = out / model_type
        try:
            checkpoint = build(model_type)
            params = parse_parameters(parameters(model_type, checkpoint), source=None, base=out)
            report = investigate(params, folder)
            row = _row(model_type, report)
            if row.verdict == "fail":
                _fixed(row, checkpoint, folder / "fixed", out)
        except Exception as err:  # noqa: BLE001 - one model type's failure is its row's, never the sweep's end
            report_path = folder / "report.json"
            report = _readable(report_path)
            row = _row(model_type, report) if report is not None else SweepRow(model_type, "could not run")
            kind = "" if isinstance(err, DriftscopeError) else "internal error: "
            row.verdict, row.error = "could not run", f"{kind}{type(err).__name__}: {err}"
        row.seconds = round(time.perf_counter() - start, 1)
        row.report = str(folder / "report.json")
        log(f"{model_type}: {row.verdict}" + (f" at {row.first_divergence}" if row.first_divergence else ""))
        rows.append(row)
    write_json_atomic(out / "sweep.json", {"rows": [asdict(row) for row in rows]})
    write_text_atomic(out / "sweep.md", table(rows) + "\n")
    return rows


def table(rows: list[SweepRow]) -> str:
    """The sweep as a Markdown table."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def run_sweep(model_types: list[str], out: Path | None, docs: bool, log=print) -> list[SweepRow]:
    """``driftscope sweep``: the named model types (default every one the generic family has a tester for), each
    tiny checkpoint built where the repository keeps fixtures, investigated into ``out``."""
    from driftscope.errors import ParameterError
    from driftscope.families.generic.testers import model_types as known
    from driftscope.families.generic.tiny import build_tiny
    from driftscope.run.environment import current_commit

    everything = known()
    unknown = sorted(set(model_types) - set(everything))
    if unknown:
        raise ParameterError(
            f"the sweep has no tester checkpoint for {', '.join(unknown)}", f"use some of: {', '.join(everything)}"
        )
    out = out or outputs_root() / current_commit(Path.cwd()) / "sweep"
    checkout = repository_of(REPO_ROOT) == REPO_ROOT  # the package runs from its own repository
    fixtures = REPO_ROOT / "fixtures" / "checkpoints" if checkout else cache_root() / "checkpoints"
    if docs and not checkout:
        raise ParameterError("--docs keeps the sweep in the repository's docs/", "run it from a driftscope checkout")

    def build(model_type: str) -> Path:
        directory = fixtures / f"generic-{model_type}"
        if not any(directory.glob("*.safetensors")):
            build_tiny(model_type, directory)
        return directory

    rows = sweep(list(model_types) or everything, out, build, log)
    if docs:
        if not checkout:
            raise ParameterError(
                "--docs keeps the sweep in the repository's docs/", "run it from a driftscope checkout"
            )
        write_json_atomic(REPO_ROOT / "docs" / "sweep.json", {"rows": [_kept(row) for row in rows]})
    return rows


def _kept(row: SweepRow) -> dict:
    """What docs/sweep.json keeps of a row (no machine paths or times)."""
    kept = asdict(row)
    kept.pop("report")
    kept.pop("seconds")
    return kept
