"""Molmo2 crops, pixels, pooling indices and prompt tokens against mlx-vlm's numpy Molmo2Processor."""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.errors import InputError
from driftscope.families.molmo2.geometry import CropSpec, crop_layout, pool_windows
from driftscope.families.molmo2.inputs import image_token_string, prepare
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from molmo2_support import PROMPT, checkpoint_dirs


@pytest.fixture(scope="module")
def mlx_processor():
    from mlx_vlm.models.molmo2.processing import Molmo2Processor

    return Molmo2Processor.from_pretrained(str(checkpoint_dirs()["hub"]))


def random_image(height: int, width: int, seed: int) -> np.ndarray:
    image = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    image[0, 0] = 255  # mlx-vlm rescales images whose maximum is <= 1 (see the README's Molmo2 notes)
    return image


def assert_same_as_mlx_vlm(mlx_processor, image: np.ndarray) -> None:
    ours = prepare([image], PROMPT, mlx_processor.tokenizer, CropSpec())
    theirs = mlx_processor(text=PROMPT, images=[image])
    np.testing.assert_array_equal(ours.pixel_values, theirs["pixel_values"])
    np.testing.assert_array_equal(ours.pooling, theirs["image_token_pooling"])
    np.testing.assert_array_equal(ours.grids, theirs["image_grids"])
    np.testing.assert_array_equal(ours.num_crops, theirs["image_num_crops"])
    np.testing.assert_array_equal(ours.input_ids, theirs["input_ids"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(height=st.integers(14, 1100), width=st.integers(14, 1100), seed=st.integers(0, 2**16))
def test_pixels_indices_and_tokens_equal_mlx_vlm(mlx_processor, height, width, seed):
    assert_same_as_mlx_vlm(mlx_processor, random_image(height, width, seed))


@pytest.mark.parametrize("height,width", [(1, 1), (13, 500), (111, 112), (378, 378), (2000, 30), (700, 1400)])
def test_edge_sizes_equal_mlx_vlm(mlx_processor, height, width):
    assert_same_as_mlx_vlm(mlx_processor, random_image(height, width, 7))


@pytest.mark.parametrize("size,crops,tokens", [(224, 2, 392), (448, 5, 725)])
def test_crop_and_token_counts(size, crops, tokens):
    layout = crop_layout(size, size)
    assert (layout.crops, layout.tokens) == (crops, tokens)
    assert layout.pooling.shape == (tokens, 4)


def test_pooling_layout_448():
    layout = crop_layout(448, 448)
    assert layout.tiling == (2, 2) and layout.resized == (644, 644) and layout.grid == (14, 14, 23, 23)
    low, high = layout.pooling[:196], layout.pooling[196:]
    # low-res: 27x27 patches padded to 28x28 with the odd row/column after: the last row/column pools 2, the corner 1
    assert low[0].tolist() == [0, 1, 27, 28]
    assert low[13].tolist() == [26, -1, 53, -1] and low[-1].tolist() == [728, -1, -1, -1]
    assert (layout.valid_counts[:196] < 4).sum() == 27
    # high-res canvas 46x46 (2 crops of 19 + margins 4 + 4) pools evenly, every index offset by the 729 low-res patches
    assert (high >= 0).all() and high.min() == 729
    # each canvas patch is read from one crop; the interior margins of each crop never appear
    assert len(np.unique(high)) == 46 * 46
    local = (high - 729) % 729
    crop = (high - 729) // 729
    rows, cols = local // 27, local % 27
    assert rows[crop == 3].min() == 4 and cols[crop == 3].min() == 4  # bottom-right crop drops its top/left margin
    assert rows[crop == 0].max() == 22 and cols[crop == 0].max() == 22  # top-left crop drops its bottom/right margin


def test_pool_windows_pads_centred():
    index = np.arange(9).reshape(3, 3)
    assert pool_windows(index, 2, 2).tolist() == [[0, 1, 3, 4], [2, -1, 5, -1], [6, 7, -1, -1], [8, -1, -1, -1]]
    index = np.arange(16).reshape(4, 4)
    assert pool_windows(np.pad(index, 1, constant_values=-1)[1:-1, 1:-1], 2, 2)[0].tolist() == [0, 1, 4, 5]


def test_image_token_string_counts():
    text = image_token_string((14, 14, 23, 23))
    assert text.count("<im_patch>") == 725 and text.count("<im_col>") == 14 + 23
    assert text.startswith("<low_res_im_start>") and text.endswith("<im_end>")


def test_second_image_indices_follow_the_first(mlx_processor):
    a, b = random_image(224, 224, 1), random_image(448, 448, 2)
    inputs = prepare([a, b], PROMPT.replace("<|image|>", "<|image|><|image|>"), mlx_processor.tokenizer)
    assert inputs.num_crops.tolist() == [2, 5]
    second = inputs.pooling[392:]
    assert second[second >= 0].min() == 2 * 729  # transformers' processor offsets by the crops before it


def test_mm_token_type_ids_mark_every_image_token(mlx_processor):
    inputs = prepare([random_image(224, 224, 3)], PROMPT, mlx_processor.tokenizer)
    assert inputs.mm_token_type_ids.sum() == 392 + 14 + 14 + 4  # patches, <im_col> per row, start/end twice
    assert inputs.mm_token_type_ids[0] == 0 and inputs.mm_token_type_ids[-1] == 0


def test_bad_images_are_named():
    with pytest.raises(InputError, match="8-bit RGB"):
        prepare([np.zeros((10, 10), np.float32)], None)
    with pytest.raises(InputError, match="placeholders"):
        prepare([random_image(20, 20, 0)], "no image here", tokenizer=object())
