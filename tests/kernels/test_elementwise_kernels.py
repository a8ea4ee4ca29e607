"""add_q / mul_q / concat_q against DequantizeLinear → op → QuantizeLinear and the requantize twin; relu_q, clip_q."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lpt.kernels import add_q, clip_q, concat_q, mul_q, relu_q
from lpt.kernels.reference import elementwise_reference, requantize_reference
from tests.kernels.cases import FILLS, RANGES, filled, zero_points

DTYPES = st.sampled_from([np.uint8, np.int8])
SCALES = st.floats(1e-3, 1.0).map(np.float32)


@st.composite
def argument(draw, shape):
    dtype = draw(DTYPES)
    zp = draw(zero_points(dtype))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return filled(rng, shape, dtype, draw(st.sampled_from(FILLS)), zp), draw(SCALES), zp


@given(st.sampled_from(["+", "*"]), st.data())
@settings(max_examples=60, deadline=None)
def test_add_and_mul_match_dequantize_op_quantize(op, data):
    """Broadcasting [2, 3, 4] with [3, 1] or [4], and every pairing of types and zero points."""
    q1, s1, z1 = data.draw(argument([2, 3, 4]))
    q2, s2, z2 = data.draw(argument(data.draw(st.sampled_from([[2, 3, 4], [3, 1], [4]]))))
    dst_dtype = data.draw(DTYPES)
    qmin, qmax = RANGES[dst_dtype]
    dst_scale, dst_zp = data.draw(SCALES), data.draw(zero_points(dst_dtype))
    kernel = add_q if op == "+" else mul_q
    got = kernel(q1, s1, z1, q2, s2, z2, dst_scale, dst_zp, qmin, qmax)
    assert got.dtype == dst_dtype
    np.testing.assert_array_equal(got, elementwise_reference(op, q1, s1, z1, q2, s2, z2, dst_scale, dst_zp, qmin, qmax))


@given(st.data())
@settings(max_examples=30, deadline=None)
def test_concat_requantizes_each_input_to_the_common_parameters(data):
    inputs = [data.draw(argument([1, data.draw(st.integers(1, 3)), 4])) for _ in range(data.draw(st.integers(1, 3)))]
    dst_dtype = data.draw(DTYPES)
    qmin, qmax = RANGES[dst_dtype]
    dst_scale, dst_zp = data.draw(SCALES), data.draw(zero_points(dst_dtype))
    got = concat_q([q for q, _, _ in inputs], [s for _, s, _ in inputs], [z for _, _, z in inputs],
                   dst_scale, dst_zp, qmin, qmax, axis=1)
    expected = np.concatenate([requantize_reference(q, z, s, dst_scale, dst_zp, qmin, qmax) for q, s, z in inputs],
                              axis=1)
    np.testing.assert_array_equal(got, expected)


def test_concat_with_equal_parameters_is_a_copy():
    a, b = np.arange(256, dtype=np.uint8).reshape(1, 1, 256), np.arange(255, -1, -1, dtype=np.uint8).reshape(1, 1, 256)
    np.testing.assert_array_equal(concat_q([a, b], [0.1, 0.1], [7, 7], 0.1, 7, 0, 255), np.concatenate([a, b], axis=1))


def test_relu_and_clip_on_integers():
    q = np.array([0, 100, 127, 128, 200, 255], dtype=np.uint8)
    np.testing.assert_array_equal(relu_q(q, 128), [128, 128, 128, 128, 200, 255])
    np.testing.assert_array_equal(clip_q(q, 100, 200), [100, 100, 127, 128, 200, 200])
    assert relu_q(q, 128).dtype == clip_q(q, 1, 2).dtype == np.uint8
