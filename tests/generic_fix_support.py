"""The sweep's investigation of one model type's tester checkpoint (``driftscope sweep``'s parameters: transformers
f32 against MLX f32, strict contract, every substage), with ready patches on either runtime: what the tests of the
generic family's fixes (``families/generic/fixes``) run before and after a patch."""

from __future__ import annotations

from pathlib import Path


def sweep_run(model_type: str, out: Path, mlx: str | None = None, transformers: str | None = None):
    """The report of the sweep's run on ``model_type``, ``mlx`` / ``transformers`` naming a ready patch
    (``driftscope.hypotheses:NAME``) for that runtime."""
    from driftscope.batch.sweep import parameters
    from driftscope.core.paths import REPO_ROOT
    from driftscope.run.investigation import investigate
    from driftscope.run.params import parse_parameters
    from make_generic_tinies import ensure

    params = parameters(model_type, ensure(model_type))
    for index, patch in enumerate((transformers, mlx)):
        if patch:
            params["runtimes"][index] = {**params["runtimes"][index], "patch": f"driftscope.hypotheses:{patch}"}
    return investigate(parse_parameters(params, source=None, base=REPO_ROOT), out)


def first_divergence(report) -> str | None:
    found = (report.data.get("first_divergence") or {}).get("mlx:f32")
    return found["stage"] if found else None


def conclusion(report) -> dict:
    return report.conclusion("mlx:f32")


def rows(report) -> dict[str, dict]:
    """The mlx pair's comparison rows by stage."""
    return {row["stage"]: row for row in report.data["rows"] if row.get("pair") == "mlx:f32"}
