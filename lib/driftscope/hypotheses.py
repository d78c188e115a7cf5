"""The ready hypothesis patches by name: ``patch: driftscope.hypotheses:NAME`` in a parameter file.

``NAME`` stands for the patch of that name of the family being patched (each family keeps its own in
``families/<family>/hypotheses.py``; :mod:`driftscope.families.hypotheses` picks the one that applies). A patch
file may import them too: ``from driftscope.hypotheses import norm2_in_float32``. ``names()`` lists them.
"""

from __future__ import annotations

from driftscope.families import hypotheses as _family_patches
from driftscope.families.hypotheses import hypotheses_of, names

__all__ = ["hypotheses_of", "names"]


def __getattr__(name: str):
    """The ready patch ``name`` (of whichever family is being patched when it is called)."""
    return getattr(_family_patches, name)
