"""One registry shape for every extension axis (runtimes, families, policies), as papermill does for engines."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from driftscope.errors import RegistryError

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> entry. ``get`` of an unknown name lists the valid ones."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T) -> T:
        self._entries[name] = entry
        return entry

    def decorator(self, name: str) -> Callable[[T], T]:
        def wrap(entry: T) -> T:
            return self.register(name, entry)

        return wrap

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise RegistryError(
                f"unknown {self.kind} {name!r}",
                f"use one of: {', '.join(sorted(self._entries))}",
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))
