"""The transformers side of the probe: a loaded torch model's modules, their tensors' moments, and one forward
watched by hooks (nothing it computes is changed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from driftscope.taps.torch_hooks import first_tensor, is_tensor
from driftscope.taps.torch_hooks import main_input as call_input

from .probe import ForwardRecord, ModuleFacts, SideProbe, embed_scale, moments, output_choice, subtree_moments

#: keyword arguments a module's main input is passed as in transformers, when it is not the first positional one
MAIN_KEYWORDS = ("hidden_states", "x", "input", "inputs", "inputs_embeds", "pixel_values", "image_features")


def main_input(args: tuple, kwargs: dict):
    """A module call's main input: its first positional tensor, else a known keyword, else any tensor keyword."""
    return call_input(args, kwargs, MAIN_KEYWORDS)


def weight_moments(model: Any) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Each parameter's (and saved buffer's) moments by full name (a tied tensor under its first name only), and each
    module's own."""
    seen: set[int] = set()
    params: dict[str, np.ndarray] = {}
    own: dict[str, np.ndarray] = {}
    for path, module in model.named_modules():
        total = np.zeros(4)
        held = list(module.named_parameters(recurse=False)) + [  # a checkpoint's tensors kept as buffers count too
            (name, buffer)
            for name, buffer in module.named_buffers(recurse=False)
            if buffer is not None and name not in module._non_persistent_buffers_set
        ]
        for name, tensor in held:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            values = moments(tensor.detach().float().cpu().numpy())
            params[f"{path}.{name}" if path else name] = values
            total += values
        own[path] = total
    return params, own


def probe(model: Any, forward: Callable[[], Any]) -> SideProbe:
    """Every module of ``model``; ``forward()`` runs the model once on a small input, watched."""
    import torch

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
    handles = []
    for path, module in named.items():

        def before(module, args, kwargs, path=path):
            found = main_input(args, kwargs)
            shape = None if found is None else list(found.shape)
            record.started(path, found, shape, found is not None and not found.is_floating_point())
            stack.append([None])

        def after(module, args, kwargs, out, path=path):
            item, found = output_choice(out, stack.pop()[0], is_tensor)
            if modules[path].calls == 1 and item is not None:
                modules[path].out_item = list(item)
            modules[path].first_shape = list(first_tensor(out).shape)
            if stack:
                stack[-1][0] = found
            record.finished(path, found, None if found is None else list(found.shape))

        handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(module.register_forward_hook(after, with_kwargs=True))
    try:
        with torch.no_grad():
            forward()
    finally:
        for handle in handles:
            handle.remove()
    return SideProbe("transformers", modules)


def regions(model: Any) -> dict[str, str | None]:
    """Where the parts of a transformers VLM are (module paths): the vision tower, the decoder, the head, and the
    base model holding them (what lies under the base and in neither tower nor decoder is the projector)."""
    path_of = {id(module): path for path, module in model.named_modules()}

    def find(module: Any) -> str | None:
        return None if module is None or module is model else path_of.get(id(module))

    vision = find(model.get_encoder(modality="image"))
    decoder = find(model.get_decoder())
    head = find(model.get_output_embeddings())
    base = find(getattr(model, model.base_model_prefix, None))
    return {"vision": vision, "decoder": decoder, "lm_head": head, "base": base}
