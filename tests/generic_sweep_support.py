"""The sweep's investigation of one model type's tiny checkpoint (transformers f32 against mlx f32, strict), with a
ready patch on the mlx runtime where asked: what the generic family's fix tests run."""

from __future__ import annotations

import copy
from pathlib import Path

from conftest import ROOT


def investigate_sweep(model_type: str, folder: Path, patch: str | None = None, forced: str | None = None, **kwargs):
    """The report of ``driftscope sweep``'s run of ``model_type`` into ``folder``; ``patch`` (``NAME`` of
    ``driftscope.hypotheses``) with ``kwargs`` on the mlx runtime; ``forced``: its ``text.forced`` (default: the
    sweep's own, ``always``)."""
    from driftscope.batch.sweep import parameters
    from driftscope.run.investigation import investigate
    from driftscope.run.params import parse_parameters

    spec = copy.deepcopy(parameters(model_type, ROOT / "fixtures" / "checkpoints" / f"generic-{model_type}"))
    if patch is not None:
        spec["runtimes"][1]["patch"] = {"callable": f"driftscope.hypotheses:{patch}", "kwargs": kwargs}
    if forced is not None:
        spec["text"]["forced"] = forced
    report = investigate(parse_parameters(spec, source=None, base=ROOT), folder)
    report.folder = folder
    return report


def rows(report) -> dict[str, dict]:
    """The report's rows by stage."""
    return {row["stage"]: row for row in report.data["rows"]}


def conclusion(report) -> dict:
    return report.data["conclusions"]["mlx:f32"]


def verdict(report) -> str:
    return report.data["verdict"]["per_candidate"]["mlx:f32"]
