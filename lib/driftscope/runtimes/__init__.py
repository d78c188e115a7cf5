"""Runtimes register by name (the way papermill registers engines)."""

from __future__ import annotations

from ..registry import Registry
from .base import Runtime

RUNTIMES: Registry[type[Runtime]] = Registry("runtime")


def _register_builtin() -> None:
    from .compiled import IreeRuntime, JaxRuntime
    from .mlx_runtime import MLXRuntime
    from .tapfile_runtime import TapfileRuntime
    from .transformers_runtime import TransformersRuntime

    for runtime in (TransformersRuntime, MLXRuntime, JaxRuntime, IreeRuntime, TapfileRuntime):
        RUNTIMES.register(runtime.name, runtime)


_register_builtin()


def get_runtime(name: str) -> type[Runtime]:
    """The runtime class registered as ``name`` (an unknown name lists the valid ones)."""
    return RUNTIMES.get(name)
