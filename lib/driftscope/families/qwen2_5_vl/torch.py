"""Qwen2.5-VL in transformers: the model class, the modules hooked for each stage, the replay operators."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import numpy as np

from driftscope.families.capabilities import TransformersCapabilities
from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.module_taps import tapped
from driftscope.taps.sink import StageSink
from driftscope.taps.torch_hooks import replaced
from driftscope.taps.torch_hooks import to_numpy as _np

from ..qwen_shared.block_replay import attention_replay, block_operator
from ..qwen_shared.grids import cu_seqlens as grid_cu_seqlens
from ..qwen_shared.text import text_taps
from ..qwen_shared.tower import torch_vision_kwargs
from ..qwen_shared.tower import tower_inputs as _tower_inputs
from ..qwen_shared.tower import visual as _visual
from ..qwen_shared.transformers_text import put_prefill, replay_text
from .geometry import unique_consecutive
from .plan import block_stage_id, parse_stage, tower_taps

MODEL_CLASS = "Qwen2_5_VLForConditionalGeneration"
CAPABILITIES = TransformersCapabilities()  # nothing beyond the defaults


def run_vision(model: Any, inputs: ModelInputs):
    """The plain vision forward (no taps): merged features in raster order."""
    import torch

    with torch.no_grad():
        out = _visual(model)(*_tower_inputs(model, inputs))
    return out.pooler_output


def put_unused_bounds(sink: StageSink, grid_thw: Any, cu_window: Any) -> None:
    """Attention bounds no block used (no full-attention block within the depth, or no windowed one): replay
    needs both whatever the schedule, so they are taken from the grid and from the tower's window index."""
    sink.put("vision.cu_seqlens", grid_cu_seqlens(grid_thw))
    if cu_window is not None:
        sink.put_bounds("vision.cu_window_seqlens", np.asarray(cu_window))


def capture(model: Any, inputs: ModelInputs, sink: StageSink) -> Any:
    """One vision forward with the declared module stages tapped (``plan.tower_taps``); q/k from the RoPE call, the
    window index from the function that builds it, the bounds from each block's arguments. Returns the tower's
    output (what ``capture_text`` takes as ``tower``)."""
    import torch
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as modeling

    visual = _visual(model)
    state: dict[str, Any] = {"block": None}
    full = set(visual.fullatt_block_indexes)

    def before_block(index: int):
        def run(args, kwargs) -> None:
            state["block"] = index
            if index in full:
                sink.put("vision.cu_seqlens", _np(kwargs["cu_seqlens"]))
            elif sink.wants("vision.cu_window_seqlens"):
                sink.put_bounds("vision.cu_window_seqlens", _np(kwargs["cu_seqlens"]))

        return run

    original_rope = modeling.apply_rotary_pos_emb_vision

    def rope(q, k, cos, sin):
        q_out, k_out = original_rope(q, k, cos, sin)
        block = state["block"]
        sink.put(block_stage_id(block, "attn.q"), _np(q_out))
        sink.put(block_stage_id(block, "attn.k"), _np(k_out))
        return q_out, k_out

    original_window = modeling.get_vision_window_index

    def window_index(*args, **kwargs):
        index, cu_window = original_window(*args, **kwargs)
        sink.put("vision.window_index", _np(index))
        state["cu_window"] = unique_consecutive(np.asarray(cu_window, dtype=np.int64))
        return index, cu_window

    before = {f"blocks.{index}": before_block(index) for index in range(len(visual.blocks))}
    with ExitStack() as stack, torch.no_grad():
        stack.enter_context(tapped("torch", visual, tower_taps(visual), sink, before))
        stack.enter_context(replaced(modeling, "apply_rotary_pos_emb_vision", rope))
        stack.enter_context(replaced(modeling, "get_vision_window_index", window_index))
        out = visual(*_tower_inputs(model, inputs))
    sink.put("vision.merger", _np(out.pooler_output))
    put_unused_bounds(sink, inputs["grid_thw"], state.get("cu_window"))
    return out


def capture_text(model: Any, inputs: ModelInputs, sink: StageSink, tower: Any = None) -> None:
    """Prefill the whole model on the prompt (the decoder's stages tapped), then greedy decode with the cache.
    ``tower`` (the output ``capture`` returned for these inputs) is handed to the model as its encoder output,
    so the tower does not run twice; only the last position's logits are computed."""
    import torch

    text = inputs.text
    language = model.model.language_model
    seen: dict[str, Any] = {}

    def decoder_input(args, kwargs) -> None:
        seen.update(embeds=kwargs.get("inputs_embeds"), positions=kwargs.get("position_ids"))

    ids = torch.from_numpy(text.input_ids)[None]
    vision = torch_vision_kwargs(model, inputs, tower)  # images and videos apart, the tower's rows split per item
    with tapped("torch", language, text_taps(len(language.layers)), sink, {"": decoder_input}):
        with torch.no_grad():
            out = model(
                input_ids=ids,
                mm_token_type_ids=torch.from_numpy(text.mm_token_type_ids)[None],
                use_cache=True,
                logits_to_keep=1,
                **vision,
            )
    put_prefill(model, inputs, sink, ids, seen, out)


def replay(model: Any, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
    """The stage's own torch modules (the ones the forward ran) applied to ``inputs``."""
    import torch
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as modeling

    if stage_id.startswith("text."):
        return replay_text(model, stage_id, inputs, ctx)
    visual = _visual(model)
    dtype = next(visual.parameters()).dtype
    args = [torch.from_numpy(np.ascontiguousarray(x)).to(dtype) for x in inputs]
    block, kind = parse_stage(stage_id)
    with torch.no_grad():
        if block is None:
            return _np(_replay_tower_piece(visual, kind, args, inputs, ctx))
        blk = visual.blocks[block]
        cos = torch.from_numpy(ctx.cos).to(dtype)
        sin = torch.from_numpy(ctx.sin).to(dtype)
        bounds = torch.from_numpy(ctx.bounds(block).astype(np.int32))
        if kind == "block":
            out = blk(args[0], cu_seqlens=bounds, position_embeddings=(cos, sin))
        elif kind in ("attn.q", "attn.k", "attn.v", "attn.context"):
            out = attention_replay(blk, kind, args, (cos, sin), bounds, modeling)
        else:
            out = block_operator(blk, kind, args)
    return _np(out)


def _replay_tower_piece(visual: Any, kind: str, args: list, inputs: list[np.ndarray], ctx: Any):
    """The stem (patch embedding, rotary tables from the grid) and the merger's pieces, as the forward runs them."""
    import torch
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as modeling

    merger = visual.merger
    if kind == "patch_embed":
        return visual.patch_embed(args[0])
    if kind in ("rotary.cos", "rotary.sin"):
        positions = modeling.get_vision_position_ids(torch.from_numpy(inputs[0]).long(), visual.spatial_merge_size)
        cos, sin = visual.rotary_pos_emb(args[0], positions)
        return cos if kind == "rotary.cos" else sin
    if kind == "merger.norm":
        return merger.ln_q(args[0])
    if kind == "merger.hidden":
        return merger.mlp[1](merger.mlp[0](args[0].reshape(-1, merger.hidden_size)))
    if kind == "merger.window":
        return merger.mlp[2](args[0])
    if kind == "merger":
        return args[0][torch.argsort(torch.from_numpy(ctx.window_index))]
    raise KeyError(f"vision.{kind}")
