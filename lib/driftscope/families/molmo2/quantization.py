"""What quantized policies need to know about Molmo2: its tensor groups in both namings, the MLX -> checkpoint
name map, the config MLX-community directories carry, and the stages that are one linear layer's output.

The vision side is the ViT, the attention pooler and the projector (``model.vision_backbone.``); the text side
the decoder and ``lm_head``. The patch embedding is a linear layer over 14 x 14 x 3 = 588 pixel values, which no
group size (32, 64, 128) divides: it stays dense and is reported (``left_dense``). The position table and the word
embeddings are plain parameters in mlx-vlm (not ``nn.Embedding``), so they stay dense as ``nn.quantize`` leaves them.
"""

from __future__ import annotations

import numpy as np

from driftscope.model.quant.names import NameMap
from driftscope.model.quant.profiles import LinearSite, QuantProfile
from driftscope.model.quant.select import TensorGroups

from .config import mlx_config
from .plan import parse_stage

VIT = "vision_tower.image_vit."
#: block substage -> the linear layer (under ``vision_tower.image_vit.transformer.N.``) whose output it is
BLOCK_LINEARS = {
    "attn.q": "attention.wq",
    "attn.k": "attention.wk",
    "attn.v": "attention.wv",
    "attn.out": "attention.wo",
    "mlp.fc1": "feed_forward.w1",
    "mlp.fc2": "feed_forward.w2",
}
#: head stage -> its linear layer (the pooler's output reads two stages, so it has no single-input replay)
HEAD_LINEARS = {
    "vision.patch_embed": VIT + "patch_embedding",
    "projector.gate": "vision_tower.image_projector.w1",
    "projector.up": "vision_tower.image_projector.w3",
    "projector.output": "vision_tower.image_projector.w2",
}


def dense_config(config: dict) -> dict:
    """``config`` without the empty ``vision_config`` mlx-vlm's layout carries next to ``vit_config``
    (transformers would build its default ViT from it)."""
    if config.get("vit_config") and not config.get("vision_config"):
        return {key: value for key, value in config.items() if key != "vision_config"}
    return dict(config)


def _as_stage(output: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The layer's ``(rows, out_features)`` output in the stage's shape (heads split, crops and patches apart)."""
    return output.reshape(shape)


def linear_site(stage_id: str) -> LinearSite | None:
    """The linear layer whose output ``stage_id`` is (the stage's replay input is the layer's input)."""
    block, kind = parse_stage(stage_id)
    if block is None:
        module = HEAD_LINEARS.get(stage_id)
        return None if module is None else LinearSite(module, _as_stage)
    if kind not in BLOCK_LINEARS:
        return None
    return LinearSite(f"{VIT}transformer.{block}.{BLOCK_LINEARS[kind]}", _as_stage)


PROFILE = QuantProfile(
    checkpoint=TensorGroups(vision=("model.vision_backbone.",), text=("model.transformer.", "lm_head.")),
    mlx=TensorGroups(vision=("vision_tower.",), text=("language_model.",)),
    mlx_names=NameMap(
        # mlx-vlm's ``Model.sanitize`` in reverse; its ViT blocks are a list, the checkpoint's ``resblocks``
        renames=(
            (VIT + "transformer.", "model.vision_backbone.image_vit.transformer.resblocks."),
            ("vision_tower.", "model.vision_backbone."),
            ("language_model.model.", "model.transformer."),
            ("language_model.lm_head.", "lm_head."),
        ),
    ),
    mlx_config=mlx_config,
    linears=linear_site,
    dense_config=dense_config,
)
