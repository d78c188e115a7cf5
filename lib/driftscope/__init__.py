"""driftscope: find where, and why, two runtimes of the same vision-language model stop agreeing.

The package reads as its pipeline, one layer a subpackage, lower never importing higher (checked by
``lint-imports`` in CI; docs/architecture.md draws it): ``core`` -> ``model`` -> ``inputs`` -> ``taps`` ->
``families`` -> ``capture`` -> ``judge`` -> ``replay`` -> ``run`` -> ``batch`` -> ``views``, and ``cli``.
"""

from __future__ import annotations

from .errors import DriftscopeError

__version__ = "0.1.0"

__all__ = ["DriftscopeError", "__version__", "investigate", "open_run"]


def investigate(*args, **kwargs):
    """Run (or reuse) an investigation; see ``driftscope.run.investigation.investigate``."""
    from .run.investigation import investigate as _investigate

    return _investigate(*args, **kwargs)


def open_run(path):
    """A finished run's taps, rows and report by name: ``open_run(dir)["mlx:f32"]["vision.block.5"]`` (numpy,
    memory-mapped); see ``driftscope.run.access``."""
    from .run.access import open_run as _open_run

    return _open_run(path)
