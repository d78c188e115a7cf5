"""The mlx-vlm side of the probe: a loaded MLX model's modules, their tensors' moments, and one forward watched
through the module classes' calls (nothing it computes is changed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from driftscope.taps.mlx_calls import first_array, is_array, watched
from driftscope.taps.mlx_calls import main_input as call_input

from .probe import ForwardRecord, ModuleFacts, SideProbe, embed_scale, moments, output_choice, subtree_moments

#: keyword arguments a module's main input is passed as in mlx-vlm, when it is not the first positional one
MAIN_KEYWORDS = ("x", "hidden_states", "inputs", "inputs_embeds", "pixel_values")


def main_input(args: tuple, kwargs: dict):
    """A module call's main input: its first positional array, else a known keyword, else any array keyword."""
    return call_input(args, kwargs, MAIN_KEYWORDS)


def weight_moments(model: Any) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Each parameter's moments by full name, and each module's own (the arrays it holds itself)."""
    import mlx.core as mx

    params: dict[str, np.ndarray] = {}
    own: dict[str, np.ndarray] = {}
    for path, module in model.named_modules():
        total = np.zeros(4)
        for name, value in module.items():
            if isinstance(value, mx.array) and not name.startswith("_"):
                values = moments(np.array(value.astype(mx.float32)))
                params[f"{path}.{name}" if path else name] = values
                total += values
        own[path] = total
    return params, own


def probe(model: Any, forward: Callable[[], Any]) -> SideProbe:
    """Every module of ``model``; ``forward()`` runs the model once on a small input, watched."""
    import mlx.core as mx

    params, own = weight_moments(model)
    named = dict(model.named_modules())
    subtree = subtree_moments(params, named)
    modules = {
        path: ModuleFacts(
            path, type(module).__name__, own[path].tolist(), subtree[path].tolist(), out_scale=embed_scale(module)
        )
        for path, module in named.items()
    }
    record = ForwardRecord(modules)
    stack: list[list] = []  # per call in progress: [the last output a module directly under it returned]

    def on_call(path, module, args, kwargs, call):
        found = main_input(args, kwargs)
        shape = None if found is None else list(found.shape)
        record.started(path, found, shape, found is not None and not mx.issubdtype(found.dtype, mx.floating))
        stack.append([None])
        try:
            out = call()
        finally:
            last_inner = stack.pop()[0]
        item, produced = output_choice(out, last_inner, is_array)
        if modules[path].calls == 1 and item is not None:
            modules[path].out_item = list(item)
            modules[path].first_shape = list(first_array(out).shape)
        if stack:
            stack[-1][0] = produced
        record.finished(path, produced, None if produced is None else list(produced.shape))
        return out

    with watched(named, on_call):
        out = forward()
        mx.eval(first_array(out) if first_array(out) is not None else mx.array(0))
    return SideProbe("mlx", modules)
