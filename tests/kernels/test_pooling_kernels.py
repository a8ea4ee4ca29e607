"""max_pool_q / average_pool_q / global_average_pool_q against their loop-over-windows twins."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lpt.kernels import average_pool_q, global_average_pool_q, max_pool_q
from lpt.kernels.pooling import divide_half_even
from lpt.kernels.reference import average_pool_reference, max_pool_reference
from tests.kernels.cases import FILLS, filled, zero_points


@st.composite
def pool_case(draw):
    """A 1-D or 2-D window with pads below the kernel size, so every window meets the input."""
    rank = draw(st.sampled_from([1, 2]))
    kernel = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    strides = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    dilations = draw(st.lists(st.integers(1, 2), min_size=rank, max_size=rank))
    pads = [draw(st.integers(0, k - 1)) for k in kernel + kernel]
    spatial = [draw(st.integers(d * (k - 1) + 1, d * (k - 1) + 6)) for k, d in zip(kernel, dilations)]
    dtype = draw(st.sampled_from([np.uint8, np.int8]))
    zp = draw(zero_points(dtype))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = [draw(st.integers(1, 2)), draw(st.integers(1, 3))] + spatial
    q = filled(rng, shape, dtype, draw(st.sampled_from(FILLS)), zp)
    return q, zp, dict(kernel_shape=kernel, strides=strides, pads=pads, dilations=dilations)


@given(pool_case())
@settings(max_examples=40, deadline=None)
def test_max_pool_matches_its_twin(case):
    q, _, window = case
    got = max_pool_q(q, **window)
    assert got.dtype == q.dtype
    np.testing.assert_array_equal(got, max_pool_reference(q, **window))


@given(pool_case(), st.booleans())
@settings(max_examples=40, deadline=None)
def test_average_pool_matches_its_twin(case, count_include_pad):
    q, zp, window = case
    got = average_pool_q(q, zp, count_include_pad=count_include_pad, **window)
    assert got.dtype == q.dtype
    np.testing.assert_array_equal(got, average_pool_reference(q, zp, count_include_pad=count_include_pad, **window))


@given(pool_case(), st.floats(0.05, 3.0), st.data())
@settings(max_examples=30, deadline=None)
def test_average_pool_into_other_parameters_matches_its_twin(case, multiplier, data):
    q, zp, window = case
    out = dict(multiplier=multiplier, out_zero_point=data.draw(zero_points(np.int8)), qmin=-128, qmax=127)
    np.testing.assert_array_equal(average_pool_q(q, zp, count_include_pad=True, **window, **out),
                                  average_pool_reference(q, zp, count_include_pad=True, **window, **out))


@given(pool_case(), st.booleans())
@settings(max_examples=30, deadline=None)
def test_global_average_pool_is_the_whole_window(case, rescale):
    q, zp, _ = case
    out = dict(multiplier=0.7, out_zero_point=3, qmin=0, qmax=255) if rescale else {}
    got = global_average_pool_q(q, zp, **out)
    assert got.shape == q.shape[:2] + (1,) * (q.ndim - 2)
    np.testing.assert_array_equal(got, average_pool_reference(q, zp, list(q.shape[2:]), **out))


def test_max_pool_padding_never_wins():
    q = np.full((1, 1, 2, 2), -128, dtype=np.int8)
    assert np.all(max_pool_q(q, [3, 3], pads=[1, 1, 1, 1]) == -128)


def test_averages_round_half_to_even_exactly():
    numerators = np.array([1, 3, 5, -1, -3, -5, 7, 2**30 + 1])
    np.testing.assert_array_equal(divide_half_even(numerators, 2), [0, 2, 2, 0, -2, -2, 4, 2**29])
    q = np.array([[[[0, 1], [3, 4]]]], dtype=np.uint8)  # row averages 0.5 and 3.5, overall 2
    assert average_pool_q(q, 0, [1, 2]).ravel().tolist() == [0, 4]
    assert global_average_pool_q(q, 0).item() == 2
