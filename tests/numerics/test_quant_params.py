"""QuantParams and the conversions between FQ intervals and integer quantization parameters."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lpt.errors import QuantizationError
from lpt.numerics import (
    dequantize_linear,
    interval_to_params,
    nudged_params,
    params_to_interval,
    quantize_linear,
    symmetric_params,
)
from lpt.numerics.levels import level_range


@pytest.mark.parametrize("levels, signed, expected", [
    (256, True, (-128, 127)), (256, False, (0, 255)), (255, True, (-127, 127)), (255, False, (0, 254)),
    (16, True, (-8, 7)), (65536, True, (-32768, 32767)), (2, False, (0, 1)),
])
def test_level_range(levels, signed, expected):
    assert level_range(levels, signed) == expected


def test_symmetric_weights_on_255_levels_are_narrow_range_with_zero_point_0():
    a = 0.731
    params = interval_to_params(-a, a, 255)
    assert (params.qmin, params.qmax, params.levels, params.dtype, params.axis) == (-127, 127, 255, np.int8, None)
    assert params.scale == np.float32(a / 127)
    assert params.zero_point == 0 and params.is_symmetric
    assert 0 < abs(params.shift) < 1e-6  # not exactly 0, because the scale was rounded to f32; integral all the same


def test_non_negative_interval_on_256_levels_is_unsigned_with_zero_point_0():
    params = interval_to_params(0.0, 6.0, 256)
    assert (params.qmin, params.qmax, params.dtype) == (0, 255, np.uint8)
    assert params.scale == np.float32(6.0 / 255) and params.zero_point == 0 and params.is_symmetric


def test_asymmetric_interval_with_an_integral_zero_point():
    """[-1, 255/64 − 1]: scale 1/64 and −low/scale = 64 exactly."""
    high = 255 / 64 - 1
    signed = interval_to_params(-1.0, high, 256)
    assert (signed.qmin, signed.scale, signed.shift, signed.zero_point) == (-128, 1 / 64, -64.0, -64)
    unsigned = interval_to_params(-1.0, high, 256, signed=False)
    assert (unsigned.qmin, unsigned.zero_point, unsigned.dtype) == (0, 64, np.uint8)
    assert signed.has_integral_zero_point and unsigned.has_integral_zero_point
    assert not signed.is_symmetric
    low, back_high = params_to_interval(signed)
    assert (low, back_high) == (-1.0, high)


def test_asymmetric_interval_with_a_fractional_shift():
    """[-1, 3] on [0, 255]: scale 4/255, shift 0 − (−1)/(4/255) = 63.75: no integer zero point."""
    params = interval_to_params(-1.0, 3.0, 256, signed=False)
    assert params.shift == pytest.approx(63.75, abs=1e-5)
    assert params.zero_point == 64 and not params.has_integral_zero_point
    low, high = params_to_interval(params)  # the interval the rounded zero point represents
    assert low == pytest.approx(-64 * 4 / 255, rel=1e-7) and high == pytest.approx(191 * 4 / 255, rel=1e-7)


def test_a_shift_counts_as_integral_within_16_f32_ulps_of_low_over_scale():
    """[-1.28, 1.27] on [-128, 127]: low/scale = 128, and the tolerance there is 128 · 2⁻²⁰ ≈ 1.2e-4."""
    scale = np.float32(0.01)
    for offset, integral in ((1e-4, True), (2e-4, False)):
        low = (-128 - offset) * float(scale)
        params = interval_to_params(low, low + 255 * float(scale), 256)
        assert params.zero_point == 0 and params.has_integral_zero_point is integral


@settings(max_examples=100, deadline=None)
@given(st.floats(-100, 100), st.floats(1e-3, 100), st.sampled_from([16, 255, 256, 65536]), st.booleans())
def test_params_to_interval_inverts_interval_to_params_when_the_zero_point_is_integral(low, width, levels, signed):
    """Intervals built from (scale, zero point) come back to within the f32 rounding of the scale."""
    qmin, qmax = level_range(levels, signed)
    scale = np.float32(width / (qmax - qmin))
    zero_point = int(np.clip(round(-low / float(scale)) + qmin, qmin, qmax))
    interval = ((qmin - zero_point) * float(scale), (qmax - zero_point) * float(scale))
    params = interval_to_params(*interval, levels, signed=signed)
    assert params.has_integral_zero_point and params.zero_point == zero_point
    np.testing.assert_allclose(params_to_interval(params), interval, rtol=2.0**-23, atol=0)


def test_per_channel_params_and_signedness_from_any_channel():
    params = interval_to_params([[-1.0], [0.0], [-1.0]], [[255 / 64 - 1], [1.0], [3.0]], 256, axis=0)
    assert params.axis == 0 and params.qmin == -128  # one negative channel makes the tensor signed
    np.testing.assert_array_equal(params.scale, np.float32([1 / 64, 1 / 255, 4 / 255]))
    np.testing.assert_allclose(params.shift, [-64, -128, -64.25], atol=1e-5)
    np.testing.assert_array_equal(params.zero_point, [-64, -128, -64])
    assert params.has_integral_zero_point is False  # channel 2
    assert interval_to_params([-1.0, 0.0], [255 / 64 - 1, 1.0], 256, axis=0).has_integral_zero_point


@pytest.mark.parametrize("low, high, message", [
    (0.5, 0.5, r"zero-width range \[0.5, 0.5\]: cannot compute a scale"),
    (1.0, -1.0, r"inverted range \[1, -1\]: cannot compute a scale"),
    (np.nan, 1.0, r"non-finite range \[nan, 1\]: cannot compute a scale"),
    ([0.0, 0.0, 3.0], [1.0, 2.0, 3.0], r"zero-width range \[3, 3\] at channel 2: cannot compute a scale"),
])
def test_intervals_without_a_scale_raise_with_their_values(low, high, message):
    with pytest.raises(QuantizationError, match=message):
        interval_to_params(low, high, 256, axis=None if np.ndim(low) == 0 else 1)


def test_a_range_too_narrow_for_an_f32_scale_raises():
    with pytest.raises(QuantizationError, match=r"range \[0, 1e-300\] gives a scale outside float32"):
        interval_to_params(0.0, 1e-300, 256)


def test_per_tensor_params_need_one_value():
    with pytest.raises(QuantizationError, match="pass axis"):
        interval_to_params([0.0, 1.0], [1.0, 2.0], 256)


@pytest.mark.parametrize("levels, signed, qmin, scale", [
    (255, True, -127, 0.5 / 127), (256, True, -128, 0.5 / 127), (256, False, 0, 0.5 / 255),
])
def test_symmetric_params(levels, signed, qmin, scale):
    params = symmetric_params(0.5, levels, signed=signed)
    assert (params.qmin, params.scale, params.zero_point, params.shift) == (qmin, np.float32(scale), 0, 0.0)
    assert params.is_symmetric
    assert params_to_interval(params)[1] == pytest.approx(0.5, rel=1e-7)


def test_symmetric_params_per_channel_and_errors():
    params = symmetric_params([0.5, 1.0, 2.0], 255, axis=0)
    np.testing.assert_array_equal(params.scale, np.float32([0.5, 1.0, 2.0]) / np.float32(127))
    with pytest.raises(QuantizationError, match="absmax 0 at channel 1 is not positive"):
        symmetric_params([0.5, 0.0], 255, axis=0)
    with pytest.raises(QuantizationError, match="no positive level"):
        symmetric_params(1.0, 2)


@pytest.mark.parametrize("low, high, qmin, qmax, scale, zero_point", [
    (-1.0, 3.0, 0, 255, 4 / 255, 64),  # zero point from min: 63.75, rounded
    (0.5, 2.0, 0, 255, 2 / 255, 0),  # extended down to 0.0
    (-3.0, -1.0, 0, 255, 3 / 255, 255),  # extended up to 0.0
    (-0.5, 254.5, 0, 255, 1.0, 1),  # 0.5: half away from zero, as std::round (half to even would give 0)
    (-1.5, 253.5, -128, 127, 1.0, -127),  # −126.5 → −127 (half to even: −126)
    (-1.0, 3.0, -128, 127, 4 / 255, -64),  # −64.25
    # In float64 the candidates straddle the tie: from min 89.49999999999997, from max 89.5; TFLite
    # takes the one with the smaller error estimate (127 + 37.5 < 128 + 217.5), from max → 90.
    (-478.5, 82.5, -128, 127, 561 / 255, 90),
])
def test_nudged_params_follow_tflite(low, high, qmin, qmax, scale, zero_point):
    params = nudged_params(low, high, qmin, qmax)
    assert (params.scale, params.zero_point, params.shift) == (np.float32(scale), zero_point, zero_point)
    assert params.has_integral_zero_point


@pytest.mark.parametrize("low, high, message", [
    (0.0, 0.0, r"zero-width range \[0, 0\]"),
    (2.0, 1.0, r"inverted range \[2, 1\]: min is above max"),
])
def test_nudged_params_reject_empty_and_inverted_ranges(low, high, message):
    with pytest.raises(QuantizationError, match=message):
        nudged_params(low, high, 0, 255)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e4, 1e4), st.floats(-1e4, 1e4)), min_size=1, max_size=4),
       st.sampled_from([(0, 255), (-128, 127), (-127, 127), (0, 15)]))
def test_nudged_params_make_zero_exactly_representable(ranges, integer_range):
    low, high = np.array([min(r) for r in ranges]), np.array([max(r) for r in ranges])
    assume(np.all(np.maximum(high, 0) - np.minimum(low, 0) > 1e-30))  # a scale f32 can hold
    qmin, qmax = integer_range
    params = nudged_params(low, high, qmin, qmax, axis=0)
    zeros = np.zeros(len(ranges), np.float32)
    q = quantize_linear(zeros, params.scale, params.zero_point.astype(params.dtype), axis=0)
    np.testing.assert_array_equal(q, params.zero_point)
    np.testing.assert_array_equal(dequantize_linear(q, params.scale, params.zero_point, axis=0), zeros)
    assert np.all((qmin <= params.zero_point) & (params.zero_point <= qmax))


def test_quant_params_are_frozen_all_the_way_down():
    params = interval_to_params(-1.0, 1.0, 256)
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.qmin = 0
    with pytest.raises(ValueError, match="read-only"):
        params.scale[...] = 2.0
    assert (params.scale.dtype, params.zero_point.dtype, params.shift.dtype) == (np.float32, np.int32, np.float64)


@pytest.mark.parametrize("qmin, qmax", [(0, 0), (5, 3), (-1, 40000), (0, 70000)])
def test_integer_ranges_must_be_non_empty_and_fit_16_bits(qmin, qmax):
    with pytest.raises(QuantizationError, match=rf"integer range \[{qmin}, {qmax}\]"):
        nudged_params(-1.0, 1.0, qmin, qmax)


def test_sixteen_bit_ranges_use_sixteen_bit_types():
    assert interval_to_params(-1.0, 1.0, 65536).dtype == np.int16
    assert interval_to_params(0.0, 1.0, 65536).dtype == np.uint16
    assert interval_to_params(0.0, 1.0, 16).dtype == np.uint8
