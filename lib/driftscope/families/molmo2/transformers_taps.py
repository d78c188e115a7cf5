"""Every Molmo2 stage as transformers computes it, recorded by forward hooks that change nothing.

ViT stages are [crops, patches, ...]; ``attn.q/k/v`` are split into heads. The pooler's stages come
from the arguments and output of its attention (``pool.gathered`` is the masked gather it attends
over, ``pool.query`` its query); text stages from the decoder's layers and the logits.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import numpy as np

from .processor import Molmo2Inputs


def _np(tensor: Any) -> np.ndarray:
    return tensor.detach().to("cpu").float().numpy().copy() if tensor.dtype.is_floating_point else tensor.numpy()


def capture(model: Any, inputs: Molmo2Inputs, selected_layers: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Run ``Molmo2ForConditionalGeneration`` once on ``inputs``; ``{stage id: array}``."""
    import torch

    out: dict[str, np.ndarray] = {}
    vision = model.model.vision_tower
    adapter = model.model.multi_modal_projector
    text = model.model.language_model

    def put(stage_id: str, value: Any) -> None:
        out[stage_id] = _np(value)

    def after(module, stage_id, transform=lambda value: value):
        return module.register_forward_hook(lambda _m, _args, result: put(stage_id, transform(result)))

    def before(module, stage_id, index=0, transform=lambda value: value):
        return module.register_forward_pre_hook(lambda _m, args: put(stage_id, transform(args[index])))

    with ExitStack() as stack:
        handles = [after(vision.patch_embedding, "vision.patch_embed"), before(vision.layers[0], "vision.positioned")]
        for index, layer in enumerate(vision.layers):
            s = f"vision.block.{index}."
            attn = layer.self_attn
            split = attn.head_dim

            def heads(value, split=split):
                return value.reshape(*value.shape[:-1], -1, split)

            handles += [
                after(layer.layer_norm1, s + "norm1"),
                after(attn.q_proj, s + "attn.q", heads),
                after(attn.k_proj, s + "attn.k", heads),
                after(attn.v_proj, s + "attn.v", heads),
                before(attn.o_proj, s + "attn.context"),
                after(attn.o_proj, s + "attn.out"),
                before(layer.layer_norm2, s + "residual1"),
                after(layer.layer_norm2, s + "norm2"),
                after(layer.mlp.fc1, s + "mlp.fc1"),
                before(layer.mlp.fc2, s + "mlp.act"),
                after(layer.mlp.fc2, s + "mlp.fc2"),
                after(layer, f"vision.block.{index}"),
            ]
        pooling = adapter.image_pooling_2d
        projector = adapter.image_projector
        handles += [
            before(adapter, "vision.concatenated"),
            before(adapter, "pool.valid_counts", 1, lambda idx: (idx >= 0).sum(-1).to(torch.int32)),
            before(pooling, "pool.query", 0, lambda q: q[:, 0]),
            before(pooling, "pool.gathered", 1),
            after(pooling, "pool.output", lambda result: result[0][:, 0]),
            after(projector.gate_proj, "projector.gate"),
            after(projector.act_fn, "projector.act"),
            after(projector.up_proj, "projector.up"),
            before(projector.down_proj, "projector.product"),
            after(projector.down_proj, "projector.output"),
        ]
        for index, layer in enumerate(text.layers):
            handles.append(after(layer, f"text.layer.{index}.last", lambda h: h[0, -1]))
        handles.append(after(text.norm, "text.norm.last", lambda h: h[0, -1]))
        for handle in handles:
            stack.callback(handle.remove)

        def embeds(_module, _args, kwargs):
            image = torch.from_numpy(inputs.input_ids == model.config.image_patch_id)
            put("text.embeds.image", kwargs["inputs_embeds"][0][image])

        stack.callback(text.register_forward_pre_hook(embeds, with_kwargs=True).remove)
        with torch.no_grad():
            result = model(**inputs.transformers_kwargs())
    out["text.logits.last"] = _np(result.logits[0, -1])
    out["vision.pos_embed"] = _np(vision.positional_embedding)
    for layer in selected_layers:
        out[f"vision.selected.{layer}"] = out[f"vision.block.{layer}"]
    return out


def load_model(path: Any, dtype: str = "float32") -> Any:
    """transformers' ``Molmo2ForConditionalGeneration`` with eager attention (hooks see every op)."""
    import torch
    from transformers import Molmo2ForConditionalGeneration

    return Molmo2ForConditionalGeneration.from_pretrained(
        str(path), dtype=getattr(torch, dtype), attn_implementation="eager"
    ).eval()
