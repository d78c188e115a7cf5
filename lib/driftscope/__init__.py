"""driftscope: find where, and why, two runtimes of the same vision-language model stop agreeing.

The package reads as its pipeline, one layer a subpackage, lower never importing higher (checked by
``lint-imports`` in CI; docs/architecture.md draws it): ``core`` -> ``model`` -> ``inputs`` -> ``taps`` ->
``families`` -> ``capture`` -> ``judge`` -> ``replay`` -> ``run`` -> ``batch`` -> ``views``, and ``cli``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"

from .errors import DriftscopeError  # noqa: E402

__all__ = ["DriftscopeError", "__version__", "investigate", "open_run"]

#: Where each module of the old flat package lives now. ``import driftscope.recapture``,
#: ``from driftscope.checkpoint import open_checkpoint`` and patch targets like ``driftscope.hypotheses:NAME``
#: keep working (the same module object under both names); every old name but ``hypotheses`` (the documented
#: home of the ready patches) warns once with the new one.
MOVED = {
    "registry": "core.registry",
    "atomic": "core.atomic",
    "markup": "core.markup",
    "names": "core.names",
    "storage": "core.storage",
    "worktree": "core.worktree",
    "checkpoint": "model.checkpoint",
    "checkpoint_storage": "model.checkpoint_storage",
    "weightfile": "model.weightfile",
    "precision": "model.precision",
    "tf32": "model.tf32",
    "blas": "model.blas",
    "synthetic": "model.synthetic",
    "quant": "model.quant",
    "quant.policy": "model.quant.policy",
    "quant.select": "model.quant.select",
    "quant.affine": "model.quant.affine",
    "quant.host": "model.quant.host",
    "quant.mlx_checkpoint": "model.quant.mlx_checkpoint",
    "quant.directory": "model.quant.directory",
    "quant.dense_checkpoint": "model.quant.dense_checkpoint",
    "quant.names": "model.quant.names",
    "quant.profiles": "model.quant.profiles",
    "engine_inputs": "inputs.engine_inputs",
    "text_inputs": "inputs.text_inputs",
    "stages": "taps.stages",
    "tapset": "taps.tapset",
    "sidecar": "taps.sidecar",
    "tapunion": "taps.tapunion",
    "compiled": "taps.jax",
    "compiled.graph": "taps.jax.graph",
    "compiled.layers": "taps.jax.layers",
    "hypotheses": "families.hypotheses",
    "runtimes": "capture.runtimes",
    "runtimes.base": "capture.runtimes.base",
    "runtimes.compiled": "capture.runtimes.compiled",
    "runtimes.mlx_runtime": "capture.runtimes.mlx_runtime",
    "runtimes.tapfile_runtime": "capture.runtimes.tapfile_runtime",
    "runtimes.transformers_runtime": "capture.runtimes.transformers_runtime",
    "compiled.iree": "capture.iree",
    "runtime_checks": "capture.runtime_checks",
    "patches": "capture.patches",
    "quant.loading": "capture.quantized",
    "quant.linear_replay": "capture.linear_replay",
    "quant.linear_controls": "capture.linear_controls",
    "stage_listing": "capture.stage_listing",
    "contract": "judge.contract",
    "compare": "judge.compare",
    "layout": "judge.layout",
    "traversal": "judge.traversal",
    "rows": "judge.rows",
    "relative": "judge.relative",
    "answer": "judge.answer",
    "lineage": "judge.lineage",
    "quant.attribution": "judge.attribution",
    "power": "replay.power",
    "params": "run.params",
    "preflight": "run.preflight",
    "investigation": "run.investigation",
    "report": "run.report",
    "runrecord": "run.runrecord",
    "runlock": "run.runlock",
    "outdirs": "run.outdirs",
    "environment": "run.environment",
    "candidates": "run.candidates",
    "recapture": "run.patch_trial",
    "executor": "batch.executor",
    "worker": "batch.worker",
    "views.evidence": "batch.evidence",
    "render": "views.render",
}
PUBLIC_ALIASES = {"hypotheses"}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``driftscope.<old name>`` and hands out the module at its new place."""

    def find_spec(self, fullname, path=None, target=None):
        old = fullname.removeprefix(__name__ + ".")
        if fullname == old or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        old = spec.name.removeprefix(__name__ + ".")
        if old not in PUBLIC_ALIASES:
            warnings.warn(
                f"{spec.name} moved to {__name__}.{MOVED[old]}; import it from there",
                DeprecationWarning,
                stacklevel=2,
            )
        return importlib.import_module(f"{__name__}.{MOVED[old]}")

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _MovedModules())  # first: an old package name must not find its new folder's files


def investigate(*args, **kwargs):
    """Run (or reuse) an investigation; see ``driftscope.run.investigation.investigate``."""
    from .run.investigation import investigate as _investigate

    return _investigate(*args, **kwargs)


def open_run(path):
    """A finished run's taps, rows and report by name: ``open_run(dir)["mlx:f32"]["vision.block.5"]`` (numpy,
    memory-mapped); see ``driftscope.run.access``."""
    from .run.access import open_run as _open_run

    return _open_run(path)
