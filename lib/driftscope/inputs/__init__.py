"""Layer 2, what every runtime is fed: the processor output (``processor_output``), text inputs and the
inputs an engine outside Python reads (``engine_inputs``).

``from driftscope.inputs import ModelInputs`` (the module this package replaced) keeps working.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    from . import processor_output

    try:
        return getattr(processor_output, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
