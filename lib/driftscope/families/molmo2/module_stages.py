"""Molmo2's stages that are a module's output or input, declared for both sides (``taps.module_taps``): paths from
transformers' ``model.model`` and mlx-vlm's ``vision_tower`` (the names differ), ``{i}`` each ViT layer; and the
decoder's. What no module gives is written by ``transformers_taps`` and ``mlx_taps``: the position table (a
parameter), and on MLX the selected layers' features (what a method returns), the pooler's valid slots (from the
indices) and the projector's SiLU (a function its module calls).
"""

from __future__ import annotations

import numpy as np

from driftscope.taps.module_taps import ModuleTap, Select, argument, decoder_taps, each, output

TORCH_VIT, MLX_VIT = "vision_tower.layers.{i}", "image_vit.transformer.{i}"
TORCH_ADAPTER = "multi_modal_projector"


def heads(head_dim: int) -> Select:
    """A projection's output ``[..., heads * head_dim]`` split into ``[..., heads, head_dim]``."""

    def select(array: np.ndarray) -> np.ndarray:
        return array.reshape(*array.shape[:-1], -1, head_dim)

    return select


def selected_slot(slot: int, count: int) -> Select:
    """Slot ``slot`` of the ``count`` selected layers' features concatenated on the last axis (a numpy or an MLX
    array)."""

    def select(features: np.ndarray) -> np.ndarray:
        width = features.shape[-1] // count
        return features[..., slot * width : (slot + 1) * width]

    return select


def _first(array: np.ndarray) -> np.ndarray:  # mlx-vlm's projector runs on [batch, tokens, ...]
    return array[0]


def _first_query(array: np.ndarray) -> np.ndarray:
    return array[:, 0]


def _valid_counts(pooling: np.ndarray) -> np.ndarray:
    return (pooling >= 0).sum(-1)


def _vit(stage: str, torch: tuple[str, bool], mlx: tuple[str, bool], select: Select | None = None) -> ModuleTap:
    """A ViT layer's stage: each side's module under its layer and whether the stage is that module's input."""

    def port(layer: str, path: str, is_input: bool):
        where = f"{layer}.{path}" if path else layer
        return argument(where, select) if is_input else output(where, select)

    return ModuleTap(f"vision.block.{{i}}{stage}", port(TORCH_VIT, *torch), port(MLX_VIT, *mlx))


def vit_taps(depth: int, head_dim: int) -> list[ModuleTap]:
    """The ViT's stages on one side's ``depth`` layers (each side builds the table with its own depth)."""
    split = heads(head_dim)
    return [
        ModuleTap("vision.patch_embed", output("vision_tower.patch_embedding"), output("image_vit.patch_embedding")),
        ModuleTap("vision.positioned", argument("vision_tower.layers.0"), argument("image_vit.transformer.0")),
        *each(
            depth,
            _vit(".norm1", ("layer_norm1", False), ("attention_norm", False)),
            _vit(".attn.q", ("self_attn.q_proj", False), ("attention.wq", False), split),
            _vit(".attn.k", ("self_attn.k_proj", False), ("attention.wk", False), split),
            _vit(".attn.v", ("self_attn.v_proj", False), ("attention.wv", False), split),
            _vit(".attn.context", ("self_attn.o_proj", True), ("attention.wo", True)),
            _vit(".attn.out", ("self_attn.o_proj", False), ("attention.wo", False)),
            _vit(".residual1", ("layer_norm2", True), ("ffn_norm", True)),
            _vit(".norm2", ("layer_norm2", False), ("ffn_norm", False)),
            _vit(".mlp.fc1", ("mlp.fc1", False), ("feed_forward.w1", False)),
            _vit(".mlp.act", ("mlp.fc2", True), ("feed_forward.act", False)),
            _vit(".mlp.fc2", ("mlp.fc2", False), ("feed_forward.w2", False)),
            _vit("", ("", False), ("", False)),
        ),
    ]


def adapter_taps(selected_layers: list[int]) -> list[ModuleTap]:
    """The adapter's stages: the selected layers' features and their concatenation (transformers: the adapter's
    input), the pooler's query, gathered patches and output, the projector's pieces."""
    pool, projector = f"{TORCH_ADAPTER}.image_pooling_2d", f"{TORCH_ADAPTER}.image_projector"
    count = len(selected_layers)
    return [
        *(
            ModuleTap(f"vision.selected.{layer}", argument(TORCH_ADAPTER, selected_slot(slot, count)))
            for slot, layer in enumerate(selected_layers)
        ),
        ModuleTap("vision.concatenated", argument(TORCH_ADAPTER)),
        ModuleTap("pool.valid_counts", argument(TORCH_ADAPTER, _valid_counts, index=1)),
        ModuleTap("pool.query", argument(pool, _first_query), argument("image_pooling_2d", _first_query)),
        ModuleTap("pool.gathered", argument(pool, index=1), argument("image_pooling_2d", index=1)),
        ModuleTap("pool.output", output(pool, _first_query, item=(0,)), output("image_pooling_2d", _first_query)),
        ModuleTap("projector.gate", output(f"{projector}.gate_proj"), output("image_projector.w1", _first)),
        ModuleTap("projector.act", output(f"{projector}.act_fn")),
        ModuleTap("projector.up", output(f"{projector}.up_proj"), output("image_projector.w3", _first)),
        ModuleTap("projector.product", argument(f"{projector}.down_proj"), argument("image_projector.w2", _first)),
        ModuleTap("projector.output", output(f"{projector}.down_proj"), output("image_projector.w2", _first)),
    ]


def text_taps(layers: int) -> list[ModuleTap]:
    """The decoder's stages: transformers' ``model.model.language_model`` layers and norm, mlx-vlm's decoder's
    blocks and final norm."""
    return decoder_taps(layers, torch=("layers", "norm"), mlx=("blocks", "ln_f"))
