"""Three defects of mlx-vlm 0.7.10's Idefics2, each with its ready patch (``idefics2_fixes``: all three).

``idefics2_position_ids``: its vision embeddings bucket the patch positions wrongly (``idefics2/vision.py`` lines
135-157): its boundaries are ``np.linspace(1/n, 1.0, n, endpoint=False)`` (n values from 1/n spaced (1 - 1/n)/n, not
transformers' n - 1 boundaries ``torch.arange(1/n, 1.0, 1/n)``) and its bucket is ``np.digitize(..., right=True) - 1``
(the first patch row and column land in bucket -1). Every position id differs from transformers'
(``modeling_idefics2.py`` ``Idefics2VisionEmbeddings.forward``): negative ids index the position table from its end,
and below ``-n*n`` (the testers' one-patch grid, id -2 of a 1-row table) read outside it.

The patch gives mlx-vlm's embeddings transformers' bucketing (idefics3's port already does it so).

``idefics2_tanh_gelu``: its vision MLP is ``FastGELUMLP`` (``idefics2/vision.py`` line 8: ``x * sigmoid(1.702 x)``)
whatever the checkpoint's ``vision_config.hidden_act`` says; transformers' ``Idefics2VisionConfig`` defaults to
``gelu_pytorch_tanh``, and mlx-vlm's ``VisionConfig`` has no ``hidden_act``. The patch sets each MLP's GELU to the
formula ``hidden_act`` names (idefics3's port uses the tanh GELU).

``idefics2_sliding_window``: its text model (Mistral) attends causally over the whole prompt (``idefics2/language.py``
line 127: ``create_attention_mask(h, cache)``, no window; its ``TextConfig`` has no ``sliding_window``), where
transformers' ``MistralModel`` masks each query to the last ``text_config.sliding_window`` positions (4096, Mistral's
default and the published checkpoints'; the tester's 32). Every prompt longer than the window differs from its
window's end on. The patch builds the same sliding-window mask (mlx-vlm's ``create_attention_mask(...,
window_size=...)``, which its caches also take while decoding)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..patching import checkpoint_config, mlx_activation, mlx_call, mlx_closes, mlx_vlm_port

__all__ = ["idefics2_fixes", "idefics2_position_ids", "idefics2_sliding_window", "idefics2_tanh_gelu"]

CLOSES = mlx_closes(
    {
        "idefics2_position_ids": (
            ("vision.embeddings.position_embedding.input",),
            "mlx-vlm buckets the vision patch positions with other boundaries than transformers "
            "(n values from 1/n, digitize(right=True) - 1): every position id differs, the first row and column "
            "read -1",
        ),
        "idefics2_tanh_gelu": (
            ("vision.block.*.mlp.activation_fn",),
            "mlx-vlm's vision MLP computes the fast GELU x * sigmoid(1.702 x) whatever the checkpoint's "
            "vision hidden_act declares (the tanh GELU by default)",
        ),
        "idefics2_sliding_window": (
            ("text.layer.*.self_attn",),
            "mlx-vlm's Mistral text model attends causally over the whole prompt, where "
            "transformers masks each query to the last sliding_window positions",
        ),
    },
    "idefics2_fixes",
    "idefics2",
)

#: model type -> runtime -> the ready patch that closes every defect found in that runtime's port of it (the
#: sweep runs each failing model type again with these)
WHOLE = {"idefics2": {"mlx": "idefics2_fixes"}}


def position_ids(mask: np.ndarray, per_side: int) -> np.ndarray:
    """``[batch, patches]`` position ids of a ``[batch, rows, columns]`` patch mask, as transformers computes them:
    each patch's fractional row and column (float32 ``index * (1 / count)``, clamped below 1) bucketed into
    ``per_side`` buckets by the boundaries ``k / per_side`` (``torch.bucketize(..., right=True)``); 0 where masked."""
    count = int(np.ceil((1.0 - 1.0 / per_side) / (1.0 / per_side)))
    boundaries = (1.0 / per_side + np.arange(count) * (1.0 / per_side)).astype(np.float32)
    batch, rows, columns = mask.shape
    out = np.zeros((batch, rows * columns), dtype=np.int64)
    for index, patches in enumerate(mask.astype(bool)):
        step_h = np.float32(1.0) / np.float32(patches[:, 0].sum())
        step_w = np.float32(1.0) / np.float32(patches[0, :].sum())
        ceiling = np.float32(1.0 - 1e-6)
        coords_h = np.minimum(np.arange(rows, dtype=np.float32) * step_h, ceiling)
        coords_w = np.minimum(np.arange(columns, dtype=np.float32) * step_w, ceiling)
        bucket_h = np.searchsorted(boundaries, coords_h, side="right")
        bucket_w = np.searchsorted(boundaries, coords_w, side="right")
        ids = (bucket_h[:, None] * per_side + bucket_w[None, :]).reshape(-1)
        out[index] = np.where(patches.reshape(-1), ids, 0)
    return out


def _embed(self, x, mask=None):
    """mlx-vlm's ``VisionEmbeddings.__call__`` with transformers' position ids."""
    import mlx.core as mx

    batch, height, width, _ = x.shape
    patches = mx.flatten(self.patch_embedding(x), start_axis=1, end_axis=2)
    if mask is None:
        mask = np.ones((batch, height // self.patch_size, width // self.patch_size), dtype=bool)
    ids = position_ids(np.array(mask), self.num_patches)
    return patches + self.position_embedding(mx.array(ids))


def idefics2_position_ids(model: Any) -> Any:
    """Bucket the vision patches' positions as transformers does (see the module docstring)."""
    embeddings = mlx_vlm_port(model, "idefics2", "idefics2_position_ids").vision_model.embeddings
    mlx_call(embeddings, _embed)
    return model


def idefics2_tanh_gelu(model: Any, hidden_act: str | None = None) -> Any:
    """Compute each vision MLP's GELU as ``hidden_act`` names it (default: the checkpoint's
    ``vision_config.hidden_act``, else transformers' default ``gelu_pytorch_tanh``), not MLX's fast approximation."""
    name = "idefics2_tanh_gelu"
    tower = mlx_vlm_port(model, "idefics2", name).vision_model
    if hidden_act is None:
        hidden_act = (checkpoint_config(model, name).get("vision_config") or {}).get("hidden_act", "gelu_pytorch_tanh")
    for layer in tower.encoder.layers:
        layer.mlp.activation_fn = mlx_activation(hidden_act, name)  # the module the MLP calls, at the same path
    return model


def _windowed(self, inputs, inputs_embeds=None, mask=None, cache=None, **kwargs):
    """mlx-vlm's ``LanguageModel.__call__`` given the sliding-window mask where it would build a causal one."""
    from mlx_vlm.models.base import create_attention_mask

    if mask is None:
        length = inputs_embeds if inputs_embeds is not None else inputs[..., None]  # only its length is read
        mask = create_attention_mask(length, cache, window_size=self.driftscope_sliding_window)
    return super(type(self), self).__call__(inputs, inputs_embeds=inputs_embeds, mask=mask, cache=cache, **kwargs)


def idefics2_sliding_window(model: Any, sliding_window: int | None = None) -> Any:
    """Mask each text query to the last ``sliding_window`` positions, as transformers' Mistral does (default: the
    checkpoint's ``text_config.sliding_window``)."""
    text = mlx_vlm_port(model, "idefics2", "idefics2_sliding_window").language_model
    if sliding_window is None:
        sliding_window = (checkpoint_config(model, "idefics2_sliding_window").get("text_config") or {}).get(
            "sliding_window"
        )
    if sliding_window is None:
        return model  # no window: mlx-vlm's causal mask is transformers'
    object.__setattr__(text, "driftscope_sliding_window", int(sliding_window))
    mlx_call(text, _windowed)
    return model


def idefics2_fixes(model: Any, skip: list[str] | tuple[str, ...] = ()) -> Any:
    """The three corrections with the checkpoint's settings, or all but those named in ``skip`` (a runtime takes one
    patch: with ``skip`` the run's first divergence is the next defect's)."""
    for name, patch in FIXES.items():
        if name not in skip:
            patch(model)
    return model


#: the corrections in the order their defects show along the plan
FIXES = {
    "idefics2_position_ids": idefics2_position_ids,
    "idefics2_tanh_gelu": idefics2_tanh_gelu,
    "idefics2_sliding_window": idefics2_sliding_window,
}
