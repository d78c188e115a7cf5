"""Ready-made hypothesis patches by name: ``patch: driftscope.hypotheses:NAME`` in a parameter file.

Each family keeps its own (``families/<family>/hypotheses.py``); a name here stands for the patch of
that name of the family being patched, which the runtime sets while it applies a patch
(:func:`hypotheses_of`). A patch file may also import them: ``from driftscope.families.hypotheses import NAME``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from driftscope.errors import HypothesisPatchError

_FAMILY: ContextVar[str | None] = ContextVar("driftscope_hypotheses_family", default=None)


@contextmanager
def hypotheses_of(family: str) -> Iterator[None]:
    """Within this block, ``driftscope.families.hypotheses.NAME`` is ``family``'s patch of that name."""
    token = _FAMILY.set(family)
    try:
        yield
    finally:
        _FAMILY.reset(token)


def _families() -> list[Any]:
    from driftscope.families import FAMILIES

    return [FAMILIES.get(name) for name in FAMILIES]


class _FamilyPatch:
    """The patch ``name`` of whichever family is being patched when it is called."""

    def __init__(self, name: str, doc: str | None):
        self.__name__ = self.__qualname__ = name
        self.__doc__ = doc

    def target(self) -> Any:
        family = _FAMILY.get()
        candidates = [f for f in _families() if family is None or f.name == family]
        for candidate in candidates:
            function = getattr(candidate.hypothesis_module(), self.__name__, None)
            if callable(function):
                return function
        raise HypothesisPatchError(
            f"model family {family!r} has no ready hypothesis patch {self.__name__!r}",
            f"use one of: {', '.join(names(family)) or 'none'}, or write your own 'file.py:function'",
        )

    def __call__(self, model: Any, **kwargs: Any) -> Any:
        return self.target()(model, **kwargs)


def names(family: str | None = None) -> list[str]:
    """The ready patches of ``family`` (of every family when None)."""
    found = set()
    for candidate in _families():
        if family is None or candidate.name == family:
            module = candidate.hypothesis_module()
            found |= {name for name in getattr(module, "__all__", ()) if callable(getattr(module, name, None))}
    return sorted(found)


def __getattr__(name: str) -> _FamilyPatch:
    if name.startswith("__") or name not in names():
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    family = _FAMILY.get()
    docs = [
        getattr(candidate.hypothesis_module(), name).__doc__
        for candidate in _families()
        if (family is None or candidate.name == family) and hasattr(candidate.hypothesis_module(), name)
    ]
    return _FamilyPatch(name, docs[0] if docs else None)
