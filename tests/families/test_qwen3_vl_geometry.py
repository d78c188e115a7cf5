"""Qwen3-VL geometry against transformers' own helpers (property tests) and F.interpolate."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from driftscope.errors import InputError
from driftscope.families.qwen3_vl.geometry import (
    cu_seqlens,
    grid_side,
    interpolation,
    merge_order_coordinates,
    pack_bucket,
    position_ids,
)
from driftscope.families.qwen_shared.mrope import mrope_positions
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.qwen3_vl import modeling_qwen3_vl as modeling

# merged-grid sides 1..24 (patch sides 2..48, even: the merge needs them), 1-2 frames, 1-3 images
grids = st.lists(
    st.tuples(st.integers(1, 2), st.integers(1, 24).map(lambda n: 2 * n), st.integers(1, 24).map(lambda n: 2 * n)),
    min_size=1,
    max_size=3,
)
sides = st.sampled_from([2, 3, 7, 16, 48])


@settings(max_examples=15, deadline=None)
@given(grids, sides)
def test_interpolation_is_transformers_helper_bit_for_bit(grid, side):
    indices, weights = interpolation(grid, side)
    expected_indices, expected_weights = modeling.get_vision_interpolation_indices_and_weights(
        torch.tensor(grid), side, mode="bilinear", align_corners=True, spatial_merge_size=2
    )
    np.testing.assert_array_equal(indices, expected_indices.numpy())
    np.testing.assert_array_equal(weights, expected_weights.numpy())
    np.testing.assert_allclose(weights.sum(1), 1.0, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 24), st.integers(1, 24), sides)
def test_interpolated_table_is_bilinear_align_corners(merged_h, merged_w, side):
    """Independent of the helper: gather-and-weight equals F.interpolate of the table (float64), in merge order.

    The weights are float32 (as transformers' are): |error| <= ~1e-6 per unit of table value; a wrong tap or
    weight would be off by a sizeable fraction of a table value."""
    h, w = 2 * merged_h, 2 * merged_w
    table = torch.randn(side * side, 8, generator=torch.Generator().manual_seed(side + h + w), dtype=torch.float64)
    indices, weights = interpolation([(1, h, w)], side)
    gathered = (table[torch.from_numpy(indices)] * torch.from_numpy(weights).double()[:, :, None]).sum(1)
    image = table.T.reshape(1, 8, side, side)
    resized = F.interpolate(image, size=(h, w), mode="bilinear", align_corners=True)[0]  # [8, h, w]
    rows, cols = merge_order_coordinates(h, w)
    np.testing.assert_allclose(gathered.numpy(), resized[:, rows, cols].T.numpy(), atol=5e-5)


@settings(max_examples=15, deadline=None)
@given(grids)
def test_rotary_positions_and_bounds_are_transformers(grid):
    expected = modeling.get_vision_position_ids(torch.tensor(grid), 2)
    np.testing.assert_array_equal(position_ids(grid, 2), expected.numpy())
    from transformers.vision_utils import get_vision_cu_seqlens

    np.testing.assert_array_equal(cu_seqlens(grid), get_vision_cu_seqlens(torch.tensor(grid)).numpy())


@settings(max_examples=12, deadline=None)
@given(grids, st.integers(0, 3).map(lambda n: 4 * n))
def test_bucket_pads_with_isolated_weightless_rows(grid, extra):
    bucket = pack_bucket(grid, 48, rows=sum(t * h * w for t, h, w in grid) + extra)
    active = bucket.active
    assert bucket.rows == active + extra
    np.testing.assert_array_equal(bucket.interp_indices[:active], interpolation(grid, 48)[0])
    assert not bucket.interp_weights[active:].any() and not bucket.positions[active:].any()
    padding = bucket.segments[active:]
    assert (padding < 0).all() and len(set(padding.tolist())) == extra
    assert np.array_equal(np.bincount(bucket.segments[:active]), np.diff(bucket.cu_seqlens))
    assert sum(bucket.merged_per_image) == bucket.active_merged


def _rope_index_model():
    from transformers import Qwen3VLConfig, Qwen3VLModel

    config = Qwen3VLConfig(
        text_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8),
        vision_config=dict(depth=1, hidden_size=16, num_heads=2, out_hidden_size=16, deepstack_visual_indexes=[]),
    )
    return Qwen3VLModel(config)


ROPE_MODEL = []


@settings(max_examples=12, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 5), st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=3),
    st.integers(1, 5),
)
def test_text_mrope_positions_are_transformers(images, tail):
    """driftscope's M-RoPE ids equal Qwen3VLModel.get_rope_index for text/image layouts (images are always
    separated by text: <|vision_end|><|vision_start|> in a real prompt)."""
    if not ROPE_MODEL:
        ROPE_MODEL.append(_rope_index_model())
    types, grid = [], []
    for text_run, merged_h, merged_w in images:
        types += [0] * text_run + [1] * (merged_h * merged_w)
        grid.append((1, 2 * merged_h, 2 * merged_w))
    types += [0] * tail
    ids = torch.tensor([[5 if t == 0 else 6 for t in types]])
    expected, delta = ROPE_MODEL[0].get_rope_index(
        ids, mm_token_type_ids=torch.tensor([types]), image_grid_thw=torch.tensor(grid)
    )
    positions, ours = mrope_positions(types, grid, 2)
    np.testing.assert_array_equal(positions, expected[:, 0].numpy())
    assert ours == int(delta[0, 0])


def test_bad_geometry_is_named():
    with pytest.raises(InputError, match="not a square"):
        grid_side(2300)
    assert grid_side(2304) == 48
    with pytest.raises(InputError, match="too small"):
        pack_bucket([(1, 16, 16)], 48, rows=128)
    with pytest.raises(InputError, match="multiple of the merge unit"):
        pack_bucket([(1, 16, 16)], 48, rows=258)


@settings(max_examples=15, deadline=None)
@given(grids, sides)
def test_nearest_reads_the_heaviest_bilinear_tap_and_agrees_exactly_on_table_rows(grid, side):
    """Nearest-neighbour resampling (a registered mutation) reads the tap bilinear weighs most; where every
    patch lands on a table row the two read the same rows (and the mutation is declared blind)."""
    from driftscope.families.qwen3_vl.geometry import lands_on_table_rows, nearest_indices

    indices, weights = interpolation(grid, side)
    nearest = nearest_indices(grid, side)
    heaviest = weights.max(axis=1)
    chosen = weights[np.arange(len(nearest)), np.argmax(indices == nearest[:, None], axis=1)]
    assert ((indices == nearest[:, None]).any(axis=1)).all()
    ties = np.isclose(weights, heaviest[:, None], atol=1e-6).sum(axis=1) > 1  # a half-way point rounds either way
    assert ((chosen >= heaviest - 1e-6) | ties).all()
    if lands_on_table_rows(grid, side):
        np.testing.assert_array_equal(indices[np.arange(len(nearest)), weights.argmax(axis=1)], nearest)


def test_a_48_grid_on_the_48_table_lands_on_rows_and_a_16_grid_does_not():
    from driftscope.families.qwen3_vl.geometry import lands_on_table_rows

    assert lands_on_table_rows([(1, 48, 48)], 48) and lands_on_table_rows([(1, 2, 2)], 48)
    assert not lands_on_table_rows([(1, 16, 16)], 48)


def test_the_mask_audit_is_zero_for_a_packed_bucket_and_counts_every_leak():
    from dataclasses import replace

    from driftscope.families.qwen3_vl.geometry import audit_bucket

    bucket = pack_bucket([(1, 16, 16), (1, 16, 16)], 48, rows=520)
    assert audit_bucket(bucket) == dict.fromkeys(audit_bucket(bucket), 0)
    leaky = replace(bucket, segments=np.where(bucket.segments >= 0, 0, bucket.segments).astype(np.int32))
    assert audit_bucket(leaky)["cross_image"] == 2 * 256 * 256
    padded = replace(bucket, segments=np.where(bucket.segments >= 0, bucket.segments, 1).astype(np.int32))
    audit = audit_bucket(padded)
    assert audit["real_to_padding"] == 256 * 8 and audit["padding_to_real"] == 8 * 256
    assert audit["padding_not_self_only"] == 8
