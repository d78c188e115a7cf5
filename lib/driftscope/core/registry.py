"""One registry shape for every extension axis (runtimes, families, policies), as papermill does for engines.

A registry with an entry-point ``group`` (``driftscope.runtimes``, ``driftscope.families``) also holds what every
installed distribution declares there, driftscope's own built-ins included (its pyproject.toml), loaded when a
name is first asked for: a plugin package plugs in by being installed (docs/plugins.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint, entry_points
from typing import Generic, TypeVar

from driftscope.errors import RegistryError

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> entry. ``get`` of an unknown name lists the valid ones."""

    def __init__(self, kind: str, group: str | None = None, accepts: Callable[[object], bool] | None = None):
        self.kind = kind
        self.group = group
        self._accepts = accepts
        self._entries: dict[str, T] = {}
        self._pending: dict[str, EntryPoint] = {}
        self._found = group is None

    def register(self, name: str, entry: T) -> T:
        self._entries[name] = entry
        self._pending.pop(name, None)
        return entry

    def decorator(self, name: str) -> Callable[[T], T]:
        def wrap(entry: T) -> T:
            return self.register(name, entry)

        return wrap

    def _find(self) -> None:
        """The group's entry points, once (the first distribution that declares a name keeps it)."""
        if self._found:
            return
        self._found = True
        for point in entry_points(group=self.group):
            if point.name not in self._entries and point.name not in self._pending:
                self._pending[point.name] = point

    def _load(self, name: str) -> T:
        point = self._pending[name]
        where = f"entry point {point.value!r} of {point.dist.name if point.dist else 'an installed package'}"
        try:
            entry = point.load()
        except Exception as err:  # noqa: BLE001 - any import error of a plugin is named with its source
            raise RegistryError(
                f"{self.kind} {name!r} ({where}, group {self.group}) could not be loaded: {type(err).__name__}: {err}",
                "fix or uninstall the package that provides it",
            ) from err
        if self._accepts is not None and not self._accepts(entry):
            raise RegistryError(
                f"{self.kind} {name!r} ({where}) is a {type(entry).__name__}, not a {self.kind}",
                "point the entry point at a Runtime subclass (driftscope.runtimes) or a Family (driftscope.families)",
            )
        return self.register(name, entry)

    def get(self, name: str) -> T:
        self._find()
        if name in self._pending:
            return self._load(name)
        try:
            return self._entries[name]
        except KeyError:
            raise RegistryError(
                f"unknown {self.kind} {name!r}",
                f"use one of: {', '.join(self.names())}",
            ) from None

    def loadable(self) -> Iterator[T]:
        """Every entry that loads; one that cannot is warned about and left out (a broken plugin must not hide the
        others)."""
        for name in self.names():
            try:
                yield self.get(name)
            except RegistryError as err:
                warnings.warn(str(err), RuntimeWarning, stacklevel=2)

    def names(self) -> list[str]:
        self._find()
        return sorted({*self._entries, *self._pending})

    def __contains__(self, name: object) -> bool:
        self._find()
        return name in self._entries or name in self._pending

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
