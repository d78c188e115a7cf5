"""Runtimes register by name through the ``driftscope.runtimes`` entry-point group, the way papermill registers
engines: the built-in ones (transformers, mlx, jax, iree, tapfile) in driftscope's own pyproject.toml, a plugin's
in its package's (docs/plugins.md). Each is a :class:`~driftscope.capture.runtimes.base.Runtime` subclass,
imported when a parameter file first names it."""

from __future__ import annotations

from driftscope.capture.runtimes.base import Runtime
from driftscope.core.registry import Registry

RUNTIMES: Registry[type[Runtime]] = Registry(
    "runtime", group="driftscope.runtimes", accepts=lambda entry: isinstance(entry, type) and issubclass(entry, Runtime)
)


def get_runtime(name: str) -> type[Runtime]:
    """The runtime class registered as ``name`` (an unknown name lists the valid ones)."""
    return RUNTIMES.get(name)
