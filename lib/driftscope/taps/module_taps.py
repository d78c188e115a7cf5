"""Stages declared on modules: "stage S is the output (or the input) of the module at this path, in this form",
tapped on transformers with forward hooks and on MLX by watching the module's class call (``mlx_calls.watched``:
the instance known by identity, so a patch's or an experiment's wrapper found at the path is what is tapped).

A family writes a table of :class:`ModuleTap` (a stage id, a :class:`Port` on each side) and hands it, with the
root module the paths start from, to :func:`tapped`; what no module gives (a function's result, a call's keyword
arguments, a slice of a value the forward never hands a module) stays the family's own code, and ``before`` runs
its hand-written part at a module's call (e.g. which block is running, the bounds it was given).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

#: a numpy function taking the array a port read to the stage's value (rows, a slice, heads split out, a layout)
Select = Callable[[np.ndarray], np.ndarray]
#: ``record(stage_id, value, native_dtype)``: the value (None: the module gave no array, or the stage is not wanted)
Record = Callable[[str, "np.ndarray | None", "str | None"], None]
#: ``before(args, kwargs)``: run at a module's call, before it runs
Before = Callable[[tuple, dict], None]
#: ``lookup(path) -> module or None``: how a side's paths are found (default: attributes and list items from a root)
Lookup = Callable[[str], Any]


@dataclass(frozen=True)
class Port:
    """Where one side reads a stage: the module at ``path`` (dotted from the root; list items by number); its output
    (``item``: where in what it returns, None its first array) or, with ``input``, its input (``index``: that
    positional argument, None the call's main input); then ``select``."""

    path: str
    input: bool = False
    index: int | None = None
    item: tuple | None = None
    select: Select | None = None

    def value(self, array: np.ndarray) -> np.ndarray:
        return array if self.select is None else self.select(array)


def output(path: str, select: Select | None = None, item: tuple | None = None) -> Port:
    """The output of the module at ``path`` (at ``item`` in what it returns)."""
    return Port(path, item=item, select=select)


def argument(path: str, select: Select | None = None, index: int | None = None) -> Port:
    """The input of the module at ``path`` (its positional argument ``index``; None: its main input)."""
    return Port(path, input=True, index=index, select=select)


@dataclass(frozen=True)
class ModuleTap:
    """A stage and where each side reads it (None: that side's family code writes it by hand)."""

    stage: str
    torch: Port | None = None
    mlx: Port | None = None

    def side(self, side: str) -> Port | None:
        return self.torch if side == "torch" else self.mlx


def both(stage: str, port: Port) -> ModuleTap:
    """A stage read at the same port on both sides (the two libraries name the module alike)."""
    return ModuleTap(stage, port, port)


def each(count: int, *taps: ModuleTap) -> list[ModuleTap]:
    """``taps`` once per index below ``count``: ``{i}`` in stage ids and paths is the index (a block's taps)."""

    def at(port: Port | None, index: int) -> Port | None:
        return None if port is None else replace(port, path=port.path.format(i=index))

    return [
        ModuleTap(tap.stage.format(i=index), at(tap.torch, index), at(tap.mlx, index))
        for index in range(count)
        for tap in taps
    ]


def resolve(root: Any, path: str) -> Any:
    """What ``root``'s forward reaches at ``path``: attributes (an instance attribute a patch put first), list
    and tuple items by number, dict keys; None where nothing is there."""
    found = root
    for name in path.split(".") if path else ():
        if isinstance(found, list | tuple):
            found = found[int(name)] if name.isdigit() and int(name) < len(found) else None
        elif type(found) is dict:
            found = found.get(name)
        else:
            found = getattr(found, name, None)
        if found is None:
            return None
    return found


class _Module:
    """One tapped module: what runs before its call, the stages read from its input and from its output."""

    def __init__(self, module: Any):
        self.module = module
        self.before: list[Before] = []
        self.inputs: list[tuple[str, Port]] = []
        self.outputs: list[tuple[str, Port]] = []


def _modules(ports: Iterable[tuple[str, Port]], before: Mapping[str, Before], find: Lookup) -> dict[str, _Module]:
    """The modules the ports and ``before`` name (a path that finds nothing is left out), by the first path each
    module is found at (one module at two paths is tapped once)."""
    by_id: dict[int, _Module] = {}
    by_path: dict[str, _Module] = {}

    def at(path: str) -> _Module | None:
        module = find(path)
        if module is None:
            return None
        if id(module) not in by_id:
            by_id[id(module)] = by_path[path] = _Module(module)
        return by_id[id(module)]

    for path, hook in before.items():
        if (found := at(path)) is not None:
            found.before.append(hook)
    for stage, port in ports:
        if (found := at(port.path)) is not None:
            (found.inputs if port.input else found.outputs).append((stage, port))
    return by_path


class _Writer:
    """What both engines do at a tapped module's call: its input stages, then its ``before`` code; once it returns,
    its output stages. A stage ``wants`` refuses is recorded as None, its array never converted."""

    def __init__(self, record: Record, wants: Callable[[str], bool], convert, dtype, main_input, output_of):
        self.record, self.wants, self.convert, self.dtype = record, wants, convert, dtype
        self.main_input, self.output_of = main_input, output_of

    def _put(self, stage: str, port: Port, array: Any) -> None:
        if array is None or not self.wants(stage):
            self.record(stage, None, None)
        else:
            self.record(stage, port.value(self.convert(array)), self.dtype(array))

    def called(self, tapped: _Module, args: tuple, kwargs: dict) -> None:
        for stage, port in tapped.inputs:
            if port.index is None:
                self._put(stage, port, self.main_input(args, kwargs))
            else:
                self._put(stage, port, args[port.index] if port.index < len(args) else None)
        for run in tapped.before:
            run(args, kwargs)

    def returned(self, tapped: _Module, out: Any) -> None:
        for stage, port in tapped.outputs:
            self._put(stage, port, self.output_of(out, port.item))


@contextmanager
def tap_ports(
    side: str,
    root: Any,
    ports: Iterable[tuple[str, Port]],
    record: Record,
    wants: Callable[[str], bool] = lambda stage: True,
    before: Mapping[str, Before] | None = None,
    lookup: Lookup | None = None,
    keywords: tuple[str, ...] = (),
) -> Iterator[Callable[[], None]]:
    """Each ``(stage, port)`` of ``side``'s model (``root``: where the paths start; ``lookup``: another way to find
    a path's module) written through ``record``; ``before``: code run at a module's call; ``keywords``: the names a
    call's main input may be passed by, in the order they are looked for. Transformers: forward
    hooks; MLX: every call of the modules watched (``mlx_calls.watched``), each value with its array's dtype. Yields
    ``remove()``, which ends the taps before the block does (a decode after the prefill)."""
    modules = _modules(ports, before or {}, lookup or (lambda path: resolve(root, path)))
    if side == "torch":
        from .torch_hooks import main_input, output_tensor, to_numpy

        writer = _Writer(
            record, wants, to_numpy, lambda tensor: None, partial(main_input, keywords=keywords), output_tensor
        )
        with _hooked(modules, writer) as remove:
            yield remove
        return
    from .mlx_calls import main_input, output_array, watched
    from .mlx_hooks import dtype_name, to_numpy

    writer = _Writer(record, wants, to_numpy, dtype_name, partial(main_input, keywords=keywords), output_array)
    live = [True]

    def on_call(path, module, args, kwargs, call):
        if not live[0]:
            return call()
        writer.called(modules[path], args, kwargs)
        out = call()
        writer.returned(modules[path], out)
        return out

    with watched({path: tapped.module for path, tapped in modules.items()}, on_call):
        yield lambda: live.__setitem__(0, False)


@contextmanager
def _hooked(modules: Mapping[str, _Module], writer: _Writer) -> Iterator[Callable[[], None]]:
    """Forward pre-hooks and hooks on the modules (a hook that returned a value would replace what it saw)."""
    handles = []
    for tapped in modules.values():
        if tapped.before or tapped.inputs:
            handles.append(
                tapped.module.register_forward_pre_hook(
                    lambda module, args, kwargs, t=tapped: writer.called(t, args, kwargs), with_kwargs=True
                )
            )
        if tapped.outputs:
            handles.append(
                tapped.module.register_forward_hook(lambda module, args, out, t=tapped: writer.returned(t, out))
            )

    def remove() -> None:
        for handle in handles:
            handle.remove()

    try:
        yield remove
    finally:
        remove()


def into_sink(sink: Any, native: bool = True) -> Record:
    """The record that writes a value into ``sink`` (an MLX value with the dtype it was computed in, unless
    ``native`` is False: then the sidecar says the stored one)."""

    def record(stage: str, value: np.ndarray | None, dtype: str | None) -> None:
        if value is None:
            return
        if dtype is None or not native:
            sink.put(stage, value)
        else:
            sink.put(stage, value, native_dtype=dtype)

    return record


@contextmanager
def tapped(
    side: str,
    root: Any,
    table: Iterable[ModuleTap],
    sink: Any,
    before: Mapping[str, Before] | None = None,
    native: bool = True,
):
    """The stages of ``table`` that ``sink`` wants, read on ``side`` ("torch" or "mlx") from the modules under
    ``root`` and written into it (``native``: with the dtype MLX computed them in); ``before`` as
    :func:`tap_ports` takes it. Yields ``remove()``."""
    ports = [(tap.stage, tap.side(side)) for tap in table if tap.side(side) is not None and sink.wants(tap.stage)]
    with tap_ports(side, root, ports, into_sink(sink, native), sink.wants, before) as remove:
        yield remove


def decoder_taps(layers: int, torch: tuple[str, str], mlx: tuple[str, str]) -> list[ModuleTap]:
    """A decoder's stages on its modules: each layer's output ``text.layer.N`` (the prompt's rows) and its last row
    ``text.layer.N.last``, and the final norm's last row ``text.norm.last``. ``torch`` and ``mlx``: each side's
    layer list and final norm, from the root handed to :func:`tapped`."""
    (torch_layers, torch_norm), (mlx_layers, mlx_norm) = torch, mlx

    def rows(array: np.ndarray) -> np.ndarray:
        return array[0]

    def last(array: np.ndarray) -> np.ndarray:
        return array[0][-1]

    def layer(select: Select) -> tuple[Port, Port]:
        return output(f"{torch_layers}.{{i}}", select), output(f"{mlx_layers}.{{i}}", select)

    return [
        *each(layers, ModuleTap("text.layer.{i}", *layer(rows)), ModuleTap("text.layer.{i}.last", *layer(last))),
        ModuleTap("text.norm.last", output(torch_norm, last), output(mlx_norm, last)),
    ]
