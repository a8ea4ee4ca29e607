"""Properties of quantize_linear / dequantize_linear / dynamic_quantize_linear against the plain float64 formulas."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpt.errors import QuantizationError
from lpt.numerics import dequantize_linear, dynamic_quantize_linear, fake_quantize_levels, quantize_linear

RANGES = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
          "uint4": (0, 15), "int4": (-8, 7)}
CONTAINERS = {"uint8": np.uint8, "int8": np.int8, "uint16": np.uint16, "int16": np.int16,
              "uint4": np.uint8, "int4": np.int8}


@st.composite
def quantize_case(draw):
    """x (random, exact .5 ties of x/scale, out of range), scale, zero point, output type."""
    name = draw(st.sampled_from(sorted(RANGES)))
    qmin, qmax = RANGES[name]
    scale = np.float32(draw(st.floats(1e-4, 10.0)))
    zero_point = draw(st.integers(qmin, qmax))
    reach = (qmax - qmin + 10) * float(scale)
    random_x = draw(st.lists(st.floats(-reach, reach), min_size=1, max_size=40))
    ties = [(k + 0.5) * float(scale) for k in draw(st.lists(st.integers(qmin - zero_point - 2, qmax - zero_point + 2),
                                                            max_size=20))]
    return np.array(random_x + ties, dtype=np.float32), scale, zero_point, name


@settings(max_examples=150, deadline=None)
@given(quantize_case())
def test_quantize_is_the_float64_formula_except_where_the_f32_quotient_rounds_onto_or_across_a_tie(case):
    x, scale, zero_point, name = case
    qmin, qmax = RANGES[name]
    q = quantize_linear(x, scale, zero_point, output_dtype=name)
    assert q.dtype == CONTAINERS[name]

    exact = x.astype(np.float64) / np.float64(scale)
    reference = np.clip(np.rint(exact) + zero_point, qmin, qmax)
    difference = q.astype(np.int64) - reference
    # x / scale rounded to f32 moves by at most half an f32 ulp of the quotient; only a quotient
    # that close to a .5 tie can round to the other integer (float64's own rounding: the 2⁻²⁰).
    half_ulp = 0.5 * np.spacing(np.abs(exact.astype(np.float32))).astype(np.float64) * (1 + 2.0**-20)
    near_tie = np.abs(exact - np.floor(exact) - 0.5) <= half_ulp
    assert np.all(np.abs(difference) <= 1)
    assert np.all(near_tie[difference != 0])


@settings(max_examples=100, deadline=None)
@given(quantize_case())
def test_dequantize_of_quantize_is_within_half_a_step_for_in_range_x(case):
    x, scale, zero_point, name = case
    qmin, qmax = RANGES[name]
    x = x[(x >= (qmin - zero_point) * scale) & (x <= (qmax - zero_point) * scale)]
    y = dequantize_linear(quantize_linear(x, scale, zero_point, output_dtype=name), scale, zero_point)
    x64, s = x.astype(np.float64), float(scale)
    # Half a step, plus the f32 roundings of the quotient (≤ ½ ulp of x/scale) and of the product.
    bound = s / 2 + s * np.spacing(np.float32(np.abs(x64 / s))) + np.spacing(np.abs(x))
    assert np.all(np.abs(y - x64) <= bound)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(sorted(RANGES)), st.data())
def test_dequantize_is_one_f32_rounding_of_the_exact_product(name, data):
    qmin, qmax = RANGES[name]
    q = np.array(data.draw(st.lists(st.integers(qmin, qmax), min_size=1, max_size=30)), dtype=np.int32)
    scale = np.float32(data.draw(st.floats(1e-6, 1e3)))
    zero_point = data.draw(st.integers(qmin, qmax))
    exact = (q - zero_point).astype(np.float64) * np.float64(scale)  # exact: < 2¹⁷ times a 24-bit number
    np.testing.assert_array_equal(dequantize_linear(q, scale, zero_point), exact.astype(np.float32))


@pytest.mark.parametrize("name", sorted(RANGES))
def test_saturates_at_the_type_limits_and_nan_gives_qmin(name):
    qmin, qmax = RANGES[name]
    x = np.array([1e6, -1e6, 3e38, -3e38, np.inf, -np.inf, np.nan], np.float32)
    zero_point = (qmin + qmax) // 2
    np.testing.assert_array_equal(quantize_linear(x, 0.1, zero_point, output_dtype=name),
                                  [qmax, qmin, qmax, qmin, qmax, qmin, qmin])


def test_exact_ties_round_half_to_even_and_signed_zero_gives_the_zero_point():
    scale = np.float32(2**-7)
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.0, -0.0], np.float32) * scale
    np.testing.assert_array_equal(quantize_linear(x, scale, np.int8(0)), [0, 2, 2, 0, -2, -2, 0, 0])
    np.testing.assert_array_equal(quantize_linear(x, scale, np.uint8(100)), [100, 102, 102, 100, 98, 98, 100, 100])


def test_divides_by_the_scale_rather_than_multiplying_by_its_reciprocal():
    """f32(0.0175) / f32(0.001) = 17.5, a tie that rounds to 18; f32(0.0175) · f32(1/0.001) = 17.499998 → 17."""
    x, scale = np.float32(0.0175), np.float32(0.001)
    assert (x / scale, x * (np.float32(1) / scale)) == (np.float32(17.5), np.float32(17.499998))
    assert quantize_linear(x, scale, np.int8(0)) == 18


def test_default_output_is_uint8_and_the_zero_point_dtype_decides_otherwise():
    x = np.array([-1.0, 1.0], np.float32)
    assert quantize_linear(x, 0.5).dtype == np.uint8
    np.testing.assert_array_equal(quantize_linear(x, 0.5), [0, 2])
    assert quantize_linear(x, 0.5, np.int16(3)).dtype == np.int16
    assert quantize_linear(x, 0.5, output_dtype=np.int8).dtype == np.int8


def test_int4_values_come_in_an_int8_array_clamped_to_4_bits():
    q = quantize_linear(np.array([-100, -8.4, 0, 7.4, 100], np.float32), 1.0, output_dtype="int4")
    assert q.dtype == np.int8
    np.testing.assert_array_equal(q, [-8, -8, 0, 7, 7])


def test_per_axis_equals_a_loop_over_the_axis_and_negative_axes_count_from_the_end():
    rng = np.random.default_rng(3)
    x = rng.normal(0, 2, (3, 4, 5)).astype(np.float32)
    scale = np.array([0.01, 0.1, 1 / 3, 2**-7], np.float32)
    zero_point = np.array([0, 3, -5, 127], np.int8)
    q = quantize_linear(x, scale, zero_point, axis=1)
    looped = np.stack([quantize_linear(x[:, c], scale[c], zero_point[c]) for c in range(4)], axis=1)
    np.testing.assert_array_equal(q, looped)
    np.testing.assert_array_equal(quantize_linear(x, scale, zero_point, axis=-2), q)
    deq = dequantize_linear(q, scale, zero_point, axis=-2)
    np.testing.assert_array_equal(deq, np.stack([dequantize_linear(q[:, c], scale[c], zero_point[c])
                                                 for c in range(4)], axis=1))


def test_blocked_parameters_repeat_block_size_times_along_the_axis_and_the_last_block_may_be_short():
    rng = np.random.default_rng(4)
    x = rng.normal(0, 2, (2, 7)).astype(np.float32)
    scale = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]], np.float32)  # blocks of 3 along axis 1: 3 + 3 + 1
    zero_point = np.array([[1, 2, 3], [4, 5, 6]], np.uint8)
    per_element = np.repeat(scale, 3, axis=1)[:, :7], np.repeat(zero_point, 3, axis=1)[:, :7]
    q = quantize_linear(x, scale, zero_point, axis=1, block_size=3)
    np.testing.assert_array_equal(q, [[quantize_linear(x[i, j], per_element[0][i, j], per_element[1][i, j])
                                       for j in range(7)] for i in range(2)])
    np.testing.assert_array_equal(dequantize_linear(q, scale, zero_point, axis=1, block_size=3),
                                  dequantize_linear(q, per_element[0], per_element[1], axis=1, block_size=1))


@pytest.mark.parametrize("call, message", [
    (lambda: quantize_linear(np.ones(3), 0.1, output_dtype="float8_e4m3fn"), "integer types only"),
    (lambda: quantize_linear(np.ones(3), 0.0), "finite and non-zero"),
    (lambda: quantize_linear(np.ones(3), np.nan), "finite and non-zero"),
    (lambda: quantize_linear(np.ones(3), 0.1, np.int16(200), output_dtype="int4"), "outside the output range"),
    (lambda: quantize_linear(np.ones((2, 3)), [0.1, 0.2], axis=1), "does not fit axis 1"),
    (lambda: quantize_linear(np.ones((2, 3)), [0.1, 0.2], axis=2), "axis 2 is out of range"),
    (lambda: quantize_linear(np.ones((2, 4)), np.ones((2, 3)), axis=1, block_size=2), "block_size 2"),
    (lambda: dequantize_linear(np.ones(3, np.float32), 0.1), "integer input"),
])
def test_invalid_parameters_raise_quantization_error(call, message):
    with pytest.raises(QuantizationError, match=message):
        call()


def test_dynamic_quantize_linear_makes_zero_exact_and_spans_the_range():
    x = np.array([-3.0, -0.5, 0.0, 0.7, 2.0], np.float32)
    y, scale, zero_point = dynamic_quantize_linear(x)
    assert (y.dtype, scale.dtype, zero_point.dtype, scale.shape) == (np.uint8, np.float32, np.uint8, ())
    assert scale == np.float32(5.0) / np.float32(255)
    assert zero_point == np.rint(np.float32(3.0) / scale) == 153
    assert y[2] == zero_point and (y[0], y[-1]) == (0, 255)


@pytest.mark.parametrize("x, scale, zero_point", [
    ([0.0, 0.0], 1.0, 0),  # onnxruntime's choice for an all-zero input (ONNX's reference picks 1/255)
    ([1.0, 2.0], 2.0 / 255, 0),  # the range is extended to hold 0.0
    ([-1.0, -2.0], 2.0 / 255, 255),
    ([np.nan, 1.0], 1.0 / 255, 0),  # NaN is left out of min and max
])
def test_dynamic_quantize_linear_edge_ranges(x, scale, zero_point):
    _, got_scale, got_zero_point = dynamic_quantize_linear(np.array(x, np.float32))
    assert (got_scale, got_zero_point) == (np.float32(scale), zero_point)


def test_fake_quantize_and_quantize_linear_differ_at_exact_ties_when_the_zero_point_is_odd():
    """FQ rounds x·isc + ish = (k + ½) + zp as a whole; QuantizeLinear rounds k + ½ and then adds zp.

    With an odd zp the half-to-even choice lands on different integers (DESIGN.md §2); with an even zp they agree.
    """
    scale = 2.0**-7  # binary: every quantity below is exact in f32
    ties = ((np.arange(-4, 4) + 0.5) * scale).astype(np.float32)
    for zero_point, agree in ((1, False), (2, True)):
        low, high = -zero_point * scale, (255 - zero_point) * scale  # the u8 interval of (scale, zero_point)
        fq_levels = fake_quantize_levels(ties, low, high, 256)
        ql = quantize_linear(ties, scale, np.uint8(zero_point))
        assert np.array_equal(fq_levels, ql) is agree
        assert np.all(np.abs(fq_levels - ql) <= 1)
