"""driftscope: find where, and why, two runtimes of the same vision-language model stop agreeing."""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import DriftscopeError  # noqa: E402

__all__ = ["DriftscopeError", "__version__", "investigate"]


def investigate(*args, **kwargs):
    """Run (or reuse) an investigation; see ``driftscope.investigation.investigate``."""
    from .investigation import investigate as _investigate

    return _investigate(*args, **kwargs)
