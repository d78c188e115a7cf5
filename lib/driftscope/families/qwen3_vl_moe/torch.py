"""Qwen3-VL-MoE in transformers: Qwen3-VL's tower taps and replays (the tower's modeling module is read off its
class), and each sparse layer's MLP taken apart.

The router's forward returns its logits, the top-k weights and the chosen experts; the chosen experts are
sorted by expert id (the weights and expert outputs in the same order), so two runtimes that choose the same
set agree exactly whatever order their top-k returns. Each chosen expert's output is the experts module's
own forward on the same input, one expert slot at a time with weight 1 (transformers sums the slots inside).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from driftscope.families.capabilities import TransformersCapabilities
from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.module_taps import tapped
from driftscope.taps.sink import StageSink
from driftscope.taps.torch_hooks import to_numpy as _np

from ..qwen3_vl import torch as dense
from .held import correct_transformers
from .plan import moe_piece, sparse_taps

MODEL_CLASS = "Qwen3VLMoeForConditionalGeneration"
CAPABILITIES = TransformersCapabilities(
    # the oracle's experts: transformers' plain loop over the experts (its grouped kernels refuse float64)
    load_kwargs={"experts_implementation": "eager"},
    # transformers 5.24 keeps a square stacked expert of the released layout untransposed: the runtime has it put
    # right
    correct_load=correct_transformers,
)
run_vision = dense.run_vision
capture = dense.capture


def sort_choice(chosen, *rows):
    """The chosen experts in ascending id, and ``rows`` (``[tokens, top_k, ...]``) reordered the same way."""
    import torch

    order = torch.argsort(chosen, dim=-1)
    out = [torch.take_along_dim(chosen, order, dim=-1)]
    for row in rows:
        index = order if row.dim() == 2 else order[..., None].expand(*order.shape, row.shape[-1])
        out.append(torch.take_along_dim(row, index, dim=1))
    return out


def each_expert(experts, x, chosen):
    """``[tokens, top_k, hidden]``: the experts module's own forward (hooks bypassed), each slot alone, weight 1."""
    import torch

    ones = torch.ones((x.shape[0], 1), dtype=x.dtype)
    return torch.stack([experts.forward(x, chosen[:, k : k + 1], ones) for k in range(chosen.shape[1])], dim=1)


def _router_hooks(model: Any, sink: StageSink) -> list:
    """Forward hooks on every sparse layer's router and experts (prefill only: removed by the caller)."""
    handles = []
    for index, layer in enumerate(model.model.language_model.layers):
        if not hasattr(layer.mlp, "gate"):
            continue
        stage, mlp = f"text.layer.{index}", layer.mlp

        def routed(module, args, out, s=stage):
            logits, weights, chosen = out
            sink.put(f"{s}.mlp.router", _np(logits))
            chosen, weights = sort_choice(chosen, weights)
            sink.put(f"{s}.mlp.chosen", _np(chosen).astype(np.int64))
            sink.put(f"{s}.mlp.weights", _np(weights))

        def experts_out(module, args, out, s=stage):
            if sink.wants(f"{s}.mlp.experts"):
                chosen = sort_choice(args[1])[0]
                sink.put(f"{s}.mlp.experts", _np(each_expert(module, args[0], chosen)))

        handles.append(mlp.gate.register_forward_hook(routed))
        handles.append(mlp.experts.register_forward_hook(experts_out))
    return handles


def capture_text(model: Any, inputs: ModelInputs, sink: StageSink) -> None:
    """Qwen3-VL's prefill and greedy decode, with the sparse MLPs' pieces recorded during the prefill (their
    norms and outputs declared in ``plan``, the router and the experts taken apart here)."""
    language = model.model.language_model
    sparse = [index for index, layer in enumerate(language.layers) if hasattr(layer.mlp, "gate")]
    handles = _router_hooks(model, sink)
    with tapped("torch", language, sparse_taps(sparse), sink) as remove:

        def first_step(module, args, out):  # the decode steps come after the prefill: stop recording then
            remove()
            for handle in handles:
                handle.remove()

        done = language.register_forward_hook(first_step)
        try:
            dense.capture_text(model, inputs, sink)
        finally:
            done.remove()
            for handle in handles:
                handle.remove()


def replay(model: Any, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
    """A sparse MLP piece through the layer's own modules; every other stage as Qwen3-VL replays it."""
    import torch
    from transformers.masking_utils import create_causal_mask

    piece = moe_piece(stage_id)
    if piece is None:
        return dense.replay(model, stage_id, inputs, ctx)
    language = model.model.language_model
    layer = language.layers[int(stage_id.split(".")[2])]
    dtype = language.embed_tokens.weight.dtype
    x = torch.from_numpy(np.ascontiguousarray(inputs[0])).to(dtype)
    with torch.no_grad():
        if piece == "residual1":
            positions = torch.from_numpy(ctx.text_positions)[:, None, :]
            mask = create_causal_mask(config=language.config, inputs_embeds=x[None], attention_mask=None, cache=None)
            attn, _ = layer.self_attn(
                hidden_states=layer.input_layernorm(x[None]),
                attention_mask=mask,
                position_embeddings=language.rotary_emb(x[None], positions),
            )
            return _np((x[None] + attn)[0])
        if piece == "mlp.in":
            return _np(layer.post_attention_layernorm(x))
        if piece == "mlp.router":
            return _np(layer.mlp.gate(x)[0])
        if piece == "mlp":
            return _np(layer.mlp(x[None])[0])
        chosen = torch.from_numpy(np.asarray(inputs[1], dtype=np.int64))
        if piece == "mlp.experts":
            return _np(each_expert(layer.mlp.experts, x, chosen))
        # the router's own softmax (in float32), at the reference's choice, renormalized over it
        probs = torch.softmax(layer.mlp.gate(x)[0], dim=-1, dtype=torch.float)
        picked = torch.take_along_dim(probs, chosen, dim=-1)
        return _np((picked / picked.sum(dim=-1, keepdim=True)).to(dtype))
