"""The generic family's layouts: how one side's array becomes the other's, checked against numpy's own
transpose and reshape (the reference), and refused where the shapes leave it open."""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.families.generic.layout import Layout, channels_last_to_first, find_layout


def _values(shape):
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)


@pytest.mark.parametrize(
    "source,target,expected",
    [
        ((1, 5, 7, 32), (1, 32, 5, 7), lambda a: a.transpose(0, 3, 1, 2)),  # NHWC -> NCHW
        ((1, 5, 7, 32), (1, 35, 32), lambda a: a.reshape(1, 35, 32)),  # spatial axes flattened
        ((5, 32), (1, 5, 32), lambda a: a[None]),  # a batch axis added
        ((1, 4, 10, 8), (4, 10, 8), lambda a: a[0]),  # ... or dropped
        ((1, 10, 4, 8), (1, 4, 10, 8), lambda a: a.transpose(0, 2, 1, 3)),  # heads-major vs tokens-major
        ((1, 5, 7, 32), (1, 32, 35), lambda a: a.transpose(0, 3, 1, 2).reshape(1, 32, 35)),
    ],
)
def test_a_layout_found_from_two_shapes_moves_the_values_as_numpy_does(source, target, expected):
    layout = find_layout(list(source), list(target))
    assert isinstance(layout, Layout), layout
    values = _values(source)
    np.testing.assert_array_equal(layout.apply(values), expected(values))
    assert Layout.from_dict(layout.to_dict()) == layout


def test_square_spatial_axes_take_the_one_layout_that_moves_a_single_axis_and_say_so():
    layout = find_layout([1, 4, 4, 32], [1, 32, 4, 4])
    values = _values((1, 4, 4, 32))
    np.testing.assert_array_equal(layout.apply(values), values.transpose(0, 3, 1, 2))
    assert "single axis" in layout.why


def test_a_convolution_declares_channels_last_even_where_every_size_is_equal():
    layout = find_layout([1, 3, 3, 3], [1, 3, 3, 3], channels_last_to_first(4))
    values = _values((1, 3, 3, 3))
    np.testing.assert_array_equal(layout.apply(values), values.transpose(0, 3, 1, 2))


@pytest.mark.parametrize(
    "source,target,said",
    [
        ((2, 3, 4), (2, 3, 5), "different numbers of elements"),
        ((6, 6, 6, 6), (6, 6, 6, 6), "same layout"),
        ((2, 2, 3, 3), (3, 3, 2, 2), "declare its layout"),
    ],
)
def test_a_layout_the_shapes_leave_open_is_refused_naming_both_shapes(source, target, said):
    found = find_layout(list(source), list(target))
    if said == "same layout":
        assert isinstance(found, Layout) and found.identity
        return
    assert isinstance(found, str) and said in found and str(list(source)) in found
