"""Freeing what a runtime dropped: by reference counting where that frees it, by a full collection where not.

A full ``gc.collect()`` walks every object of the process: ~0.25 s once torch and transformers are imported
(docs/benchmarks.md, "Releasing a model"), paid at every model release. Reference counting frees an object the
moment its last reference goes, unless it sits in a reference cycle (a family's loading code may leave one
behind; a hypothesis patch that binds a method to its module makes one): so the collection runs only when a
watched object outlived its reference, and what a runtime releases is freed before the next model loads either
way. What was freed is then given back to the operating system (:func:`give_back`), so the next model's load
does not sit beside the heap pages the last one left.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
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
    """A full garbage collection unless every watched object is gone already, then the freed memory given back to
    the operating system (:func:`give_back`); whether a collection ran."""
    collected = watched is None or any(ref() is not None for ref in watched)
    if collected:
        gc.collect()
    give_back()
    return collected


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None (another C library: macOS, musl)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def give_back() -> bool:
    """Return the C heap's free pages to the operating system (glibc's ``malloc_trim(0)``); whether it could.

    A model's weights are freed into the C heap, and glibc keeps what it cannot release from the top of an arena:
    after a run's candidate had held the 7B shape's 16 GiB of bfloat16 weights, most of it stayed resident beside
    the next candidate's load (a run killed for memory on 24 GiB; docs/benchmarks-history.md, 2026-12-04). Trimming
    releases every free page, wherever it sits."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
