"""Qwen3-VL in transformers: the model class, the modules hooked for each stage, the replay operators.

Every tap is the value the forward computed: module outputs and inputs declared (``plan``), q/k after
RoPE from transformers' own RoPE function (wrapped for the call), the interpolated position table from the
gathered rows of ``pos_embed`` times the weights the forward used. The text side separates the two meanings of a
decoder layer's output that ``hidden_states`` conflates: the layer's own output (``text.layer.N``, its last
position and its image slots) and the image slots after the DeepStack add (the next layer's input,
``text.layer.N.deepstack``).
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from types import ModuleType
from typing import Any

import numpy as np

from driftscope.families.capabilities import TransformersCapabilities
from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.module_taps import tapped
from driftscope.taps.sink import StageSink
from driftscope.taps.torch_hooks import replaced
from driftscope.taps.torch_hooks import to_numpy as _np

from ..qwen_shared.block_replay import attention_replay, block_operator
from ..qwen_shared.tower import torch_vision_kwargs
from ..qwen_shared.tower import tower_inputs as _tower_inputs
from ..qwen_shared.tower import visual as _visual
from ..qwen_shared.transformers_text import put_prefill, replay_text
from .plan import block_stage_id, decoder_taps, parse_stage, tower_taps

MODEL_CLASS = "Qwen3VLForConditionalGeneration"
CAPABILITIES = TransformersCapabilities()  # nothing beyond the defaults


def _modeling(visual: Any) -> ModuleType:
    """The modeling module the tower's class lives in (its RoPE and interpolation helpers are that module's)."""
    return sys.modules[type(visual).__module__]


def run_vision(model: Any, inputs: ModelInputs):
    """The plain vision forward (no taps): the merged features and every DeepStack feature."""
    import torch

    with torch.no_grad():
        out = _visual(model)(*_tower_inputs(model, inputs))
    return out.pooler_output, out.deepstack_features


def capture(model: Any, inputs: ModelInputs, sink: StageSink) -> None:
    """One vision forward with the declared module stages tapped (``plan``: blocks, substages, mergers,
    DeepStack branches); q/k from the RoPE call, the position table from the interpolation's weights, the bounds
    from each block's arguments."""
    import torch

    visual = _visual(model)
    modeling = _modeling(visual)
    state: dict[str, Any] = {"block": None}

    def before_block(index: int):
        def run(args, kwargs) -> None:
            state["block"] = index
            sink.put("vision.cu_seqlens", _np(kwargs["cu_seqlens"]))

        return run

    def pos_rows(module, args, out) -> None:  # the forward sums these rows with the interpolation weights
        sink.put("vision.pos_embed", _np((out * state["interp_weights"][:, :, None]).sum(1)))

    original_rope = modeling.apply_rotary_pos_emb_vision
    original_interp = modeling.get_vision_interpolation_indices_and_weights

    def rope(q, k, cos, sin):
        q_out, k_out = original_rope(q, k, cos, sin)
        sink.put(block_stage_id(state["block"], "attn.q"), _np(q_out))
        sink.put(block_stage_id(state["block"], "attn.k"), _np(k_out))
        return q_out, k_out

    def interpolation(*args, **kwargs):
        indices, weights = original_interp(*args, **kwargs)
        state["interp_weights"] = weights
        return indices, weights

    before = {f"blocks.{index}": before_block(index) for index in range(len(visual.blocks))}
    with ExitStack() as stack, torch.no_grad():
        stack.enter_context(tapped("torch", visual, tower_taps(visual), sink, before))
        stack.callback(visual.pos_embed.register_forward_hook(pos_rows).remove)
        stack.enter_context(replaced(modeling, "apply_rotary_pos_emb_vision", rope))
        stack.enter_context(replaced(modeling, "get_vision_interpolation_indices_and_weights", interpolation))
        visual(*_tower_inputs(model, inputs))


def capture_text(model: Any, inputs: ModelInputs, sink: StageSink) -> None:
    """Prefill the whole model on the prompt (the decoder's stages and the DeepStack adds tapped), then greedy
    decode with the cache."""
    import torch

    text = inputs.text
    language = model.model.language_model
    seen: dict[str, Any] = {}

    def decoder_input(args, kwargs) -> None:
        seen.update(embeds=kwargs["inputs_embeds"], positions=kwargs["position_ids"])

    branches = len(model.config.vision_config.deepstack_visual_indexes)
    taps = decoder_taps(len(language.layers), branches, text.vision_slots)  # the image slots, then the video slots
    ids = torch.from_numpy(text.input_ids)[None]
    vision = torch_vision_kwargs(model, inputs)  # images and videos apart (pixels and grids of each)
    with tapped("torch", language, taps, sink, {"": decoder_input}), torch.no_grad():
        out = model(
            input_ids=ids,
            **vision,
            mm_token_type_ids=torch.from_numpy(text.mm_token_type_ids)[None],
            use_cache=True,
        )
    put_prefill(model, inputs, sink, ids, seen, out)


def merger_replay(merger, kind: str, x):
    """A merger's (the main one's or a DeepStack branch's) substage ``kind`` on ``x``: transformers' and mlx-vlm's
    mergers hold the same modules."""
    if kind == "norm":
        return merger.norm(x.reshape(-1, merger.hidden_size) if merger.use_postshuffle_norm else x)
    if kind == "fc1":
        return merger.linear_fc1(x.reshape(-1, merger.hidden_size))
    if kind == "act":
        return merger.act_fn(x)
    return merger.linear_fc2(x)


def replay(model: Any, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
    """The stage's own torch modules (and transformers' own helpers) applied to ``inputs``."""
    import torch

    if stage_id.startswith("text."):
        return replay_text(model, stage_id, inputs, ctx)
    visual = _visual(model)
    modeling = _modeling(visual)
    dtype = next(visual.parameters()).dtype
    block, branch, kind = parse_stage(stage_id)
    with torch.no_grad():
        if kind == "pos_embed":  # the grid -> transformers' interpolation indices and weights -> the table's rows
            indices, weights = modeling.get_vision_interpolation_indices_and_weights(
                torch.from_numpy(np.asarray(inputs[0], dtype=np.int64)),
                num_grid_per_side=visual.num_grid_per_side,
                mode=visual.interpolation_mode,
                align_corners=visual.interpolation_align_corners,
                spatial_merge_size=visual.config.spatial_merge_size,
            )
            return _np((visual.pos_embed(indices) * weights[:, :, None]).sum(1))
        args = [torch.from_numpy(np.ascontiguousarray(x)).to(dtype) for x in inputs]
        if kind == "patch_embed":
            return _np(visual.patch_embed(args[0]))
        if kind == "positioned":
            return _np(args[0] + args[1])
        if branch is not None:
            return _np(merger_replay(visual.deepstack_merger_list[branch], kind.split(".", 1)[1], args[0]))
        if block is None:
            return _np(merger_replay(visual.merger, kind.split(".", 1)[1], args[0]))
        return _np(_block_replay(visual.blocks[block], kind, args, ctx, dtype, modeling))


def _block_replay(blk, kind: str, args: list, ctx: Any, dtype, modeling):
    import torch

    cos = torch.from_numpy(ctx.cos).to(dtype)
    sin = torch.from_numpy(ctx.sin).to(dtype)
    bounds = torch.from_numpy(ctx.cu_seqlens.astype(np.int32))
    if kind == "block":
        return blk(args[0], cu_seqlens=bounds, position_embeddings=(cos, sin))
    if kind in ("attn.q", "attn.k", "attn.v", "attn.context"):
        return attention_replay(blk, kind, args, (cos, sin), bounds, modeling)
    return block_operator(blk, kind, args)
