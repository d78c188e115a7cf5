"""Watching every call of an MLX model's modules without changing them: each watched object's class ``__call__`` is
wrapped for the duration (an instance is known by identity, so calls through attributes, lists or local names are
all seen), and put back afterwards."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from .outputs import call_input, output_at

#: ``on_call(path, module, args, kwargs, call) -> output``: runs the module (``call()``) and may record around it
OnCall = Callable[[str, Any, tuple, dict, Callable[[], Any]], Any]


def is_array(value: Any) -> bool:
    import mlx.core as mx

    return isinstance(value, mx.array)


def first_array(value: Any):
    """The first MLX array in a module's output (an array, a tuple or list, a dict or a dataclass of fields)."""
    return output_at(value, None, is_array)


def output_array(value: Any, item: list | tuple | None = None):
    """The array a module's output holds at ``item`` (the probe's ``out_item``), else its first array."""
    return output_at(value, item, is_array)


def main_input(args: tuple, kwargs: dict, keywords: tuple[str, ...] = ()):
    """A module call's main input: its first positional array, else the first of ``keywords`` holding one, else any
    array keyword."""
    return call_input(args, kwargs, is_array, keywords)


def _defining_class(cls: type) -> type | None:
    """The class whose ``__call__`` an instance of ``cls`` runs (None: it has none, so it is never called; a
    builtin's cannot be wrapped)."""
    klass = next((klass for klass in cls.__mro__ if "__call__" in vars(klass)), None)
    if klass is not None and klass.__module__ == "builtins":
        raise TypeError(
            f"a {cls.__name__} cannot be watched by its class's call (a function or builtin): tap what calls it"
        )
    return klass


@contextmanager
def watched(targets: Mapping[str, Any], on_call: OnCall) -> Iterator[dict[int, str]]:
    """Route every call of the objects of ``targets`` (path -> a module, or any object of a Python class with a
    ``__call__``) through ``on_call`` with its path; an object already inside its own call (a subclass calling
    ``super().__call__``) is not routed twice. Yields ``id(object) -> path``."""
    paths = {id(target): path for path, target in targets.items()}
    classes = {_defining_class(type(target)) for target in targets.values()}
    classes.discard(None)
    originals = {klass: vars(klass)["__call__"] for klass in classes}
    active: set[int] = set()

    def wrap(original):
        def __call__(self, *args, **kwargs):
            key = id(self)
            if key not in paths or key in active:
                return original(self, *args, **kwargs)
            active.add(key)
            try:
                return on_call(paths[key], self, args, kwargs, lambda: original(self, *args, **kwargs))
            finally:
                active.discard(key)

        return __call__

    for klass, original in originals.items():
        klass.__call__ = wrap(original)
    try:
        yield paths
    finally:
        for klass, original in originals.items():
            klass.__call__ = original
