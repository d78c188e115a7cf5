"""Qwen2.5-VL's geometry against transformers' own functions, property-based (hypothesis): no hand-copied arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from driftscope.families.qwen2_5_vl.geometry import (
    audit_masks,
    audit_unreorder,
    bucket_masks,
    cu_seqlens,
    is_involution,
    misplaced_tokens,
    mrope_positions,
    pack_images,
    position_ids,
    reverse_by_argsort,
    reverse_by_rank_scatter,
    window_layout,
)
from driftscope.families.qwen2_5_vl.inputs import ResizeSpec, preprocess, smart_resize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import vision_utils
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
grid = st.tuples(st.just(1), st.integers(1, 40).map(lambda n: 2 * n), st.integers(1, 40).map(lambda n: 2 * n))
grids = st.lists(grid, min_size=1, max_size=4)
small_grid = st.tuples(st.just(1), st.integers(1, 16).map(lambda n: 2 * n), st.integers(1, 16).map(lambda n: 2 * n))


def _hf_window(grids_):
    index, bounds = vision_utils.get_vision_window_index(torch.tensor(grids_), 2, 112, 14)
    return index.numpy(), bounds.numpy()


@FAST
@given(grids)
def test_window_index_and_bounds_equal_transformers(grids_):
    layout = window_layout(grids_)
    index, bounds = _hf_window(grids_)
    assert np.array_equal(layout.window_index, index)
    assert np.array_equal(layout.cu_window_seqlens, bounds)
    hf_full = vision_utils.get_vision_cu_seqlens(torch.tensor(grids_)).numpy()
    assert np.array_equal(cu_seqlens(grids_), hf_full)
    hf_pos = vision_utils.get_vision_position_ids(torch.tensor(grids_), 2).numpy()
    assert np.array_equal(position_ids(grids_), hf_pos)


@FAST
@given(st.lists(small_grid, min_size=1, max_size=3), st.integers(0, 3))
def test_packing_reproduces_the_reference_window_order(grids_, extra_merged):
    active = sum(t * h * w for t, h, w in grids_)
    bucket = pack_images(grids_, active + 4 * extra_merged)
    rng = np.random.default_rng(len(grids_))
    raster = rng.standard_normal((active, 3))
    padded = np.concatenate([raster, np.zeros((bucket.rows - active, 3))])
    index, _ = _hf_window(grids_)
    # transformers' permute_input_for_window_attn, written in numpy
    expected = raster.reshape(-1, 4, 3)[index].reshape(-1, 3)
    assert np.array_equal(padded[bucket.patch_gather][:active], expected)
    merged = rng.standard_normal((bucket.rows // 4, 2))
    restored = merged[bucket.merged_restore]
    assert np.array_equal(restored[: active // 4], merged[: active // 4][np.argsort(index)])
    full, window = bucket_masks(bucket)
    assert audit_masks(full, window, bucket).ok


@FAST
@given(
    st.integers(8, 3000),
    st.integers(8, 3000),
    st.sampled_from([56 * 56, 112 * 112, 256 * 28 * 28]),
    st.sampled_from([28 * 28 * 256, 28 * 28 * 1280, 12845056]),
)
def test_smart_resize_equals_transformers(height, width, min_pixels, max_pixels):
    if max(height, width) / min(height, width) > 200:
        return
    spec = ResizeSpec(min_pixels=min_pixels, max_pixels=max_pixels)
    assert smart_resize(height, width, spec) == hf_smart_resize(height, width, 28, min_pixels, max_pixels)


@pytest.fixture(scope="module")
def processor(tiny_checkpoint):
    from driftscope.families.qwen_shared.processor import load_image_processor

    return load_image_processor(tiny_checkpoint)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(30, 700), st.integers(30, 700), st.integers(0, 2**16))
def test_preprocess_equals_the_checkpoint_processor(processor, tiny_checkpoint, height, width, seed):
    from PIL import Image

    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    reference = processor(images=[image], return_tensors="np")
    pixels, grid_ = preprocess(image, ResizeSpec.from_checkpoint(tiny_checkpoint.path))
    assert [list(grid_)] == np.asarray(reference["image_grid_thw"]).tolist()
    np.testing.assert_allclose(pixels, np.asarray(reference["pixel_values"]), rtol=0, atol=1e-6)


def test_resize_settings_follow_the_checkpoint(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text('{"min_pixels": 200704, "patch_size": 14}')
    spec = ResizeSpec.from_checkpoint(tmp_path)
    assert spec.min_pixels == 200704 and spec.max_pixels == ResizeSpec().max_pixels
    assert smart_resize(112, 112, spec) == hf_smart_resize(112, 112, 28, 200704, spec.max_pixels) == (448, 448)
    assert ResizeSpec.from_checkpoint(tmp_path / "missing").source == "family defaults"


@pytest.fixture(scope="module")
def hf_model(tiny_checkpoint):
    import transformers

    return transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(str(tiny_checkpoint.path)).model


prompt = st.lists(
    st.one_of(st.integers(1, 6).map(lambda n: ("text", n)), grid.map(lambda g: ("image", g))), min_size=1, max_size=5
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt)
def test_mrope_positions_equal_get_rope_index(hf_model, parts):
    types, image_grids = [], []
    for kind, value in parts:
        if kind == "text":
            types += [0] * value
        else:  # <|vision_start|> image tokens <|vision_end|>, as every real prompt has
            types += [0] + [1] * (value[0] * (value[1] // 2) * (value[2] // 2)) + [0]
            image_grids.append(value)
    if not image_grids:
        return  # get_rope_index expects a vision + text sequence
    ids = torch.tensor([[5 if t == 0 else 3 for t in types]])
    reference, delta = hf_model.get_rope_index(ids, torch.tensor([types]), image_grid_thw=torch.tensor(image_grids))
    positions, mine = mrope_positions(types, image_grids)
    assert np.array_equal(positions, reference[:, 0].numpy())
    assert mine == int(delta[0, 0])


@FAST
@given(grid)
def test_argsort_restores_and_rank_scatter_only_for_involutions(grid_):
    index = window_layout([grid_]).window_index
    assert misplaced_tokens(index, reverse_by_argsort(index)) == 0
    wrong = misplaced_tokens(index, reverse_by_rank_scatter(index))
    assert (wrong == 0) == is_involution(index)
    tokens = np.arange(len(index))
    permuted = tokens[index]
    assert np.array_equal(permuted[reverse_by_argsort(index)], tokens)


def test_the_448_image_hides_a_wrong_unreorder_and_336_does_not():
    assert audit_unreorder([[1, 32, 32]]).involution and audit_unreorder([[1, 32, 32]]).misplaced_by_rank_scatter == 0
    audit = audit_unreorder([[1, 24, 24]])
    assert not audit.involution and audit.misplaced_by_rank_scatter > 0
    single = audit_unreorder([[1, 8, 8]])  # 112x112: one window, the permutation is the identity
    assert single.identity and single.windows == 1


# mask audit: correct masks pass, each planted leak is caught ------------------------------------


@pytest.fixture()
def two_image_bucket():
    bucket = pack_images([[1, 10, 10], [1, 12, 8]], 256)
    full, window = bucket_masks(bucket)
    return bucket, full.copy(), window.copy()


def test_correct_masks_have_no_leaks(two_image_bucket):
    bucket, full, window = two_image_bucket
    audit = audit_masks(full, window, bucket)
    assert audit.ok and audit.leaks == 0 and audit.window_must_differ and audit.window_differs_from_full
    additive = np.where(full, 0.0, -np.inf)
    assert audit_masks(additive, np.where(window, 0.0, -np.inf), bucket).ok


def test_planted_cross_media_leak(two_image_bucket):
    bucket, full, window = two_image_bucket
    full[5, 150] = True
    audit = audit_masks(full, window, bucket)
    assert audit.cross_media == {"full": 1, "window": 0} and not audit.ok


def test_planted_active_to_padding_and_padding_to_active(two_image_bucket):
    bucket, full, window = two_image_bucket
    window[3, 250] = True
    full[250, 3] = True
    audit = audit_masks(full, window, bucket)
    assert audit.active_to_padding == {"full": 0, "window": 1}
    assert audit.padding_to_active == {"full": 1, "window": 0}
    assert audit.padding_not_self_only["full"] == 1


def test_planted_padding_row_that_sees_nothing_or_other_padding(two_image_bucket):
    bucket, full, window = two_image_bucket
    full[240, 240] = False  # a fully masked row: softmax over nothing is NaN
    window[241, 242] = True
    audit = audit_masks(full, window, bucket)
    assert audit.padding_not_self_only == {"full": 1, "window": 1}


def test_planted_window_mask_equal_to_full_and_cross_window_entries(two_image_bucket):
    bucket, full, window = two_image_bucket
    audit = audit_masks(full, full, bucket)  # a Qwen2-style "window" mask that is really full attention
    assert audit.window_cross_window > 0 and not audit.window_differs_from_full
    blocked = full.copy()
    blocked[0, 99] = False
    assert audit_masks(blocked, window, bucket).full_blocked_within_media == 1


def test_geometry_cli_for_the_documented_sizes(capsys):
    from driftscope.cli import main

    assert main(["geometry", "448x448", "336x336", "560x560", "448x672", "1036x1036", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    rows = {row["image"]: row for row in out["images"]}
    for size, row in rows.items():
        h, w = map(int, size.split("x"))
        grid_ = [1, *(v // 14 for v in hf_smart_resize(h, w, 28, 56 * 56, 28 * 28 * 1280))]
        assert row["grid_thw"] == grid_
        layout = window_layout([grid_])
        index, _ = _hf_window([grid_])
        assert row["windows"] == len(np.diff(_hf_window([grid_])[1])) == sum(layout.windows_per_image)
        assert row["involution"] == bool(np.array_equal(index[index], np.arange(len(index))))
    assert rows["448x448"]["involution"] and rows["448x448"]["misplaced_by_rank_scatter"] == 0
    assert rows["1036x1036"]["padded_windows"] > 0
    assert main(["geometry", "140x140", "140x140", "--bucket", "256"]) == 0
    text = capsys.readouterr().out
    assert "bucket: 256 rows, 200 active, 56 padding" in text and "mask audit: ok" in text
    assert main(["geometry", "140x140", "140x140", "--bucket", "128"]) == 2
    assert "need 200 patch rows" in capsys.readouterr().err
