"""The generic family in transformers: the auto class loads any image-text-to-text model; forward hooks on the
modules the plan names write each stage; the decode runs on the prefill's cache; a replay calls a module with the
reference's input and the rest of the arguments its own forward gave it."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from driftscope.families.capabilities import TransformersCapabilities
from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.module_taps import tap_ports
from driftscope.taps.sink import StageSink, put_greedy
from driftscope.taps.torch_hooks import cache_snapshot, output_tensor
from driftscope.taps.torch_hooks import to_numpy as _np

from .calls import transformers_kwargs
from .entries import StopForward, module_ports, put_prompt, stage_value, with_rank
from .torch_probe import MAIN_KEYWORDS, main_input

MODEL_CLASS = "AutoModelForImageTextToText"
CAPABILITIES = TransformersCapabilities()  # nothing beyond the defaults


def _prefill_kwargs(model: Any, inputs: ModelInputs, use_cache: bool) -> dict:
    kwargs = dict(transformers_kwargs(inputs))
    parameters = inspect.signature(model.forward).parameters
    if "logits_to_keep" in parameters:
        kwargs["logits_to_keep"] = 1
    kwargs["use_cache"] = use_cache
    return kwargs


def full_cache(model: Any) -> Any:
    """The cache transformers builds for the model's decoder (``DynamicCache(config=...)``: its hybrid layers
    too), with each sliding-window layer keeping every position: the window is the attention mask's to apply (the
    models that slide build a sliding-window mask, so their decode is unchanged), and the cache holds the positions
    every runtime's cache holds. A model that ignores the config's ``sliding_window`` (transformers 5.24's Llama)
    would otherwise decode on a cache that dropped all but the last ``window - 1`` positions (a cache quirk, not the
    model's math)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    cache = DynamicCache(config=model.config)
    cache.layers = [DynamicLayer() if isinstance(layer, DynamicSlidingWindowLayer) else layer for layer in cache.layers]
    return cache


def run_vision(model: Any, inputs: ModelInputs):
    """The plain forward (no taps): the whole model's prefill on the prompt and images."""
    import torch

    with torch.no_grad():
        return model(**_prefill_kwargs(model, inputs, use_cache=False))


def capture(model: Any, inputs: ModelInputs, sink: StageSink) -> Any:
    """The prefill with a hook on every module the wanted stages name; returns the prefill's output (with its
    cache) for ``capture_text`` when the plan follows the prompt, else stops once the last wanted stage is written."""
    import torch

    plan = sink.plan
    put_prompt(inputs, sink)
    ports = module_ports(plan, sink.wants, "torch", lambda array, entry, key: stage_value(array, entry))
    pending = {stage for stage, _ in ports}
    text = any(stage.id.startswith("text.") for stage in plan)

    def record(stage_id: str, value, native) -> None:
        if value is not None:
            sink.put(stage_id, value)
        pending.discard(stage_id)
        if not pending and not text:
            raise StopForward

    kwargs = _prefill_kwargs(model, inputs, use_cache=text)
    if text:
        kwargs["cache"] = full_cache(model)
    modules = dict(model.named_modules())
    taps = tap_ports("torch", model, ports, record, sink.wants, lookup=modules.get, keywords=MAIN_KEYWORDS)
    try:
        with taps, torch.no_grad():
            return model(**kwargs)
    except StopForward:
        return None


def capture_text(model: Any, inputs: ModelInputs, sink: StageSink, tower: Any = None) -> None:
    """The prompt's ids, the prefill's last logits (where no head module wrote them), then the greedy and
    teacher-forced decode on the prefill's cache."""
    import torch

    text = inputs.text
    out = tower if tower is not None else capture(model, inputs, sink)
    sink.put("text.input_ids", text.input_ids)
    logits = _np(out.logits[0, -1])
    sink.put("text.logits.last", logits)
    cache = out.cache if hasattr(out, "cache") else out.past_key_values

    def step(token: int) -> np.ndarray:
        with torch.no_grad():
            return _np(model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True).logits[0, -1])

    step.rewind = lambda count: cache.crop(-count)
    step.cache_snapshot = cache_snapshot(cache)
    put_greedy(sink, logits, step, text.max_new_tokens, forced=text.forced)


def record_calls(model: Any, inputs: ModelInputs, paths: set[str]) -> dict[str, tuple]:
    """One forward (no cache) keeping, for each module of ``paths``, the arguments of its first call and where its
    main input was among them."""
    import torch

    modules = dict(model.named_modules())
    found: dict[str, tuple] = {}

    def keep(path, args, kwargs) -> None:
        if path in found:
            return
        slot = next((("arg", i) for i, value in enumerate(args) if isinstance(value, torch.Tensor)), None)
        if slot is None:
            main = main_input(args, kwargs)
            slot = next((("kw", name) for name, value in kwargs.items() if value is main), None)
        found[path] = (tuple(args), dict(kwargs), slot)

    handles = [
        modules[path].register_forward_pre_hook(
            lambda m, args, kwargs, path=path: keep(path, args, kwargs), with_kwargs=True
        )
        for path in paths
        if path in modules
    ]
    try:
        with torch.no_grad():
            model(**_prefill_kwargs(model, inputs, use_cache=False))
    finally:
        for handle in handles:
            handle.remove()
    return found


def replay(model: Any, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
    """The stage's module called on the reference's input, with the other arguments of its own forward's call."""
    import torch

    entry = ctx.entries[stage_id]
    calls = ctx.calls("transformers", model, lambda paths: record_calls(model, ctx.model_inputs(), paths))
    args, kwargs, slot = calls[entry["torch"]]
    main = args[slot[1]] if slot[0] == "arg" else kwargs[slot[1]]
    value = torch.from_numpy(np.ascontiguousarray(inputs[0])).to(main.dtype)
    value = with_rank(value, main.dim(), lambda t: t[None])
    if slot[0] == "arg":
        args = (*args[: slot[1]], value, *args[slot[1] + 1 :])
    else:
        kwargs = {**kwargs, slot[1]: value}
    module = dict(model.named_modules())[entry["torch"]]
    with torch.no_grad():
        out = output_tensor(module(*args, **kwargs), entry.get("torch_item"))
    return stage_value(_np(out), entry)
