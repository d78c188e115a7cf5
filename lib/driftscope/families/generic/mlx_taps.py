"""The generic family in mlx-vlm: mlx-vlm's own loader; every module class's call watched (``mlx_calls``) while
the prefill runs the way mlx-vlm's ``generate`` runs it (the input embeddings, then the language model on its
cache); each stage put in the reference's layout; the decode on that cache; a replay calls a module with the
reference's input and the rest of the arguments its own forward gave it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from driftscope.families.capabilities import MLXCapabilities
from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.mlx_calls import output_array, watched
from driftscope.taps.mlx_hooks import cache_snapshot, to_numpy
from driftscope.taps.module_taps import tap_ports
from driftscope.taps.sink import StageSink, put_greedy

from .calls import mlx_kwargs, mlx_load
from .entries import StopForward, entries, module_ports, put_prompt, stage_value, to_reference, with_rank
from .layout import Layout
from .mlx_probe import MAIN_KEYWORDS, main_input

CAPABILITIES = MLXCapabilities()  # nothing beyond the defaults


def load(path: Path, config: dict) -> Any:
    """mlx-vlm's model with the checkpoint's weights (``calls.mlx_load``); mlx-vlm's own error, said as the port's
    limit, when it cannot build or load the checkpoint."""
    import importlib.metadata

    from driftscope.errors import DriftscopeError, PortLimitError

    try:
        return mlx_load(path, config)
    except DriftscopeError:
        raise
    except Exception as err:  # noqa: BLE001 - the library's own words, with the fix
        version = importlib.metadata.version("mlx-vlm")
        raise PortLimitError(
            f"mlx-vlm {version} cannot load this {config.get('model_type')!r} checkpoint ({type(err).__name__}: {err})",
            "the run's other runtimes still run and are compared; leave mlx out for this checkpoint, or fix mlx-vlm's "
            f"port (reproduce: python -c \"from mlx_vlm.utils import load_model; load_model(__import__('pathlib')"
            f".Path('{path}'))\")",
        ) from err


def rms_norms(model: Any) -> list[tuple[Any, str]]:
    """The generic family names no RMSNorm for the manual-RMSNorm experiment."""
    return []


def prefill(model: Any, inputs: ModelInputs, cache: Any):
    """mlx-vlm's prefill as its ``generate`` runs it: the input embeddings (images merged), then the language
    model on the whole prompt, the processor's other arrays and what the embedding step returned beside them."""
    input_ids, pixel_values, mask, kwargs = mlx_kwargs(inputs)
    embedded = model.get_input_embeddings(input_ids, pixel_values, mask=mask, **kwargs)
    extra = {k: v for k, v in embedded.to_dict().items() if k != "inputs_embeds" and v is not None}
    return model.language_model(
        input_ids, inputs_embeds=embedded.inputs_embeds, cache=cache, **{**kwargs, **extra}, logits_to_keep=1
    )


def run_vision(model: Any, inputs: ModelInputs):
    """The plain forward (no taps): the prefill on the prompt and images."""
    return prefill(model, inputs, None).logits


def _modules(model: Any) -> dict[str, Any]:
    return dict(model.named_modules())


def _refuse_unread(plan) -> None:
    """A plan read without mlx-vlm (it could not load or run the checkpoint, or nothing in it aligned) names no
    MLX module: say mlx-vlm's own error rather than capture nothing."""
    from driftscope.errors import PortLimitError

    error = (plan.meta.get("generic") or {}).get("mlx_error")
    if error:
        raise PortLimitError(
            f"mlx-vlm could not be read against transformers for this checkpoint: {error}",
            "the run's other runtimes still run and are compared; leave mlx out for this checkpoint, or fix mlx-vlm's "
            "port",
        )


def capture(model: Any, inputs: ModelInputs, sink: StageSink) -> Any:
    """The prefill with every module the wanted stages name watched; returns ``(output, cache)`` for
    ``capture_text`` when the plan follows the prompt, else stops once the last wanted stage is written."""
    import mlx.core as mx
    from mlx_vlm.models.cache import make_prompt_cache

    plan = sink.plan
    _refuse_unread(plan)
    put_prompt(inputs, sink)
    stage_entries = entries(plan)
    ports = module_ports(
        plan, sink.wants, "mlx", lambda array, entry, key: stage_value(to_reference(array, entry, key), entry)
    )
    pending = {stage for stage, _ in ports}
    text = any(stage.id.startswith("text.") for stage in plan)
    # a stage the plan refused is declared absent with why, whether or not its module runs here
    refused = {stage: stage_entries[stage]["refusal"] for stage in pending if stage_entries[stage].get("refusal")}
    sink.writer.meta.setdefault("declared_absent", {}).update(refused)
    pending -= set(refused)

    def wants(stage_id: str) -> bool:
        return sink.wants(stage_id) and not stage_entries[stage_id].get("refusal")

    def record(stage_id: str, value, native) -> None:
        if value is not None:
            sink.put(stage_id, value, native_dtype=native)
        pending.discard(stage_id)
        if not pending and not text:
            raise StopForward

    cache = make_prompt_cache(model.language_model) if text else None
    try:
        with tap_ports("mlx", model, ports, record, wants, lookup=_modules(model).get, keywords=MAIN_KEYWORDS):
            out = prefill(model, inputs, cache)
            mx.eval(out.logits)
    except StopForward:
        return None
    return out, cache


def capture_text(model: Any, inputs: ModelInputs, sink: StageSink, tower: Any = None) -> None:
    """The prompt's ids, the prefill's last logits (where no head module wrote them), then the greedy and
    teacher-forced decode on the prefill's cache."""
    import mlx.core as mx

    text = inputs.text
    out, cache = tower if tower is not None else capture(model, inputs, sink)
    sink.put("text.input_ids", text.input_ids)
    logits = to_numpy(out.logits[0, -1])
    sink.put("text.logits.last", logits)
    put_greedy(
        sink,
        logits,
        lambda token: to_numpy(model.language_model(mx.array([[token]]), cache=cache, logits_to_keep=1).logits[0, -1]),
        text.max_new_tokens,
        forced=text.forced,
        rewind=lambda count: [entry.trim(count) for entry in cache],
        snapshot=cache_snapshot(cache),
    )


def record_calls(model: Any, inputs: ModelInputs, paths: set[str]) -> dict[str, tuple]:
    """One forward (no cache) keeping, for each module of ``paths``, the arguments of its first call and where
    its main input was among them."""
    import mlx.core as mx

    found: dict[str, tuple] = {}

    def on_call(path, module, args, kwargs, call):
        if path not in found:
            slot = next((("arg", i) for i, value in enumerate(args) if isinstance(value, mx.array)), None)
            if slot is None:
                main = main_input(args, kwargs)
                slot = next((("kw", name) for name, value in kwargs.items() if value is main), None)
            found[path] = (tuple(args), dict(kwargs), slot)
        return call()

    modules = _modules(model)
    with watched({p: modules[p] for p in paths if p in modules}, on_call):
        mx.eval(prefill(model, inputs, None).logits)
    return found


def replay(model: Any, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
    """The stage's module called on the reference's input (put in this side's layout), with the other arguments
    of its own forward's call; the result in the reference's layout."""
    import mlx.core as mx

    entry = ctx.entries[stage_id]
    calls = ctx.calls("mlx", model, lambda paths: record_calls(model, ctx.model_inputs(), paths))
    args, kwargs, slot = calls[entry["mlx"]]
    main = args[slot[1]] if slot[0] == "arg" else kwargs[slot[1]]
    value = with_rank(np.asarray(inputs[0]), int(entry["in_rank"]), lambda a: a[None])
    if entry.get("input_layout"):
        value = Layout.from_dict(entry["input_layout"]).apply(value)
    value = mx.array(np.ascontiguousarray(value)).astype(main.dtype)
    if slot[0] == "arg":
        args = (*args[: slot[1]], value, *args[slot[1] + 1 :])
    else:
        kwargs = {**kwargs, slot[1]: value}
    out = output_array(_modules(model)[entry["mlx"]](*args, **kwargs), entry.get("mlx_item"))
    mx.eval(out)
    return stage_value(to_reference(to_numpy(out), entry), entry)
