"""Load a transformers-5 Qwen3-VL checkpoint (or an MLX-community quantized one) with mlx-vlm 0.7.10's model code.

mlx-vlm reads the text RoPE from ``text_config.rope_theta`` and ``rope_scaling {type, mrope_section,
mrope_interleaved}``; transformers 5 writes ``rope_parameters``. mlx-vlm's vision tower refuses the
vision ``model_type`` ``qwen3_vl_vision`` that transformers writes and wants ``qwen3_vl``.
``adapt_config`` converts in memory; the checkpoint directory is never copied or edited. After
that, every tensor loads strictly with mlx-vlm's own key sanitizing (no renaming here).

mlx-vlm hard-codes what the config may say otherwise: the tanh GELU in the vision MLP and RoPE
theta 10000 in the vision tower; ``check_config`` refuses a checkpoint that disagrees.
"""

from __future__ import annotations

import copy
import glob
from pathlib import Path
from typing import Any

from ...errors import CheckpointError
from ..qwen_shared.text import tied_head

#: What mlx-vlm 0.7.10's Qwen3-VL vision tower computes whatever the config says.
MLX_VISION_ACT = "gelu_pytorch_tanh"
MLX_VISION_ROPE_THETA = 10000.0


def adapt_config(config: dict, vision_type: str = "qwen3_vl") -> dict:
    """The mlx-vlm view of a transformers-5 Qwen3-VL config (a new dict); ``vision_type`` is the vision
    ``model_type`` mlx-vlm's tower of that model accepts."""
    adapted = copy.deepcopy(config)
    text = dict(adapted.get("text_config") or {})
    rope = dict(text.get("rope_parameters") or adapted.get("rope_parameters") or {})
    if rope:
        text.setdefault("rope_theta", rope.get("rope_theta", 5e6))
        text.setdefault(
            "rope_scaling",
            {
                "type": rope.get("rope_type", "default"),
                "mrope_section": list(rope.get("mrope_section", [24, 20, 20])),
                "mrope_interleaved": bool(rope.get("mrope_interleaved", True)),
            },
        )
    text["model_type"] = adapted.get("model_type", "qwen3_vl")
    if "tie_word_embeddings" in adapted:  # transformers reads the top level (a re-saved MoE config has both)
        text["tie_word_embeddings"] = bool(adapted["tie_word_embeddings"])
    text.setdefault("tie_word_embeddings", False)
    adapted["text_config"] = text
    vision = dict(adapted.get("vision_config") or {})
    vision["model_type"] = vision_type
    adapted["vision_config"] = vision
    return adapted


def check_config(config: dict) -> None:
    """Refuse a checkpoint whose vision settings mlx-vlm would silently replace with its own."""
    vision = dict(config.get("vision_config") or {})
    act = vision.get("hidden_act", MLX_VISION_ACT)
    theta = float((vision.get("rope_parameters") or {}).get("rope_theta", MLX_VISION_ROPE_THETA))
    if act != MLX_VISION_ACT:
        raise CheckpointError(
            f"vision hidden_act is {act!r}; mlx-vlm 0.7.10 computes {MLX_VISION_ACT!r} regardless",
            "compare this checkpoint through transformers and the JAX emitter only, or patch mlx-vlm's vision MLP",
        )
    if theta != MLX_VISION_ROPE_THETA:
        raise CheckpointError(
            f"vision rope_theta is {theta}; mlx-vlm 0.7.10 uses {MLX_VISION_ROPE_THETA} regardless",
            "compare this checkpoint through transformers and the JAX emitter only, or patch mlx-vlm's vision RoPE",
        )


def load_mlx_model(path: str | Path, config: dict, vision_type: str = "qwen3_vl", prepare=None) -> Any:
    """mlx-vlm's Qwen3-VL ``Model`` with the checkpoint's safetensors weights (strict load); ``prepare`` (tensors
    -> tensors) puts a layout mlx-vlm's sanitizing does not expect into the one it does, before it runs."""
    from driftscope.model.blas import mlx_blas

    mlx_blas()  # before the first `import mlx.core`
    import mlx.core as mx
    from mlx_vlm import utils

    check_config(config)
    adapted = adapt_config(config, vision_type)
    model_module, _ = utils.get_model_and_args(config=adapted)
    model_config = model_module.ModelConfig.from_dict(adapted)
    model_config = utils.update_module_configs(model_config, model_module, adapted, ["text", "vision"])
    model = model_module.Model(model_config)
    weight_files = sorted(glob.glob(str(Path(path) / "*.safetensors")))
    if not weight_files:
        raise CheckpointError(f"checkpoint {path} has no *.safetensors files", "save it with save_pretrained")
    weights: dict[str, Any] = {}
    for weight_file in weight_files:
        weights.update(mx.load(weight_file))
    for name in tied_head(config):  # derived from the embedding: mlx-vlm's tied model has no such parameter
        weights.pop(name, None)
    if prepare is not None:
        weights = prepare(weights)
    weights = utils.sanitize_weights(model, weights)
    weights = utils.sanitize_weights(model_module.VisionModel, weights, model_config.vision_config)
    weights = utils.sanitize_weights(model_module.LanguageModel, weights, model_config.text_config)
    try:  # mlx-vlm's own install: an MLX-community checkpoint's quantized layers become quantized modules
        utils.load_model_weights(model, adapted, weights, Path(path), strict=True)
    except ValueError as err:
        raise CheckpointError(
            f"mlx-vlm's {vision_type} model does not take checkpoint {path}'s tensors as they are: {err}",
            "where transformers loads this checkpoint, config.json describes these weights and the MLX port is the "
            "limit: leave mlx out for it (the run's other runtimes still run); otherwise re-save config.json and "
            "the weights together with save_pretrained",
        ) from err
    mx.eval(model.parameters())
    model.eval()
    return model
