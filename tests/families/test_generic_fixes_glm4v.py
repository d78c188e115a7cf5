"""mlx-vlm 0.7.10's GLM-4.1V interpolates its vision position table bilinearly with zero padding where transformers
samples it bicubically with border padding; the sweep localizes it at ``vision.embeddings`` and
``glm4v_bicubic_positions`` closes it (docs/families.md)."""

from __future__ import annotations

import numpy as np
import pytest
from generic_sweep_support import conclusion, investigate_sweep, rows, verdict


def test_the_patch_samples_as_torch_grid_sample_does():
    """``bicubic_grid_sample`` against torch's own ``grid_sample`` (bicubic, border, align_corners False), points
    inside and outside the table."""
    import torch
    import torch.nn.functional as F
    from driftscope.families.generic.fixes.glm4v import bicubic_grid_sample

    rng = np.random.default_rng(0)
    table = rng.standard_normal((6, 5, 3)).astype(np.float32)
    x, y = (rng.uniform(-1.3, 1.3, 40).astype(np.float32) for _ in range(2))
    grid = torch.from_numpy(np.stack([x, y], axis=-1))[None, :, None]
    image = torch.from_numpy(table).permute(2, 0, 1)[None]
    expected = F.grid_sample(image, grid, mode="bicubic", padding_mode="border", align_corners=False)
    np.testing.assert_allclose(bicubic_grid_sample(table, x, y), expected[0, :, :, 0].T.numpy(), atol=2e-6)


def test_unpatched_the_embeddings_introduce_the_error(tmp_path):
    report = investigate_sweep("glm4v", tmp_path)
    assert report.data["first_divergence"]["mlx:f32"]["stage"] == "vision.embeddings"
    said = conclusion(report)
    assert said["kind"] == "introduced" and said["stage"] == "vision.embeddings"
    assert said["ready_patches"] == ["driftscope.hypotheses:glm4v_bicubic_positions"]
    assert rows(report)["vision.post_conv_layernorm"]["status"] == "pass"  # what the embeddings take agrees


def test_the_patch_closes_every_stage(tmp_path):
    report = investigate_sweep("glm4v", tmp_path, "glm4v_bicubic_positions")
    assert rows(report)["vision.embeddings"]["max_abs"] < 1e-5
    assert verdict(report) == "pass"


def test_the_patch_refuses_another_port():
    from driftscope.errors import HypothesisPatchError
    from driftscope.families.generic.fixes.glm4v import glm4v_bicubic_positions

    with pytest.raises(HypothesisPatchError, match="corrects mlx-vlm's glm4v port"):
        glm4v_bicubic_positions(object())
