"""``driftscope screen``: every input through every runtime's cheap path, judged and ranked, the ranking written
(``screen.json``, ``screen.csv``/``.parquet``, ``index.html``), then the top K investigated.

The screen's directory (default ``outputs/<commit>/screen-<name>/``) holds ``taps/<input>/`` (each runtime's
capture of that input), ``results/<input>.json`` (its judgement, written atomically once every runtime has run on
it) and ``runs/<input>/`` (the investigations). A screen run again into its directory captures and judges only
what it lacks, so an interrupted screen resumes; other parameters in the same directory are refused.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from driftscope.core.atomic import write_json_atomic
from driftscope.core.names import safe_name
from driftscope.core.paths import outputs_root, project_root
from driftscope.errors import ParameterError
from driftscope.families import get_family
from driftscope.families.checkpoints import open_checkpoint
from driftscope.run.environment import current_commit, fingerprint
from driftscope.run.params import Parameters, load_parameters
from driftscope.run.preflight import check_parameters
from driftscope.run.runlock import run_lock
from driftscope.screen.capture import Job, capture_all, missing
from driftscope.screen.inputs import ScreenInput, screen_inputs
from driftscope.screen.plan import screen_plan
from driftscope.screen.report import rank, write_screen, write_table
from driftscope.screen.score import SCORE_TERMS, judge_input, result_path

IDENTITY = "identity.json"


@dataclass
class ScreenResult:
    out: Path
    ranking: list[dict]
    investigations: list[dict]
    captured: int  # (input, runtime) captures this call ran
    judged: int  # inputs this call judged
    page: Path


def default_screen_dir(params: Parameters) -> Path:
    commit = current_commit(project_root(params.source))
    return outputs_root(params.source) / commit / safe_name(f"screen-{params.name}")


def _job(params: Parameters, out: Path) -> Job:
    checkpoint = open_checkpoint(params.checkpoint, params.family)
    family = get_family(checkpoint.family)
    vision = family.plan_for(checkpoint)
    text = family.text_stages_for(checkpoint, params.text["max_new_tokens"]) if params.text else None
    reference = next(s for s in params.runtimes if s.display == params.reference_label)
    specs = (reference, *[s for s in params.runtimes if s.display != params.reference_label])
    return Job(checkpoint, specs, screen_plan(vision, text), params.text, out)


def _claim(out: Path, params: Parameters, job: Job) -> None:
    """Record which parameters this directory screens; refuse a directory that screens others."""
    identity = {"parameters_digest": params.digest, "stages": job.plan.ids()}
    path = out / IDENTITY
    if path.exists():
        held = json.loads(path.read_text())
        if held.get("parameters_digest") != params.digest or held.get("stages") != identity["stages"]:
            raise ParameterError(
                f"{out} holds a screen of other parameters (digest {held.get('parameters_digest')})",
                "pass another --out, or delete that directory to screen these parameters there",
            )
        return
    write_json_atomic(path, identity)


def screen(
    params_path: str | Path,
    images: str | None = None,
    prompts: str | Path | None = None,
    top: int = 3,
    investigate: bool = True,
    scheduler: str | None = None,
    out: str | Path | None = None,
    render: bool = True,
    log: Callable[[str], None] = print,
    advance: Callable | None = None,
) -> ScreenResult:
    """Screen ``images``/``prompts`` under the parameter file's runtimes and contract (module docstring)."""
    params = load_parameters(params_path)
    contract = check_parameters(params)
    text = params.text or {}
    items = screen_inputs(images, prompts, text.get("prompt"), list(text.get("expect") or []))
    out = Path(out).resolve() if out else default_screen_dir(params)
    with run_lock(out):
        job = _job(params, out)
        _claim(out, params, job)
        todo = missing(job, items)
        total = sum(len(pending) for pending in todo.values())
        log(f"screen {params.name}: {len(items)} input(s) x {len(job.specs)} runtime(s) -> {out} ({total} to capture)")
        started = time.perf_counter()
        captured = _capture(job, items, total, scheduler, advance, log)
        capture_s = time.perf_counter() - started
        results, judged = [], 0
        for item in items:
            path = result_path(out, item.key)
            if path.exists():
                results.append(json.loads(path.read_text()))
                continue
            result = judge_input(job, item, contract)
            write_json_atomic(path, result)
            results.append(result)
            judged += 1
        ranked = rank(results)
        data = _summary(params, job, ranked, capture_s, captured)
        write_screen(out, {**data, "status": "running" if investigate else "complete"})
        write_table(out, ranked)
        from driftscope.screen.page import write_page

        page = write_page(out, data, items)
        investigations = []
        if investigate and top > 0:
            from driftscope.screen.investigate import investigate_top

            investigations = investigate_top(params, ranked, {i.key: i for i in items}, top, out, render, log)
            data["investigations"] = investigations
            write_screen(out, {**data, "status": "complete"})
            page = write_page(out, data, items)
        log(f"screen: {page}")
        return ScreenResult(out, ranked, investigations, captured, judged, page)


def _capture(job: Job, items: list[ScreenInput], total: int, scheduler, advance, log) -> int:
    if total == 0:
        return 0
    if scheduler:
        from driftscope.screen.distributed import capture_on_cluster

        return capture_on_cluster(job, items, scheduler, total, advance, log)
    if advance is not None:
        return capture_all(job, items, advance, log)
    from driftscope.screen.progress import screen_progress

    with screen_progress(total) as bar:
        return capture_all(job, items, bar, log)


def _summary(params: Parameters, job: Job, ranked: list[dict], capture_s: float, captured: int) -> dict:
    return {
        "status": "running",
        "name": params.name,
        "parameters_file": params.source,
        "parameters_digest": params.digest,
        "parameters": params.to_dict(),
        "commit": current_commit(project_root(params.source)),
        "environment": fingerprint(),
        "checkpoint": str(job.checkpoint.path),
        "family": job.checkpoint.family,
        "reference": job.reference,
        "candidates": [spec.display for spec in job.specs[1:]],
        "stages": job.plan.ids(),
        "score": {"terms": list(SCORE_TERMS), "doc": "driftscope.screen.score (docs/guide/screening.md)"},
        "timings": {"capture_s": capture_s, "captured": captured},
        "inputs": ranked,
        "ranking": [entry["key"] for entry in ranked],
        "investigations": [],
    }
