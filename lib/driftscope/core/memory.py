"""Freeing what a runtime dropped: by reference counting where that frees it, by a full collection where not.

A full ``gc.collect()`` walks every object of the process: ~0.25 s once torch and transformers are imported
(docs/benchmarks.md, "Releasing a model"), paid at every model release. Reference counting frees an object the
moment its last reference goes, unless it sits in a reference cycle (a family's loading code may leave one
behind; a hypothesis patch that binds a method to its module makes one): so the collection runs only when a
watched object outlived its reference, and what a runtime releases is freed before the next model loads either
way.
"""

from __future__ import annotations

import gc
import weakref


def watch(*objects: object) -> list[weakref.ref] | None:
    """Weak references to ``objects``, or None (then :func:`free` always collects) when there is nothing to
    watch or one of them cannot be weakly referenced."""
    try:
        watched = [weakref.ref(value) for value in objects]
    except TypeError:
        return None
    return watched or None


def free(watched: list[weakref.ref] | None) -> bool:
    """A full garbage collection unless every watched object is gone already; whether one ran."""
    if watched is not None and all(ref() is None for ref in watched):
        return False
    gc.collect()
    return True
