"""What a family's MLX taps are written with: wrappers that record what mlx-vlm's code computed without
changing it, context managers that put back what they replaced, and the manual RMSNorm experiment."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import numpy as np


def to_numpy(array: Any) -> np.ndarray:
    """An MLX array as numpy (bfloat16 and float16 widened to float32, which is exact)."""
    import mlx.core as mx

    if array.dtype in (mx.bfloat16, mx.float16):
        array = array.astype(mx.float32)
    return np.array(array)


def dtype_name(array: Any) -> str:
    """An MLX array's dtype as numpy names it (``mlx.core.bfloat16`` -> ``bfloat16``)."""
    return str(array.dtype).rsplit(".", 1)[-1]


class Recording:
    """Calls ``inner`` and hands its inputs and output to ``record``."""

    def __init__(self, inner: Any, record):
        self.inner = inner
        self.record = record

    def __call__(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        self.record(args, kwargs, out)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextmanager
def shadow(owner: Any, name: str, value: Any):
    """Make ``owner.name`` resolve to ``value`` (an instance attribute), then put back what was there.

    A precision experiment or hypothesis patch may itself have shadowed ``name`` (e.g. a manual
    RMSNorm): that instance attribute is restored, not dropped, so a later replay runs the same operator.
    """
    missing = object()
    previous = owner.__dict__.get(name, missing)
    object.__setattr__(owner, name, value)
    try:
        yield
    finally:
        if previous is missing:
            object.__delattr__(owner, name)
        else:
            object.__setattr__(owner, name, previous)


@contextmanager
def list_item(items: list, index: int, value: Any):
    original = items[index]
    items[index] = value
    try:
        yield
    finally:
        items[index] = original


class SiluProxy:
    """Stands in for ``mlx.nn`` inside an mlx-vlm module (``module_attr(module, "nn", ...)``): ``silu`` is the one
    given (one that records), the rest delegates."""

    def __init__(self, nn: Any, silu):
        self._nn = nn
        self.silu = silu

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nn, name)


@contextmanager
def module_attr(module: Any, name: str, value: Any):
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


class ManualRMSNorm:
    """RMSNorm written out in the activation dtype: squares in F16 overflow above |x| = 256.

    The fused ``mx.fast.rms_norm`` (mlx.nn.RMSNorm) accumulates in float32 and does not.
    """

    def __init__(self, norm: Any):
        self.weight = norm.weight
        self.eps = norm.eps

    def __call__(self, x):
        import mlx.core as mx

        variance = mx.mean(x * x, axis=-1, keepdims=True)  # in x's dtype, as a hand-written port does it
        return self.weight * (x * mx.rsqrt(variance + mx.array(self.eps, dtype=x.dtype)))


RMSNORM_FORMS = ("fused", "manual")


def use_manual_rmsnorm(sites: list[tuple[Any, str]]) -> None:
    """Swap the RMSNorm at each ``(owner, attribute)`` for :class:`ManualRMSNorm` (the precision experiment)."""
    for owner, name in sites:
        object.__setattr__(owner, name, ManualRMSNorm(getattr(owner, name)))


def cache_snapshot(cache: list):
    """``cache_snapshot(kind)`` of mlx-vlm's per-layer cache list (``taps.sink.CacheSnapshot``): each attention
    layer's keys or values ``[kv_heads, positions, head_dim]`` up to its ``offset`` (half precision widened). A layer
    whose cache holds no keys (a hybrid model's convolution state, ``ArraysCache``) is left out; ``snapshot.layers()``
    names the decoder layers the snapshot holds."""

    def layers() -> list[int]:
        return [index for index, entry in enumerate(cache) if hasattr(entry, "keys")]

    def snapshot(kind: str):
        for index in layers():
            entry = cache[index]
            yield to_numpy(getattr(entry, kind)[0, :, : entry.offset, :])

    snapshot.layers = layers
    return snapshot


def half_gather_experts(model: Any) -> list[str]:
    """The dense stacked-expert layers (mlx-vlm's ``SwitchLinear``, run by ``mx.gather_mm``) that would run in half
    precision on MLX's CPU device, whose ``gather_mm`` computes float32 only (MLX 0.32); empty on a GPU."""
    import mlx.core as mx

    if mx.default_device().type != mx.DeviceType.cpu:
        return []
    return [
        path
        for path, module in model.named_modules()
        if type(module).__name__ == "SwitchLinear" and module.weight.dtype != mx.float32
    ]


class Float32Call:
    """Calls ``inner`` with its floating inputs and parameters in float32 and casts the result back to the input's
    dtype: one operator kept in float32 under a half-precision policy (``options.f32``, a precision probe)."""

    def __init__(self, inner: Any):
        import copy

        import mlx.core as mx
        import mlx.nn as nn
        from mlx.utils import tree_map

        self.inner = inner
        widen = lambda a: a.astype(mx.float32) if _floating(a) else a  # noqa: E731
        if isinstance(inner, nn.Module):
            self.wide = copy.deepcopy(inner)  # its children too: the original keeps its dtype
            self.wide.update(tree_map(widen, inner.parameters()))
        else:  # an operator object holding arrays (e.g. ManualRMSNorm)
            self.wide = copy.copy(inner)
            for name, value in vars(inner).items():
                setattr(self.wide, name, widen(value))

    def __call__(self, *args, **kwargs):
        import mlx.core as mx

        dtype = next((a.dtype for a in args if _floating(a)), None)
        wide = [a.astype(mx.float32) if _floating(a) else a for a in args]
        out = self.wide(*wide, **{k: v.astype(mx.float32) if _floating(v) else v for k, v in kwargs.items()})
        return out if dtype is None else out.astype(dtype)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _floating(value: Any) -> bool:
    import mlx.core as mx

    return isinstance(value, mx.array) and mx.issubdtype(value.dtype, mx.floating)


def attribute_site(owner: Any, path: str) -> tuple[Any, str | int]:
    """The ``(owner, attribute)`` that :func:`keep_float32` wraps for the module at the dotted ``path`` under
    ``owner`` (a number is a list index: ``blocks.3.norm2``)."""
    *parents, last = path.split(".")
    for name in parents:
        owner = owner[int(name)] if name.isdigit() else getattr(owner, name)
    return owner, int(last) if last.isdigit() else last


def keep_float32(sites: list[tuple[Any, str | int]]):
    """Put a :class:`Float32Call` at each ``(owner, attribute)`` (a list and an index for a list item); returns
    the function that puts back what was there (a precision probe undoes itself)."""
    missing = object()
    undo = []
    for owner, name in sites:
        if isinstance(owner, list):
            undo.append((owner, name, owner[name]))
            owner[name] = Float32Call(owner[name])
        else:
            undo.append((owner, name, owner.__dict__.get(name, missing)))
            object.__setattr__(owner, name, Float32Call(getattr(owner, name)))

    def restore() -> None:
        for owner, name, previous in reversed(undo):
            if isinstance(owner, list):
                owner[name] = previous
            elif previous is missing:
                object.__delattr__(owner, name)
            else:
                object.__setattr__(owner, name, previous)

    return restore
