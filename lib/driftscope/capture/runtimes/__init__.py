"""Runtimes register by name (the way papermill registers engines)."""

from __future__ import annotations

from driftscope.capture.runtimes.base import Runtime
from driftscope.core.registry import Registry

RUNTIMES: Registry[type[Runtime]] = Registry("runtime")


def _register_builtin() -> None:
    from driftscope.capture.runtimes.compiled import IreeRuntime, JaxRuntime
    from driftscope.capture.runtimes.mlx_runtime import MLXRuntime
    from driftscope.capture.runtimes.tapfile_runtime import TapfileRuntime
    from driftscope.capture.runtimes.transformers_runtime import TransformersRuntime

    for runtime in (TransformersRuntime, MLXRuntime, JaxRuntime, IreeRuntime, TapfileRuntime):
        RUNTIMES.register(runtime.name, runtime)


_register_builtin()


def get_runtime(name: str) -> type[Runtime]:
    """The runtime class registered as ``name`` (an unknown name lists the valid ones)."""
    return RUNTIMES.get(name)
