"""The full investigation of the inputs that deviate most: each a normal run directory under the screen's
``runs/<input key>/``, from a parameter file written there (the screen's parameters with that input's images,
prompt and expected words; every path absolute), so its notebooks and ``driftscope run`` read the same run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from driftscope.core.atomic import write_text_atomic
from driftscope.core.names import safe_name
from driftscope.run.params import Parameters, load_parameters


def _absolute_patch(spec: dict, runtime) -> dict:
    patch = runtime.patch
    if patch is None:
        return spec
    module, sep, attr = patch.target.rpartition(":")
    if sep and module.endswith(".py") and not Path(module).is_absolute() and patch.root is not None:
        spec["patch"] = {"callable": f"{(Path(patch.root) / module).resolve()}:{attr}", "kwargs": patch.kwargs}
    return spec


def input_parameters(params: Parameters, item, out: Path) -> Path:
    """Write the parameter file of ``item``'s investigation into ``out`` and return its path."""
    data = params.to_dict()
    data.update(
        name=safe_name(f"{params.name}-{item.key}"),
        description=f"screen of {params.name}: {item.label}",
        checkpoint=str(Path(params.checkpoint).resolve()),
        images=[str(Path(path).resolve()) for path in item.images],
        contract=None if params.contract is None else str(Path(params.contract).resolve()),
        runtimes=[_absolute_patch(spec.to_dict(), spec) for spec in params.runtimes],
    )
    if data.get("text"):
        data["text"] = dict(data["text"])
        if item.prompt:
            data["text"]["prompt"] = item.prompt
        if item.expect:
            data["text"]["expect"] = list(item.expect)
    for key in ("contract", "family", "relative", "power", "text"):
        if data.get(key) is None:
            data.pop(key, None)
    for spec in data["runtimes"]:
        if spec.get("patch") is None:
            spec.pop("patch", None)
    path = Path(out) / "parameters.yaml"
    write_text_atomic(path, yaml.safe_dump(data, sort_keys=False))
    return path


def investigate_top(
    params: Parameters, ranked: list[dict], items: dict, top: int, out: Path, render: bool, log: Callable[[str], None]
) -> list[dict]:
    """Investigate the ``top`` highest-scoring judged inputs (score above 0); one entry per investigation."""
    from driftscope.run.report import Report

    chosen = [entry for entry in ranked if entry.get("score") and entry["score"] > 0][:top]
    done = []
    for rank, entry in enumerate(chosen, 1):
        item = items[entry["key"]]
        run_dir = Path(out) / "runs" / item.key
        run_dir.mkdir(parents=True, exist_ok=True)
        path = input_parameters(params, item, run_dir)
        run_params = load_parameters(path)
        log(f"investigating #{rank} {item.label} (score {entry['score']:.3f}) -> {run_dir}")
        errors: dict = {}
        try:
            if render:
                from driftscope.views.render_process import investigate_and_render

                errors = investigate_and_render(run_params, path, run_dir, True, Path.cwd(), log)
            else:
                from driftscope.run.investigation import investigate

                investigate(run_params, run_dir, reuse=True)
        except Exception as err:  # noqa: BLE001 - one failed investigation is recorded; the others still run
            errors = {"investigation": f"{type(err).__name__}: {err}"}
        summary = {"key": item.key, "rank": rank, "dir": f"runs/{item.key}", "errors": errors}
        report_path = run_dir / "report.json"
        if report_path.exists():
            report = Report.load(report_path)
            summary.update(
                verdict=report.verdict,
                first_divergence={
                    pair: (first or {}).get("stage")
                    for pair, first in (report.data.get("first_divergence") or {}).items()
                },
                first_failures={  # how many elements fail there: one of 65,536 reads otherwise as a whole stage
                    pair: [first["failures"], first["elements"]]
                    for pair, first in (report.data.get("first_divergence") or {}).items()
                    if first and first.get("elements")
                },
                conclusions={
                    label: conclusion.get("text")
                    for label, conclusion in (report.data.get("conclusions") or {}).items()
                },
                pages=sorted(p.name for p in run_dir.glob("*.html")),
            )
        done.append(summary)
    return done
