"""Qwen2.5-VL's ready-made hypothesis patches (``patch: driftscope.hypotheses:NAME`` in a parameter file).

Each takes the loaded model of the runtime it is given (mlx-vlm's ``Model`` or transformers'
``Qwen2_5_VLForConditionalGeneration``) and changes it in place to test a "what if".
"""

from __future__ import annotations

from typing import Any

from ..capabilities import HypothesesCapabilities
from ..qwen_shared.tower import scale_block_output

__all__ = [
    "norm2_in_float32",
    "perturb_image_embeddings",
    "plant_defect",
    "scale_block_output",
    "video_time_positions",
]


#: Which introduced errors each ready patch closes (``Family.ready_patches``): the runtime and the stages where
#: the error it addresses is introduced (a half-precision norm2 on MLX: ``precisions``, the activation dtypes it
#: can change anything in).
CLOSES = {
    "norm2_in_float32": {
        "runtimes": ("mlx",),
        "stages": ("vision.block.*.norm2",),
        "precisions": ("float16", "bfloat16"),
        "defect": "the block's second RMSNorm squares and sums its input in the half-precision activation dtype, "
        "where the reference computes it in float32",
    },
    "video_time_positions": {
        "runtimes": ("mlx",),
        "stages": ("text.position_ids",),
        "defect": "mlx-vlm steps a video's M-RoPE time positions by 1 per temporal patch, never reading "
        "second_per_grid_ts, where transformers steps them by tokens_per_second * second_per_grid_t",
    },
}
CAPABILITIES = HypothesesCapabilities(closes=CLOSES)


def _vision(model: Any) -> Any:
    if hasattr(model, "vision_tower"):  # mlx-vlm
        return model.vision_tower
    return model.model.visual  # transformers


def norm2_in_float32(model: Any) -> Any:
    """Run every vision block's norm2 in float32 and cast back ("what if norm2 ran in f32?"; MLX only)."""
    import mlx.core as mx

    vision = _vision(model)

    class _Float32Norm:
        def __init__(self, norm: Any):
            self.norm = norm
            self.weight = norm.weight.astype(mx.float32)

        def __call__(self, x):
            return mx.fast.rms_norm(x.astype(mx.float32), self.weight, self.norm.eps).astype(x.dtype)

    for block in vision.blocks:
        object.__setattr__(block, "norm2", _Float32Norm(block.norm2))
    return model


def perturb_image_embeddings(model: Any, scale: float = -2.0) -> Any:
    """Multiply the merged image embeddings by ``scale`` where mlx-vlm writes them into the prompt (MLX only).

    The vision tower is untouched, so every vision stage still passes and the first failing stage is
    ``text.embeds.image``: the shape of a merge that scrambles or rescales image features.
    """
    original = model.merge_input_ids_with_image_features

    def merge(image_token_id, video_token_id, image_features, inputs_embeds, input_ids):
        return original(image_token_id, video_token_id, image_features * scale, inputs_embeds, input_ids)

    object.__setattr__(model, "merge_input_ids_with_image_features", merge)
    return model


def video_time_positions(model: Any, second_per_grid_ts: list | None = None) -> Any:
    """mlx-vlm's M-RoPE positions with each video's temporal positions stepped by ``tokens_per_second *
    second_per_grid_t`` per temporal patch, as transformers' ``get_rope_index`` steps them (MLX only).

    mlx-vlm 0.7.10's Qwen2.5-VL steps a video's temporal positions by 1 whatever its frame rate (it never reads
    ``second_per_grid_ts``), so a video whose ``tokens_per_second * temporal_patch_size / fps`` is not 1 gets
    other positions than transformers' (found at ``text.position_ids``). ``second_per_grid_ts``: per video, the
    seconds one temporal patch spans (``temporal_patch_size / fps``: 0.5 for the four-frame fixture at 4 fps);
    the report's ``inputs.video_prompt`` gives each video's value."""
    import mlx.core as mx
    import numpy as np

    from ..qwen_shared.mrope import mrope_positions

    language = model.language_model
    config = language.config
    step = float(config.vision_config.tokens_per_second)
    seconds = [float(s) for s in (second_per_grid_ts or [])]

    def get_rope_index(input_ids, image_grid_thw=None, video_grid_thw=None, attention_mask=None):
        ids = np.asarray(input_ids)
        if video_grid_thw is None or ids.shape[0] != 1:
            return original(input_ids, image_grid_thw, video_grid_thw, attention_mask)
        types = np.where(ids[0] == config.image_token_id, 1, np.where(ids[0] == config.video_token_id, 2, 0))
        grids = {1: iter(np.asarray(image_grid_thw).tolist()) if image_grid_thw is not None else iter([])}
        grids[2] = iter(np.asarray(video_grid_thw).tolist())
        times = iter(seconds + [1 / step] * len(np.asarray(video_grid_thw)))  # not given: mlx-vlm's own step 1
        runs = [int(kind) for kind, _ in _runs(types) if kind]
        ordered = [next(grids[kind]) for kind in runs]
        intervals = [step * next(times) if kind == 2 else 1 for kind in runs]
        positions, delta = mrope_positions(types.tolist(), ordered, config.vision_config.spatial_merge_size, intervals)
        return mx.array(positions[:, None, :]), mx.array([[delta]])

    original = language.get_rope_index
    object.__setattr__(language, "get_rope_index", get_rope_index)
    return model


def _runs(types):
    from itertools import groupby

    return [(kind, len(list(run))) for kind, run in groupby(types.tolist())]


#: The module (under the vision tower) whose weights compute each vision stage, and which rows of them: the fused
#: qkv projection's thirds are q, k and v.
_WEIGHTS = {
    "patch_embed": ("patch_embed.proj", None),
    "norm1": ("norm1", None),
    "attn.q": ("attn.qkv", 0),
    "attn.k": ("attn.qkv", 1),
    "attn.v": ("attn.qkv", 2),
    "attn.out": ("attn.proj", None),
    "norm2": ("norm2", None),
    "mlp.gate": ("mlp.gate_proj", None),
    "mlp.up": ("mlp.up_proj", None),
    "mlp.down": ("mlp.down_proj", None),
    "merger.norm": ("merger.ln_q", None),
    "merger.hidden": ("merger.mlp.0", None),
    "merger.window": ("merger.mlp.2", None),
}


def _child(owner: Any, path: str) -> Any:
    for name in path.split("."):
        owner = owner[int(name)] if name.isdigit() else getattr(owner, name)
    return owner


def _scale(module: Any, factor: float, third: int | None) -> None:
    """Multiply a module's weight (and bias), or one third of their rows, by ``factor``, in place."""
    for name in ("weight", "bias"):
        value = getattr(module, name, None)
        if value is None:
            continue
        rows = slice(None) if third is None else slice(third * value.shape[0] // 3, (third + 1) * value.shape[0] // 3)
        if hasattr(value, "data_ptr"):  # torch
            import torch

            with torch.no_grad():
                value[rows] *= factor
        else:  # mlx
            import mlx.core as mx

            scale = mx.ones(value.shape, dtype=value.dtype)
            scale[rows] = factor
            setattr(module, name, value * scale)


def _scaled_activation(act: Any, factor: float) -> Any:
    """A torch module computing ``act(x) * factor`` (transformers hooks and replays the MLP's activation module)."""
    import torch

    class ScaledActivation(torch.nn.Module):
        def forward(self, x):
            return act(x) * factor

    return ScaledActivation()


def plant_defect(model: Any, stage: str, factor: float = 1.5) -> Any:
    """A planted defect in the one operator that computes vision ``stage`` (e.g. ``vision.block.3.mlp.gate``):
    its weights (q, k or v's third of the fused projection) scaled by ``factor``; for ``attn.context`` the softmax
    scale, for ``mlp.act`` the activation's output (transformers only: mlx-vlm calls SiLU as a function)."""
    from driftscope.errors import HypothesisPatchError

    vision = _vision(model)
    parts = stage.split(".")
    if stage.startswith("vision.block."):
        owner, kind = vision.blocks[int(parts[2])], ".".join(parts[3:])
    else:
        owner, kind = vision, ".".join(parts[1:])
    if kind == "attn.context":
        attn = owner.attn
        name = "scaling" if hasattr(attn, "scaling") else "scale"
        setattr(attn, name, getattr(attn, name) * factor)
    elif kind == "mlp.act" and hasattr(owner.mlp, "act_fn"):
        owner.mlp.act_fn = _scaled_activation(owner.mlp.act_fn, factor)
    elif kind in _WEIGHTS:
        path, third = _WEIGHTS[kind]
        _scale(_child(owner, path), factor, third)
    else:
        raise HypothesisPatchError(
            f"plant_defect cannot plant a defect in {stage!r} for this runtime",
            f"name a stage computed by weights ({', '.join(sorted(_WEIGHTS))}), attn.context or (transformers) mlp.act",
        )
    return model
