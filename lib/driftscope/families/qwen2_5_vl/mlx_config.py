"""Load a transformers-5 Qwen2.5-VL checkpoint (or an MLX-community quantized one) with mlx-vlm's model code.

mlx-vlm 0.7 reads the older config layout: text settings at the top level and ``rope_scaling``
with ``type: mrope``. transformers 5 nests them under ``text_config`` with ``rope_parameters``.
``adapt_config`` converts in memory; the checkpoint directory is never copied or edited.
"""

from __future__ import annotations

import copy
import glob
from pathlib import Path
from typing import Any

from ...errors import CheckpointError
from ..qwen_shared.text import tied_head


def adapt_config(config: dict) -> dict:
    """The mlx-vlm view of a transformers-5 Qwen2.5-VL config (a new dict)."""
    adapted = copy.deepcopy(config)
    text = dict(adapted.get("text_config") or {})
    rope = dict(text.pop("rope_parameters", None) or adapted.pop("rope_parameters", None) or {})
    if "rope_scaling" not in text and rope:
        text["rope_scaling"] = {
            "type": "mrope" if "mrope_section" in rope else rope.get("rope_type", "default"),
            "mrope_section": rope.get("mrope_section", [16, 24, 24]),
            "rope_type": rope.get("rope_type", "default"),
        }
        text.setdefault("rope_theta", rope.get("rope_theta", 1e6))
    text["model_type"] = adapted.get("model_type", "qwen2_5_vl")
    for key, value in text.items():
        if key not in ("vision_config", "text_config"):
            adapted.setdefault(key, value)
            if key in ("rope_scaling", "rope_theta"):
                adapted[key] = value
    adapted["text_config"] = text
    vision = dict(adapted.get("vision_config") or {})
    vision["model_type"] = adapted.get("model_type", "qwen2_5_vl")
    vision.setdefault("out_hidden_size", text.get("hidden_size"))
    adapted["vision_config"] = vision
    return adapted


#: The spatial merge mlx-vlm 0.7.10's Qwen2.5-VL merger is built with, whatever the config says.
MLX_SPATIAL_MERGE = 2


def unrepresentable(config: dict, path=None) -> list[str]:
    """The settings of ``config`` mlx-vlm's Qwen2.5-VL port cannot represent, each naming its key."""
    merge = int((config.get("vision_config") or {}).get("spatial_merge_size", MLX_SPATIAL_MERGE))
    if merge == MLX_SPATIAL_MERGE:
        return []
    return [f"vision_config.spatial_merge_size is {merge}; mlx-vlm's merger always merges {MLX_SPATIAL_MERGE}x2"]


def load_mlx_model(path: Path, config: dict) -> Any:
    """mlx-vlm's Qwen2.5-VL ``Model`` with the checkpoint's safetensors weights (strict)."""
    import mlx.core as mx
    from mlx_vlm import utils

    adapted = adapt_config(config)
    model_module, _ = utils.get_model_and_args(config=adapted)
    model_config = model_module.ModelConfig.from_dict(adapted)
    model_config = utils.update_module_configs(model_config, model_module, adapted, ["text", "vision"])
    model = model_module.Model(model_config)
    weight_files = sorted(glob.glob(str(Path(path) / "*.safetensors")))
    weights: dict[str, Any] = {}
    for weight_file in weight_files:
        weights.update(mx.load(weight_file))
    for name in tied_head(config):  # derived from the embedding: mlx-vlm's tied model has no such parameter
        weights.pop(name, None)
    weights = utils.sanitize_weights(model, weights)
    weights = utils.sanitize_weights(model_module.VisionModel, weights, model_config.vision_config)
    weights = utils.sanitize_weights(model_module.LanguageModel, weights, model_config.text_config)
    try:  # mlx-vlm's own install: an MLX-community checkpoint's quantized layers become quantized modules
        utils.load_model_weights(model, adapted, weights, Path(path), strict=True)
    except ValueError as err:
        raise CheckpointError(
            f"checkpoint {path} does not match mlx-vlm's Qwen2.5-VL model: {err}",
            "check that config.json describes these weights (depth, hidden sizes)",
        ) from err
    mx.eval(model.parameters())
    model.eval()
    return model
