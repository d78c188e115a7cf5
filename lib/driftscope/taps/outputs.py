"""Where an array sits in what a module returns (an array, a tuple or list, a dict or a transformers ModelOutput, a
dataclass of fields), and which argument of a call is its main input: the same walk for torch tensors and MLX
arrays, told apart by an ``is_array`` test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _items(value: Any) -> list[tuple[Any, Any]] | None:
    """``(key, item)`` of a dict (a transformers ModelOutput: its set fields), a tuple or list, or a dataclass's
    fields; None when ``value`` is none of them."""
    if isinstance(value, dict):
        return list(value.items())
    if isinstance(value, tuple | list):
        return list(enumerate(value))
    if hasattr(value, "__dataclass_fields__"):
        return [(name, getattr(value, name)) for name in value.__dataclass_fields__]
    return None


def leaves(value: Any, is_array: Callable[[Any], bool], depth: int = 0, where: tuple = ()) -> list[tuple[tuple, Any]]:
    """Every array in a module's output with where it sits (keys into dicts, tuples, lists or dataclass fields, at
    most three levels deep), in order."""
    if is_array(value):
        return [(where, value)]
    items = None if depth > 2 or value is None else _items(value)
    return [found for key, item in items or () for found in leaves(item, is_array, depth + 1, (*where, key))]


def output_at(value: Any, item: list | tuple | None, is_array: Callable[[Any], bool]) -> Any:
    """The array a module's output holds at ``item`` (keys, as :func:`leaves` gives them: the probe's
    ``out_item``), else its first array (None: it holds none)."""
    if item is None:
        found = leaves(value, is_array)
        return found[0][1] if found else None
    for key in item:
        value = value[key] if isinstance(value, dict | tuple | list) else getattr(value, key)
    return value


def call_input(args: tuple, kwargs: dict, is_array: Callable[[Any], bool], keywords: tuple[str, ...] = ()) -> Any:
    """A module call's main input: its first positional array, else the first of ``keywords`` holding one (the names
    a model's library passes it by), else any array keyword (None: the call has none)."""
    found = output_at(tuple(args), None, is_array) if args else None
    if found is not None:
        return found
    for name in keywords:
        if is_array(kwargs.get(name)):
            return kwargs[name]
    return next((value for value in kwargs.values() if is_array(value)), None)
