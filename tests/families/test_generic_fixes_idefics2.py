"""mlx-vlm 0.7.10's Idefics2, as the sweep investigates its tester checkpoint: three defects, each found where the
one before it is patched (``idefics2_fixes`` with ``skip``), and closed by its ready patch (docs/families.md)."""

from __future__ import annotations

import numpy as np
import pytest
from generic_sweep_support import conclusion, investigate_sweep, rows, verdict

FIXES = ("idefics2_position_ids", "idefics2_tanh_gelu", "idefics2_sliding_window")


def test_the_patch_position_ids_are_transformers_bucketing():
    """``position_ids`` against transformers' formula written out: for a 4x4 table and a 3x2 image of a 4x4 mask,
    rows 0, 1/3, 2/3 fall in buckets 0, 1, 2 and columns 0, 1/2 in 0, 2; masked patches keep 0."""
    from driftscope.families.generic.fixes.idefics2 import position_ids

    mask = np.zeros((1, 4, 4), dtype=bool)
    mask[0, :3, :2] = True
    expected = np.zeros((4, 4), dtype=np.int64)
    expected[:3, :2] = np.array([0, 1, 2])[:, None] * 4 + np.array([0, 2])[None, :]
    np.testing.assert_array_equal(position_ids(mask, 4), expected.reshape(1, -1))


def test_unpatched_the_first_divergence_is_the_vision_position_ids(tmp_path):
    """mlx-vlm computes position id -2 for the one-patch grid (``np.digitize(...) - 1`` on both axes); transformers 0.
    Position ids are index math: the first divergence is that data stage, and its ready patch is named."""
    report = investigate_sweep("idefics2", tmp_path)
    first = report.data["first_divergence"]["mlx:f32"]
    assert first["stage"] == "vision.embeddings.position_embedding.input"
    assert (first["reference_value"], first["candidate_value"]) == (0.0, -2.0)
    said = conclusion(report)
    assert said["kind"] == "data"
    assert "driftscope.hypotheses:idefics2_position_ids" in said["ready_patches"]


@pytest.mark.parametrize(
    "skip,introduced",
    [
        (FIXES[1:], "vision.block.0.mlp.activation_fn"),  # positions fixed: the fast GELU
        (FIXES[2:], "text.layer.0.self_attn"),  # and the GELU: the text model's missing window
    ],
)
def test_each_next_defect_is_introduced_by_its_operator(skip, introduced, tmp_path):
    report = investigate_sweep("idefics2", tmp_path, "idefics2_fixes", skip=list(skip))
    said = conclusion(report)
    assert said["kind"] == "introduced" and said["stage"] == introduced
    assert f"driftscope.hypotheses:{FIXES[len(FIXES) - len(skip)]}" in said["ready_patches"]


def test_the_three_patches_close_every_stage(tmp_path):
    report = investigate_sweep("idefics2", tmp_path, "idefics2_fixes")
    found = rows(report)
    assert found["vision.embeddings.position_embedding.input"]["status"] == "pass"
    assert found["vision.block.0.mlp.activation_fn"]["status"] == "pass"
    assert found["text.layer.0.self_attn"]["status"] == "pass"
    assert verdict(report) == "pass"


def test_the_patches_refuse_another_port():
    from driftscope.errors import HypothesisPatchError
    from driftscope.families.generic.fixes.idefics2 import idefics2_fixes

    with pytest.raises(HypothesisPatchError, match="corrects mlx-vlm's idefics2 port"):
        idefics2_fixes(object())
