"""quantize / dequantize / requantize (f32 and integer-only) / quantize_fq against lpt.numerics and the twins."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpt.kernels import (dequantize, fq_input_affine, qlinear_output, quantize, quantize_fq, quantize_multiplier,
                         requantize, requantize_fixed_point)
from lpt.kernels.reference import requantize_fixed_point_reference, requantize_reference
from lpt.numerics import dequantize_linear, fake_quantize, quantize_linear
from tests.kernels.cases import RANGES, zero_points

DTYPES = st.sampled_from([np.uint8, np.int8])
SCALES = st.floats(1e-3, 10.0).map(np.float32)


@st.composite
def float_inputs(draw, scale, zero_point, qmin, qmax):
    """Random values, exact ties (k + 0.5)·scale, out-of-range values, ±inf and NaN."""
    reach = float(scale) * (qmax - qmin + 8)
    values = draw(st.lists(st.floats(-reach, reach), min_size=1, max_size=30))
    ties = [(k + 0.5) * float(scale) for k in draw(st.lists(st.integers(qmin - zero_point - 3, qmax - zero_point + 3),
                                                            max_size=20))]
    return np.array(values + ties + [np.inf, -np.inf, np.nan], dtype=np.float32)


@given(data=st.data(), dtype=DTYPES, scale=SCALES)
@settings(max_examples=60, deadline=None)
def test_quantize_agrees_with_quantize_linear_and_narrows(data, dtype, scale):
    qmin, qmax = RANGES[dtype]
    zp = data.draw(zero_points(dtype))
    x = data.draw(float_inputs(scale, zp, qmin, qmax))
    full = quantize_linear(x, scale, np.array(zp, dtype))
    np.testing.assert_array_equal(quantize(x, scale, zp, qmin, qmax), full)
    low, high = (-127, 127) if dtype == np.int8 else (0, 254)  # levels 255
    narrow_zp = min(max(zp, low), high)
    np.testing.assert_array_equal(quantize(x, scale, narrow_zp, low, high),
                                  np.clip(quantize_linear(x, scale, np.array(narrow_zp, dtype)), low, high))


def test_quantize_per_channel_along_an_axis():
    x = np.linspace(-3, 3, 2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    scale, zp = np.array([0.01, 0.02, 0.05], np.float32), np.array([-10, 0, 10])
    np.testing.assert_array_equal(quantize(x, scale, zp, -127, 127, axis=1),
                                  np.clip(quantize_linear(x, scale, zp.astype(np.int8), axis=1), -127, 127))
    np.testing.assert_array_equal(dequantize(quantize(x, scale, zp, -128, 127, axis=1), scale, zp, axis=1),
                                  dequantize_linear(quantize_linear(x, scale, zp.astype(np.int8), axis=1),
                                                    scale, zp.astype(np.int8), axis=1))


@given(dtype=DTYPES, scale=SCALES, data=st.data())
@settings(max_examples=30, deadline=None)
def test_dequantize_agrees_with_dequantize_linear(dtype, scale, data):
    qmin, qmax = RANGES[dtype]
    zp = data.draw(zero_points(dtype))
    q = np.arange(qmin, qmax + 1).astype(dtype)
    np.testing.assert_array_equal(dequantize(q, scale, zp), dequantize_linear(q, scale, np.array(zp, dtype)))


@given(in_dtype=DTYPES, out_dtype=DTYPES, scale=SCALES, data=st.data())
@settings(max_examples=40, deadline=None)
def test_requantize_matches_its_twin(in_dtype, out_dtype, scale, data):
    """Every input level; ratios of 1/2 and 3/2 put exact ties on the grid, where half-to-even shows."""
    qmin, qmax = RANGES[in_dtype]
    out_min, out_max = RANGES[out_dtype]
    ratio = data.draw(st.one_of(st.sampled_from([0.5, 1.5, 1.0, 0.25]), st.floats(0.01, 4.0)))
    out_scale = np.float32(scale / np.float32(ratio))
    zp, out_zp = data.draw(zero_points(in_dtype)), data.draw(zero_points(out_dtype))
    q = np.arange(qmin, qmax + 1).astype(in_dtype)
    got = requantize(q, zp, scale, out_scale, out_zp, out_min, out_max)
    assert got.dtype == out_dtype
    np.testing.assert_array_equal(got, requantize_reference(q, zp, scale, out_scale, out_zp, out_min, out_max))


@st.composite
def fake_quantize_case(draw):
    levels = draw(st.sampled_from([256, 255, 16]))
    low = draw(st.floats(-10, 10, width=32))
    width = draw(st.floats(0.015625, 20, width=32))
    high = np.float32(low + width)
    step = (float(high) - low) / (levels - 1)
    values = draw(st.lists(st.floats(low - 2 * width, low + 2 * width), max_size=30))
    ties = [low + (k + 0.5) * step for k in draw(st.lists(st.integers(-2, levels + 1), max_size=15))]
    return np.array(values + ties + [low, high], dtype=np.float32), np.float32(low), high, levels


@given(fake_quantize_case(), st.sampled_from(["unsigned", "signed"]))
@settings(max_examples=60, deadline=None)
def test_quantize_fq_gives_the_levels_of_fake_quantize(case, signedness):
    """FakeQuantize onto [0, levels − 1] is the level index itself: quantize_fq must give it, shifted to qmin."""
    x, low, high, levels = case
    qmin = -(levels // 2) if signedness == "signed" else 0
    got = quantize_fq(x, *fq_input_affine(low, high, levels), qmin, qmin + levels - 1)
    expected = fake_quantize(x, low, high, 0, levels - 1, levels)
    np.testing.assert_array_equal(got.astype(np.int64), expected.astype(np.int64) + qmin)


def test_quantize_fq_sends_nan_to_the_first_level():
    assert quantize_fq(np.float32(np.nan), *fq_input_affine(-1, 1, 256), -128, 127) == -128


@given(st.floats(2.0**-30, 2.0**20))
@settings(max_examples=60, deadline=None)
def test_quantize_multiplier_is_a_rounded_q31_mantissa(real):
    multiplier, shift = quantize_multiplier(real)
    assert 2**30 <= multiplier < 2**31
    error = Fraction(int(multiplier)) * Fraction(2) ** (int(shift) - 31) - Fraction(real)
    assert abs(error) <= Fraction(2) ** (int(shift) - 32)  # half a unit of the Q31 mantissa


@st.composite
def fixed_point_case(draw):
    real = draw(st.one_of(st.floats(2.0**-24, 1.0), st.floats(1.0, 64.0)))
    multiplier, shift = quantize_multiplier(real)
    limit = 2**31 // 2 ** max(int(shift), 0) - 1  # acc · 2^shift stays in int32
    acc = draw(st.lists(st.integers(-limit, limit), min_size=1, max_size=30))
    ties = [(2 * k + 1) * 2 ** max(-int(shift) - 1, 0) for k in draw(st.lists(st.integers(-300, 300), max_size=10))]
    out_dtype = draw(DTYPES)
    zp = draw(zero_points(out_dtype))
    return np.array(acc + [t for t in ties if abs(t) <= limit], dtype=np.int32), real, multiplier, shift, zp, out_dtype


@given(fixed_point_case())
@settings(max_examples=60, deadline=None)
def test_fixed_point_requantize_matches_its_twin_and_the_f32_mode_within_one(case):
    acc, real, multiplier, shift, zp, out_dtype = case
    qmin, qmax = RANGES[out_dtype]
    got = requantize_fixed_point(acc, multiplier, shift, zp, qmin, qmax)
    expected = requantize_fixed_point_reference(acc, int(multiplier), int(shift), zp, qmin, qmax)
    np.testing.assert_array_equal(got, expected)
    f32_mode = qlinear_output(acc, np.float32(real), zp, qmin, qmax)
    assert np.abs(got.astype(np.int64) - f32_mode.astype(np.int64)).max() <= 1


@pytest.mark.parametrize("acc, real, expected", [
    (1, 0.5, 1), (-1, 0.5, 0), (3, 0.5, 2), (-3, 0.5, -1),  # the high multiply: ties toward +inf
    (2, 0.25, 1), (-2, 0.25, -1), (6, 0.25, 2), (-6, 0.25, -2),  # the rounding shift: ties away from zero
])
def test_the_fixed_point_rounding_modes(acc, real, expected):
    """real 0.5 is (2^30, shift 0): only the high multiply rounds; 0.25 is (2^30, −1): it is exact, the shift rounds."""
    multiplier, shift = quantize_multiplier(real)
    assert requantize_fixed_point(np.array([acc]), multiplier, shift, 0, -128, 127)[0] == expected


def test_fixed_point_refuses_to_overflow_the_left_shift():
    multiplier, shift = quantize_multiplier(4.0)
    with pytest.raises(ValueError, match="overflows int32"):
        requantize_fixed_point(np.array([2**30]), multiplier, shift, 0, -128, 127)
