"""Every Molmo2 stage as mlx-vlm computes it, recorded by wrappers that call the original and change nothing.

Wrappers stand in for submodules (instance attributes shadow mlx's child modules), list items (ViT
and decoder blocks) and mlx-vlm's ``nn`` inside its vision module (the projector's SiLU); each is
removed again afterwards, restoring whatever was there before (a hypothesis patch stays applied).
``vision.selected.L`` is the slice of the features mlx-vlm actually concatenated, named by the
layer the checkpoint config selects: a runtime that reads another layer diverges there.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np

from .processor import Molmo2Inputs

_MISSING = object()


class _Recording:
    """Calls ``inner`` and hands its inputs and output to ``record``."""

    def __init__(self, inner: Any, record):
        self.inner = inner
        self.record = record

    def __call__(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        self.record(args, kwargs, out)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextmanager
def _shadow(owner: Any, name: str, make):
    """Make ``owner.name`` resolve to ``make(current value)``; restore the previous instance attribute after."""
    previous = owner.__dict__.get(name, _MISSING)
    object.__setattr__(owner, name, make(getattr(owner, name)))
    try:
        yield
    finally:
        if previous is _MISSING:
            object.__delattr__(owner, name)
        else:
            object.__setattr__(owner, name, previous)


@contextmanager
def _item(items: list, index: int, make):
    original = items[index]
    items[index] = make(original)
    try:
        yield
    finally:
        items[index] = original


@contextmanager
def _module_attr(module: Any, name: str, value: Any):
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


class _NNProxy:
    """Stands in for ``mlx.nn`` inside mlx-vlm's Molmo2 vision module: ``silu`` records, the rest delegates."""

    def __init__(self, nn: Any, silu):
        self._nn = nn
        self.silu = silu

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nn, name)


def _module(obj: Any) -> Any:
    """The mlx module behind wrappers (driftscope's recorders and the hypothesis patches keep it as an attribute)."""
    import mlx.nn as nn

    while not isinstance(obj, nn.Module):
        obj = next(v for k, v in vars(obj).items() if k in ("inner", "decoder"))
    return obj


def mlx_pooling(inputs: Molmo2Inputs) -> np.ndarray:
    """Pooling indices per image without the offset of earlier images (mlx-vlm adds that offset itself)."""
    return np.concatenate([layout.pooling for layout in inputs.layouts]).astype(np.int64)


def to_numpy(array: Any) -> np.ndarray:
    import mlx.core as mx

    if array.dtype in (mx.bfloat16, mx.float16):
        array = array.astype(mx.float32)
    return np.array(array)


def capture(model: Any, inputs: Molmo2Inputs, selected_layers: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Run mlx-vlm's Molmo2 ``Model`` once on ``inputs``; ``{stage id: array}``."""
    import mlx.core as mx
    from mlx_vlm.models.molmo2 import vision as vision_module

    out: dict[str, np.ndarray] = {}

    def put(stage_id: str, value: Any) -> None:
        out[stage_id] = to_numpy(value)

    def output(stage_id, transform=lambda v: v):
        return lambda inner: _Recording(inner, lambda a, k, o: put(stage_id, transform(o)))

    def argument(stage_id, index=0, transform=lambda v: v):
        return lambda inner: _Recording(inner, lambda a, k, o: put(stage_id, transform(a[index])))

    def both(*makers):
        def make(inner):
            for maker in makers:
                inner = maker(inner)
            return inner

        return make

    tower = model.vision_tower
    vit = tower.image_vit
    blocks = list(vit.transformer)
    text = _module(model.language_model.model)
    with ExitStack() as stack:
        enter = stack.enter_context
        enter(_shadow(vit, "patch_embedding", output("vision.patch_embed")))
        enter(_item(vit.transformer, 0, argument("vision.positioned")))
        for index, block in enumerate(blocks):
            s = f"vision.block.{index}."
            attn, mlp = block.attention, block.feed_forward

            def heads(value, attn=attn):
                return value.reshape(*value.shape[:-1], attn.num_heads, attn.head_dim)

            enter(_shadow(block, "attention_norm", output(s + "norm1")))
            enter(_shadow(attn, "wq", output(s + "attn.q", heads)))
            enter(_shadow(attn, "wk", output(s + "attn.k", heads)))
            enter(_shadow(attn, "wv", output(s + "attn.v", heads)))
            enter(_shadow(attn, "wo", both(argument(s + "attn.context"), output(s + "attn.out"))))
            enter(_shadow(block, "ffn_norm", both(argument(s + "residual1"), output(s + "norm2"))))
            enter(_shadow(mlp, "w1", output(s + "mlp.fc1")))
            enter(_shadow(mlp, "act", output(s + "mlp.act")))
            enter(_shadow(mlp, "w2", output(s + "mlp.fc2")))
        for index in range(len(vit.transformer)):
            enter(_item(vit.transformer, index, output(f"vision.block.{index}")))
        enter(_shadow(tower, "encode_image", output("vision.concatenated", lambda v: v[0])))
        enter(
            _shadow(
                tower,
                "image_pooling_2d",
                both(
                    argument("pool.query", 0, lambda q: q[:, 0]),
                    argument("pool.gathered", 1),
                    output("pool.output", lambda v: v[:, 0]),
                ),
            )
        )
        projector = tower.image_projector
        first = lambda v: v[0]  # noqa: E731 - the projector runs on [batch, tokens, ...]
        enter(_shadow(projector, "w1", output("projector.gate", first)))
        enter(_shadow(projector, "w3", output("projector.up", first)))
        enter(
            _shadow(projector, "w2", both(argument("projector.product", 0, first), output("projector.output", first)))
        )
        nn_silu = vision_module.nn.silu

        def silu(x):
            y = nn_silu(x)
            put("projector.act", y[0])
            return y

        enter(_module_attr(vision_module, "nn", _NNProxy(vision_module.nn, silu)))
        patch = model.config.image_patch_id
        image_slots = inputs.input_ids == patch
        enter(
            _shadow(
                model.language_model,
                "model",
                argument("text.embeds.image", 1, lambda embeds: embeds[0][mx.array(np.flatnonzero(image_slots))]),
            )
        )
        for index in range(len(text.blocks)):
            enter(_item(text.blocks, index, output(f"text.layer.{index}.last", lambda h: h[0, -1])))
        enter(_shadow(text, "ln_f", output("text.norm.last", lambda h: h[0, -1])))
        pixel_values = mx.array(inputs.pixel_values).astype(vit.patch_embedding.weight.dtype)
        result = model(
            mx.array(inputs.input_ids)[None],
            pixel_values,
            image_token_pooling=mx.array(mlx_pooling(inputs)),
            image_grids=mx.array(inputs.grids),
            image_num_crops=mx.array(inputs.num_crops),
        )
        mx.eval(result.logits)
    out["text.logits.last"] = to_numpy(result.logits[0, -1])
    table = to_numpy(vit.positional_embedding)
    if tuple(vit.config.image_num_patch) == (int(round(table.shape[0] ** 0.5)),) * 2:
        out["vision.pos_embed"] = table  # mlx-vlm adds the table as is (it would resize it for another grid)
    out["pool.valid_counts"] = (mlx_pooling(inputs) >= 0).sum(-1).astype(np.int32)
    width = out["vision.block.0"].shape[-1]
    concatenated = out["vision.concatenated"]
    if concatenated.shape[-1] == width * len(selected_layers):
        for slot, layer in enumerate(selected_layers):
            out[f"vision.selected.{layer}"] = concatenated[..., slot * width : (slot + 1) * width]
    return out
