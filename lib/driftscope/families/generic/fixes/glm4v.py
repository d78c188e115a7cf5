"""mlx-vlm 0.7.10's GLM-4.1V vision embeddings interpolate the position table bilinearly with zero padding
(``glm4v/vision.py`` line 126 calls ``kernels.grid_sample``, ``mlx_vlm/models/kernels.py`` line 473: "bilinear grid
sample", taps outside the table read 0), where transformers samples it bicubically with border padding
(``modeling_glm4v.py`` ``Glm4vVisionEmbeddings.forward``: ``F.grid_sample(..., mode="bicubic",
padding_mode="border", align_corners=False)``). The two agree only where every patch falls on a table cell (an image
whose patch grid is the table's own size); any other image size gets other position embeddings.

``glm4v_bicubic_positions`` samples the table as transformers does (``bicubic_grid_sample``: torch's CPU bicubic
kernel, cubic convolution with A = -0.75, each tap clamped to the border)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..patching import mlx_call, mlx_vlm_port

__all__ = ["glm4v_bicubic_positions"]

CLOSES = {
    "glm4v_bicubic_positions": {
        "runtimes": ("mlx",),
        "stages": ("vision.embeddings",),
        "model_types": ("glm4v",),
        "defect": "mlx-vlm interpolates the vision position table bilinearly with zero padding, where transformers "
        "samples it bicubically with border padding: any image whose patch grid is not the table's own size differs",
    }
}

#: model type -> runtime -> the ready patch that closes every defect found in that runtime's port of it (the
#: sweep runs each failing model type again with these)
WHOLE = {"glm4v": {"mlx": "glm4v_bicubic_positions"}}

#: torch's bicubic convolution constant (``aten/src/ATen/native/UpSample.h``)
CUBIC_A = -0.75


def _cubic_weights(t: np.ndarray) -> np.ndarray:
    """``[..., 4]`` weights of the taps at -1, 0, 1, 2 for fractional offsets ``t`` (torch's ``get_cubic_upsample
    _coefficients``)."""
    a = CUBIC_A

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=-1)


def bicubic_grid_sample(table: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``table`` ``[H, W, C]`` sampled at normalized points ``x``, ``y`` in [-1, 1] (``[N]`` each) as
    ``torch.nn.functional.grid_sample(mode="bicubic", padding_mode="border", align_corners=False)`` does:
    ``[N, C]`` (float64 arithmetic)."""
    height, width, _ = table.shape
    ix = ((x.astype(np.float64) + 1) * width - 1) / 2
    iy = ((y.astype(np.float64) + 1) * height - 1) / 2
    x0, y0 = np.floor(ix), np.floor(iy)
    wx, wy = _cubic_weights(ix - x0), _cubic_weights(iy - y0)
    taps = np.arange(-1, 3)
    cols = np.clip(x0[:, None].astype(np.int64) + taps, 0, width - 1)  # border: each tap clamped
    rows = np.clip(y0[:, None].astype(np.int64) + taps, 0, height - 1)
    values = table.astype(np.float64)[rows[:, :, None], cols[:, None, :]]  # [N, 4 rows, 4 cols, C]
    return np.einsum("nrcd,nr,nc->nd", values, wy, wx)


def _embed(self, embeddings, lengths, image_shapes, h_coords, w_coords):
    """mlx-vlm's ``Glm4vVisionEmbeddings.__call__`` with transformers' bicubic, border-padded interpolation."""
    import mlx.core as mx

    weight = self.position_embedding.weight
    side = int(weight.shape[0] ** 0.5)
    table = np.array(weight.astype(mx.float32)).reshape(side, side, -1)
    shapes = np.array(image_shapes).reshape(-1, 3)
    counts = [int(n) for n in (np.array(lengths).reshape(-1) if not isinstance(lengths, list) else lengths)]
    target_h = np.repeat(shapes[:, 1], counts).astype(np.float32)
    target_w = np.repeat(shapes[:, 2], counts).astype(np.float32)
    norm_w = ((np.array(w_coords).astype(np.float32) + 0.5) / target_w) * 2 - 1
    norm_h = ((np.array(h_coords).astype(np.float32) + 0.5) / target_h) * 2 - 1
    adapted = bicubic_grid_sample(table, norm_w, norm_h).astype(np.float32)
    return embeddings + mx.array(adapted).astype(weight.dtype)


def glm4v_bicubic_positions(model: Any) -> Any:
    """Interpolate the vision position table as transformers does (see the module docstring)."""
    tower = mlx_vlm_port(model, "glm4v", "glm4v_bicubic_positions").vision_tower
    mlx_call(tower.embeddings, _embed)
    return model
