"""Qwen3-VL in transformers: the model class, the modules hooked for each stage, the replay operators.

Every tap is the value the forward computed: module outputs and inputs through hooks, q/k after RoPE from
transformers' own RoPE function (wrapped for the call), the interpolated position table from the gathered
rows of ``pos_embed`` times the weights the forward used. The text side separates the two meanings of a
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

from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.sink import StageSink, put_greedy
from driftscope.taps.torch_hooks import replaced
from driftscope.taps.torch_hooks import to_numpy as _np

from ..qwen_shared.text import AppliedOffsets, put_text_inputs
from ..qwen_shared.tower import torch_vision_kwargs
from ..qwen_shared.tower import tower_inputs as _tower_inputs
from ..qwen_shared.tower import visual as _visual
from ..qwen_shared.transformers_text import decode_step, replay_text
from .plan import block_stage_id, deepstack_stage_id, parse_stage

MODEL_CLASS = "Qwen3VLForConditionalGeneration"


def _modeling(visual: Any) -> ModuleType:
    """The modeling module the tower's class lives in (its RoPE and interpolation helpers are that module's)."""
    return sys.modules[type(visual).__module__]


def run_vision(model: Any, inputs: ModelInputs):
    """The plain vision forward (no taps): the merged features and every DeepStack feature."""
    import torch

    with torch.no_grad():
        out = _visual(model)(*_tower_inputs(model, inputs))
    return out.pooler_output, out.deepstack_features


class _Hooks:
    """Forward hooks that write into the sink (only stages it wants)."""

    def __init__(self, sink: StageSink):
        self.sink = sink
        self.handles: list = []

    def out(self, module, stage_id: str, transform=None) -> None:
        if self.sink.wants(stage_id):
            self.handles.append(
                module.register_forward_hook(
                    lambda m, args, out: self.sink.put(stage_id, _np(transform(out) if transform else out))
                )
            )

    def into(self, module, stage_id: str, index: int = 0) -> None:
        if self.sink.wants(stage_id):
            self.handles.append(
                module.register_forward_pre_hook(lambda m, args: self.sink.put(stage_id, _np(args[index])))
            )

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _merger_hooks(hooks: _Hooks, merger, stage: str) -> None:
    hooks.out(merger.norm, stage + ".norm")
    hooks.out(merger.linear_fc1, stage + ".fc1")
    hooks.out(merger.act_fn, stage + ".act")
    hooks.out(merger, stage)


def capture(model: Any, inputs: ModelInputs, sink: StageSink) -> None:
    """One vision forward with hooks on every tapped module (blocks, substages, mergers, DeepStack branches)."""
    import torch

    visual = _visual(model)
    modeling = _modeling(visual)
    state: dict[str, Any] = {"block": None}
    hooks = _Hooks(sink)
    hooks.out(visual.patch_embed, "vision.patch_embed")

    def pos_rows(module, args, out):  # the forward sums these rows with the interpolation weights
        sink.put("vision.pos_embed", _np((out * state["interp_weights"][:, :, None]).sum(1)))

    hooks.handles.append(visual.pos_embed.register_forward_hook(pos_rows))
    hooks.into(visual.rotary_pos_emb, "vision.positioned")

    def rotary(module, args, out):
        sink.put("vision.rotary.cos", _np(out[0]))
        sink.put("vision.rotary.sin", _np(out[1]))

    hooks.handles.append(visual.rotary_pos_emb.register_forward_hook(rotary))
    for index, blk in enumerate(visual.blocks):

        def before_block(module, args, kwargs, index=index):
            state["block"] = index
            sink.put("vision.cu_seqlens", _np(kwargs["cu_seqlens"]))

        hooks.handles.append(blk.register_forward_pre_hook(before_block, with_kwargs=True))
        hooks.out(blk, block_stage_id(index))
        hooks.out(blk.norm1, block_stage_id(index, "norm1"))
        heads = blk.attn.num_heads
        hooks.out(
            blk.attn.qkv, block_stage_id(index, "attn.v"), lambda o, h=heads: o.reshape(o.shape[0], 3, h, -1)[:, 2]
        )
        hooks.into(blk.attn.proj, block_stage_id(index, "attn.context"))
        hooks.out(blk.attn, block_stage_id(index, "attn.out"))
        hooks.into(blk.norm2, block_stage_id(index, "residual1"))
        hooks.out(blk.norm2, block_stage_id(index, "norm2"))
        hooks.out(blk.mlp.linear_fc1, block_stage_id(index, "mlp.fc1"))
        hooks.out(blk.mlp.act_fn, block_stage_id(index, "mlp.act"))
        hooks.out(blk.mlp.linear_fc2, block_stage_id(index, "mlp.fc2"))
    for branch, merger in enumerate(visual.deepstack_merger_list):
        _merger_hooks(hooks, merger, deepstack_stage_id(branch))
    _merger_hooks(hooks, visual.merger, "vision.merger")

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

    try:
        with ExitStack() as stack, torch.no_grad():
            stack.enter_context(replaced(modeling, "apply_rotary_pos_emb_vision", rope))
            stack.enter_context(replaced(modeling, "get_vision_interpolation_indices_and_weights", interpolation))
            visual(*_tower_inputs(model, inputs))
    finally:
        hooks.remove()


def capture_text(model: Any, inputs: ModelInputs, sink: StageSink) -> None:
    """Prefill the whole model on the prompt (hooks on the text layers and the DeepStack adds), then greedy
    decode with the cache."""
    import torch

    text = inputs.text
    language = model.model.language_model
    image = text.vision_slots  # the image slots, then the video slots
    seen: dict[str, Any] = {}
    hooks = _Hooks(sink)
    hooks.handles.append(
        language.register_forward_pre_hook(
            lambda module, args, kwargs: seen.update(embeds=kwargs["inputs_embeds"], positions=kwargs["position_ids"]),
            with_kwargs=True,
        )
    )
    layers = list(language.layers)
    branches = len(model.config.vision_config.deepstack_visual_indexes)
    for index, layer in enumerate(layers):
        hooks.handles.append(layer.register_forward_hook(_layer_out(sink, index, image if index < branches else None)))
        if index < branches:  # after the add: what the next layer (or the final norm) receives
            following = layers[index + 1] if index + 1 < len(layers) else language.norm
            hooks.handles.append(
                following.register_forward_pre_hook(
                    lambda m, args, index=index: sink.put(f"text.layer.{index}.deepstack", _np(args[0][0])[image])
                )
            )
    hooks.out(language.norm, "text.norm.last", lambda out: out[0, -1])
    ids = torch.from_numpy(text.input_ids)[None]
    vision = torch_vision_kwargs(model, inputs)  # images and videos apart (pixels and grids of each)
    try:
        with torch.no_grad():
            out = model(
                input_ids=ids,
                **vision,
                mm_token_type_ids=torch.from_numpy(text.mm_token_type_ids)[None],
                use_cache=True,
            )
    finally:
        hooks.remove()
    embeds = _np(seen["embeds"][0])
    rows = _np(language.embed_tokens(ids)[0])
    positions = seen["positions"]
    positions = _np(positions[-3:, 0] if positions.dim() == 3 else positions)
    put_text_inputs(inputs, sink, embeds, rows, positions, _np(model.model.rope_deltas))
    logits = _np(out.logits[0, -1])
    sink.put("text.logits.last", logits)
    cache = out.cache  # the decode steps append to it in place

    offsets = AppliedOffsets()
    step = decode_step(model, cache, offsets)
    put_greedy(sink, logits, step, text.max_new_tokens, forced=text.forced)
    offsets.put(sink)  # the offset each decode step applied


def _layer_out(sink: StageSink, index: int, image: np.ndarray | None):
    """A forward hook writing layer ``index``'s own output (before any DeepStack add): every position, the last,
    and (for a layer followed by an add) the image slots."""

    def record(module, args, out) -> None:
        hidden = _np((out[0] if isinstance(out, tuple) else out)[0])
        sink.put(f"text.layer.{index}", hidden)
        sink.put(f"text.layer.{index}.last", hidden[-1])
        if image is not None:
            sink.put(f"text.layer.{index}.image", hidden[image])

    return record


def _merger_replay(merger, kind: str, x):
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
            return _np(_merger_replay(visual.deepstack_merger_list[branch], kind.split(".", 1)[1], args[0]))
        if block is None:
            return _np(_merger_replay(visual.merger, kind.split(".", 1)[1], args[0]))
        return _np(_block_replay(visual.blocks[block], kind, args, ctx, dtype, modeling))


def _block_replay(blk, kind: str, args: list, ctx: Any, dtype, modeling):
    import torch

    cos = torch.from_numpy(ctx.cos).to(dtype)
    sin = torch.from_numpy(ctx.sin).to(dtype)
    bounds = torch.from_numpy(ctx.cu_seqlens.astype(np.int32))
    if kind == "block":
        return blk(args[0], cu_seqlens=bounds, position_embeddings=(cos, sin))
    if kind in ("attn.q", "attn.k", "attn.v"):
        rows = args[0].shape[0]
        q, k, v = blk.attn.qkv(args[0]).reshape(rows, 3, blk.attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        q, k = modeling.apply_rotary_pos_emb_vision(q, k, cos, sin)
        return {"attn.q": q, "attn.k": k, "attn.v": v}[kind]
    if kind == "attn.context":
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in args)
        lengths = (bounds[1:] - bounds[:-1]).tolist()
        parts = [
            modeling.eager_attention_forward(blk.attn, qs, ks, vs, None, scaling=blk.attn.scaling)[0]
            for qs, ks, vs in zip(*(torch.split(t, lengths, dim=2) for t in (q, k, v)), strict=True)
        ]
        return torch.cat(parts, dim=1).reshape(args[0].shape[0], -1)
    operators = {
        "norm1": lambda: blk.norm1(args[0]),
        "attn.out": lambda: blk.attn.proj(args[0]),
        "residual1": lambda: args[0] + args[1],
        "norm2": lambda: blk.norm2(args[0]),
        "mlp.fc1": lambda: blk.mlp.linear_fc1(args[0]),
        "mlp.act": lambda: blk.mlp.act_fn(args[0]),
        "mlp.fc2": lambda: blk.mlp.linear_fc2(args[0]),
    }
    return operators[kind]()
