"""What the compiled runtimes (``jax``, ``iree``) ask of Qwen3-VL-MoE: Qwen3-VL's tower program unchanged (the
same emitted tower, bucket, host stages and pieces), and a decoder whose sparse layers run the sparse MLP, with
every sparse piece an output of the prefill and a replay of its own."""

from __future__ import annotations

from typing import Any

import numpy as np

from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.jax.emitted import EmittedModel
from driftscope.taps.jax.layers import Contract
from driftscope.taps.sink import StageSink

from ...qwen3_vl.jax import program as dense
from ...qwen_shared.decode import put_decoded, text_replay_arguments
from ..plan import moe_piece

CAPABILITIES = dense.CAPABILITIES
FINAL = dense.FINAL
HOST_STAGES = dense.HOST_STAGES
TOWER_OUTPUTS = dense.TOWER_OUTPUTS
GRAPH_INPUTS = dense.GRAPH_INPUTS
load, bucket, put_host_stages, output_rows = dense.load, dense.bucket, dense.put_host_stages, dense.output_rows
lower, arguments, capture_pieces = dense.lower, dense.arguments, dense.capture_pieces


def _text(model: EmittedModel):
    """The decoder's spec, the sparse MLPs' spec and the weights, read from the checkpoint once."""
    from ...qwen3_vl.jax.weights import TextSpec
    from .text import MoeSpec, load_weights

    if model.text is None:
        config = model.checkpoint.config
        spec, moe = TextSpec.from_config(config), MoeSpec.from_config(config)
        model.text_weights = load_weights(model.checkpoint.path, spec, moe)
        model.text = (spec, moe, model.text_weights)
    return model.text


def capture_text(runtime, inputs: ModelInputs, sink: StageSink, tower: dict[str, np.ndarray]) -> None:
    """Qwen3-VL's compiled prefill and greedy decode (see its ``capture_text``) with the sparse MLPs: the chosen
    experts come back as integers."""
    import jax

    from .text import text_decode_step, text_prefill

    text = inputs.text
    spec, moe, weights = _text(runtime.model)
    args, delta = dense.prefill_arguments(runtime, inputs, sink, tower, weights)
    contract = runtime.contract
    decode = runtime.options.get("decode", True) is not False and sink.wants("text.generate.tokens")
    keep = decode and text.max_new_tokens > 1

    def prefill(w, ids, slots, image_embeds, features, pos):
        return text_prefill(
            w, ids, slots, image_embeds, features, pos, spec=spec, moe=moe, contract=contract, cache=keep
        )

    out = runtime.run_text(jax.jit(prefill, keep_unused=True), args)
    cache = (out.pop("cache.keys", None), out.pop("cache.values", None))
    for stage_id, value in out.items():
        exact = stage_id.endswith(".mlp.chosen")
        sink.put(stage_id, np.asarray(value, dtype=np.int64 if exact else np.float32))
    if decode:  # Qwen3-VL's decode step with the sparse MLPs, on the shared greedy decoder
        bound = {"spec": spec, "moe": moe, "contract": contract}
        put_decoded(runtime, sink, out["text.logits.last"], text, text_decode_step, weights, cache, delta, **bound)


def replay_call(model: EmittedModel, stage_id: str, inputs: list[np.ndarray], ctx: Any, contract: Contract):
    """Qwen3-VL's replays for the tower and the stages around the layers; a layer or a sparse piece with the
    sparse MLP (the reference's chosen experts as integers)."""
    if not stage_id.startswith("text."):
        return dense.replay_call(model, stage_id, inputs, ctx, contract)
    from .text import text_replay

    spec, moe, weights = _text(model)
    kind, function, used = text_replay(stage_id, weights, spec, moe, contract)
    if moe_piece(stage_id) in ("mlp.weights", "mlp.experts"):
        arguments: tuple = (np.asarray(inputs[0], dtype=np.float32), np.asarray(inputs[1]).astype(np.int32))
    else:
        arguments = text_replay_arguments(stage_id, kind, inputs, ctx)
    return kind, function, (used, arguments, ctx.text_positions.astype(np.int32))
