"""Qwen3-VL taps from transformers' own model code, captured through hooks (a draft of the family's
transformers side: plain dicts of stage id -> numpy until the Family interface settles).

Every tap is the value the forward computed: module outputs and inputs through hooks, q/k after RoPE
from transformers' own RoPE function (wrapped for the call), the interpolated position table from the
gathered rows of ``pos_embed`` times the weights the forward used. Text taps separate the two meanings
of a decoder layer's output: before the DeepStack add (the layer's own output) and after it (the next
layer's input), which transformers' ``hidden_states`` conflates.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from .plan import block_stage_id, deepstack_stage_id


def _np(tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy()


@contextmanager
def _replaced(module: Any, name: str, value: Any):
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield original
    finally:
        setattr(module, name, original)


def load_model(path: str | Path, dtype: str = "float32"):
    """transformers' Qwen3-VL with eager attention on the CPU, in ``dtype`` (float32 or float64)."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    model = Qwen3VLForConditionalGeneration.from_pretrained(
        str(path), dtype=getattr(torch, dtype), attn_implementation="eager", use_safetensors=True
    )
    return model.eval()


class _Hooks:
    def __init__(self, taps: dict):
        self.taps = taps
        self.handles: list = []

    def out(self, module, stage_id: str, transform=None):
        def hook(m, args, out):
            self.taps[stage_id] = _np(transform(out) if transform else out)

        self.handles.append(module.register_forward_hook(hook))

    def into(self, module, stage_id: str, index: int = 0):
        self.handles.append(
            module.register_forward_pre_hook(lambda m, args: self.taps.__setitem__(stage_id, _np(args[index])))
        )

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _merger_hooks(hooks: _Hooks, merger, stage: str) -> None:
    hooks.out(merger.norm, stage + ".norm")
    hooks.out(merger.linear_fc1, stage + ".fc1")
    hooks.out(merger.act_fn, stage + ".act")
    hooks.out(merger, stage)


def capture_vision(model, pixel_values: np.ndarray, grid_thw: np.ndarray) -> dict[str, np.ndarray]:
    """Every vision stage (blocks, substages, mergers, DeepStack branches) of one forward of the tower."""
    import torch
    from transformers.models.qwen3_vl import modeling_qwen3_vl as modeling

    visual = model.model.visual
    taps: dict[str, np.ndarray] = {}
    state: dict[str, Any] = {"block": None}
    hooks = _Hooks(taps)
    hooks.out(visual.patch_embed, "vision.patch_embed")

    def pos_rows(module, args, out):
        taps["vision.pos_embed"] = _np((out * state["interp_weights"][:, :, None]).sum(1))

    hooks.handles.append(visual.pos_embed.register_forward_hook(pos_rows))
    hooks.into(visual.rotary_pos_emb, "vision.positioned")

    def rotary(module, args, out):
        taps["vision.rotary.cos"], taps["vision.rotary.sin"] = _np(out[0]), _np(out[1])

    hooks.handles.append(visual.rotary_pos_emb.register_forward_hook(rotary))
    for index, blk in enumerate(visual.blocks):

        def before_block(module, args, kwargs, index=index):
            state["block"] = index
            if index == 0:
                taps["vision.cu_seqlens"] = _np(kwargs["cu_seqlens"])

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
        taps[block_stage_id(state["block"], "attn.q")] = _np(q_out)
        taps[block_stage_id(state["block"], "attn.k")] = _np(k_out)
        return q_out, k_out

    def interp(*args, **kwargs):
        indices, weights = original_interp(*args, **kwargs)
        state["interp_weights"] = weights
        taps["vision.interp_indices"], taps["vision.interp_weights"] = _np(indices), _np(weights)
        return indices, weights

    dtype = next(visual.parameters()).dtype
    try:
        with ExitStack() as stack, torch.no_grad():
            stack.enter_context(_replaced(modeling, "apply_rotary_pos_emb_vision", rope))
            stack.enter_context(_replaced(modeling, "get_vision_interpolation_indices_and_weights", interp))
            visual(
                torch.from_numpy(np.asarray(pixel_values)).to(dtype), grid_thw=torch.from_numpy(np.asarray(grid_thw))
            )
    finally:
        hooks.remove()
    return taps


def capture_text(
    model, input_ids: np.ndarray, pixel_values: np.ndarray, grid_thw: np.ndarray, image_token_id: int
) -> dict[str, np.ndarray]:
    """One prefill of the whole model: text inputs, each layer before and after its DeepStack add, logits."""
    import torch

    language = model.model.language_model
    taps: dict[str, np.ndarray] = {}
    seen: dict[str, Any] = {}
    ids = np.asarray(input_ids)
    image = ids == image_token_id
    hooks = _Hooks(taps)
    hooks.handles.append(
        language.register_forward_pre_hook(
            lambda m, args, kwargs: seen.update(embeds=kwargs["inputs_embeds"], positions=kwargs["position_ids"]),
            with_kwargs=True,
        )
    )
    layers = list(language.layers)
    for index, layer in enumerate(layers):
        hooks.out(layer, f"text.layer.{index}.before")
        following = layers[index + 1] if index + 1 < len(layers) else language.norm
        hooks.into(following, f"text.layer.{index}.hidden")
    hooks.out(language.norm, "text.norm")
    dtype = next(model.parameters()).dtype
    try:
        with torch.no_grad():
            out = model(
                input_ids=torch.from_numpy(ids)[None],
                pixel_values=torch.from_numpy(np.asarray(pixel_values)).to(dtype),
                image_grid_thw=torch.from_numpy(np.asarray(grid_thw)),
                mm_token_type_ids=torch.from_numpy(image.astype(np.int64))[None],
            )
    finally:
        hooks.remove()
    result = {
        "text.position_ids": _np(seen["positions"][:, 0]),
        "text.embeds.image": _np(seen["embeds"][0])[image],
        "text.norm.last": taps.pop("text.norm")[0, -1],
        "text.logits.last": _np(out.logits[0, -1]),
    }
    branches = len(model.config.vision_config.deepstack_visual_indexes)
    for index in range(len(layers)):
        before, after = taps[f"text.layer.{index}.before"][0], taps[f"text.layer.{index}.hidden"][0]
        result[f"text.layer.{index}.last"] = before[-1]
        result[f"text.layer.{index}.hidden"] = after
        if index < branches:
            result[f"text.layer.{index}.deepstack"] = after[image]
    return result
