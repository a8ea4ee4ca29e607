"""output_stage against its twin; qlinear_output against onnxruntime's QLinearConv and QLinearMatMul."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lpt.kernels import (Clip, FakeQuantize, Gelu, HardSwish, LeakyRelu, Relu, Sigmoid, Sum, conv_accumulate, dequantization_multiplier,
                         matmul_accumulate, output_stage, pack_conv, qlinear_multiplier, qlinear_output)
from lpt.kernels.reference import output_stage_reference
from tests.kernels.cases import RANGES, zero_points
from tests.kernels.ort_models import run_node
from tests.kernels.test_conv_accumulate import conv_case, halved

SCALES = st.floats(1e-4, 0.1)


@st.composite
def post_op_chain(draw, shape, axis):
    """Up to four post-ops in any order; Sum adds a full tensor, FakeQuantize has per-channel limits."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    channel_shape = [1] * len(shape)
    channel_shape[axis] = shape[axis]
    low = rng.uniform(-2, 0, channel_shape).astype(np.float32)
    choices = {
        "relu": Relu(),
        "clip": Clip(draw(st.floats(-3, 0)), draw(st.floats(0, 3))),
        "leaky_relu": LeakyRelu(draw(st.sampled_from([0.01, 0.2, 0.3]))),
        "sigmoid": Sigmoid(),
        "hard_swish": HardSwish(draw(st.sampled_from([0.2, float(np.float32(1 / 6))])), draw(st.sampled_from([0.5, 0.0]))),
        "gelu": Gelu(1.4142135, 1.0, 0.5),
        "sum": Sum(rng.normal(0, 2, shape).astype(np.float32)),
        "fq": FakeQuantize(low, low + rng.uniform(0.5, 4, channel_shape).astype(np.float32),
                           np.float32(-1), np.float32(2), draw(st.sampled_from([256, 255]))),
    }
    return tuple(choices[name] for name in draw(st.lists(st.sampled_from(sorted(choices)), max_size=4)))


@st.composite
def output_case(draw):
    layout = draw(st.sampled_from(["conv", "matmul"]))
    shape, axis = ([2, 3, 4, 5], 1) if layout == "conv" else ([2, 6, 4], -1)
    channels = shape[axis]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    magnitude = draw(st.sampled_from([2**8, 2**20, 2**26]))  # past 2^24, f32(acc) rounds
    acc = rng.integers(-magnitude, magnitude, shape).astype(np.int32)
    weight_scale = rng.uniform(1e-4, 1e-1, draw(st.sampled_from([1, channels]))).astype(np.float32)
    multiplier = dequantization_multiplier(np.float32(draw(SCALES)), weight_scale)
    bias = draw(st.one_of(st.none(), st.just(rng.normal(0, 1, channels).astype(np.float32))))
    post_ops = draw(post_op_chain(shape, axis))
    dst = draw(st.sampled_from(["f32", "uint8", "int8", "narrow"]))
    if dst == "f32":
        destination = {}
    else:
        qmin, qmax = {"uint8": (0, 255), "int8": (-128, 127), "narrow": (-127, 127)}[dst]
        dst_zp = draw(st.integers(qmin, qmax))
        dst_scale = np.float32(draw(st.floats(1e-3, 0.2)))
        destination = dict(dst_scale=dst_scale, dst_zero_point=dst_zp, qmin=qmin, qmax=qmax)
    return acc, multiplier, bias, post_ops, destination, axis


@given(output_case())
@settings(max_examples=60, deadline=None)
def test_output_stage_matches_its_twin(case):
    acc, multiplier, bias, post_ops, destination, axis = case
    got = output_stage(acc, multiplier, bias, post_ops, axis=axis, **destination)
    expected = output_stage_reference(acc, multiplier, bias, post_ops, axis=axis, **destination)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_the_multiplier_is_applied_before_the_bias():
    """(f32(acc)·m) + b, two roundings: 16777217 is not an f32, so acc = 2^24 + 1 shows the conversion too."""
    acc = np.array([[2**24 + 1]], dtype=np.int32)
    got = output_stage(acc, np.float32(0.1), np.float32(0.3), axis=1)
    assert got[0, 0] == np.float32(np.float32(2**24) * np.float32(0.1)) + np.float32(0.3)


@given(data=st.data())
@settings(max_examples=20, deadline=None)
def test_qlinear_output_matches_onnxruntime_qlinear_conv(data):
    """conv_accumulate + qlinear_output against QLinearConv, with per-channel weight scales and an int32 bias."""
    src, weights, src_zp, _, attributes = data.draw(conv_case())
    if src.dtype == np.int8 and weights.dtype == np.uint8:  # onnxruntime has no s8 × u8 QLinearConv
        weights = (weights.astype(np.int16) - 128).astype(np.int8)
    src, src_zp = halved(src, src_zp)  # see test_conv_accumulate: no int16 saturation on any CPU
    weights = (weights // 2).astype(np.int8) if weights.dtype == np.int8 else weights
    weight_zp = 0 if weights.dtype == np.int8 else data.draw(zero_points(np.uint8))
    out_channels = weights.shape[0]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x_scale, y_scale = np.float32(data.draw(SCALES)), np.float32(data.draw(st.floats(1e-3, 0.5)))
    w_scale = rng.uniform(1e-3, 0.1, out_channels).astype(np.float32)
    bias = rng.integers(-5000, 5000, out_channels).astype(np.int32)
    y_dtype = src.dtype.type  # onnxruntime implements QLinearConv for y of x's type only
    y_zp = data.draw(zero_points(y_dtype))
    inputs = {"x": src, "x_scale": np.array(x_scale), "x_zero_point": np.array(src_zp, src.dtype), "w": weights,
              "w_scale": w_scale, "w_zero_point": np.full(out_channels, weight_zp, weights.dtype),
              "y_scale": np.array(y_scale), "y_zero_point": np.array(y_zp, y_dtype), "B": bias}
    groups = attributes.pop("groups")
    expected = run_node("QLinearConv", inputs, y_dtype, {**attributes, "group": groups}, opset=10)
    acc = conv_accumulate(src, pack_conv(weights, weight_zp, src_zp, groups, **attributes))
    got = qlinear_output(acc, qlinear_multiplier(x_scale, w_scale, y_scale), y_zp, *RANGES[y_dtype], bias=bias)
    np.testing.assert_array_equal(got, expected)


@given(data=st.data())
@settings(max_examples=20, deadline=None)
def test_qlinear_output_matches_onnxruntime_qlinear_matmul(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    a_dtype, b_dtype = data.draw(st.sampled_from([(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)]))
    y_dtype = a_dtype  # onnxruntime implements QLinearMatMul for y of a's type only
    m, k, n = (data.draw(st.integers(1, 40)) for _ in range(3))
    a = rng.integers(*RANGES[a_dtype], (2, m, k), endpoint=True).astype(a_dtype)
    b = rng.integers(*RANGES[b_dtype], (k, n), endpoint=True).astype(b_dtype)
    a, a_zp = halved(a, data.draw(zero_points(a_dtype)))
    b, b_zp = halved(b, data.draw(zero_points(b_dtype)))
    scales = [np.array(data.draw(SCALES), np.float32) for _ in range(3)]
    y_zp = data.draw(zero_points(y_dtype))
    inputs = {"a": a, "a_scale": scales[0], "a_zero_point": np.array(a_zp, a_dtype), "b": b, "b_scale": scales[1],
              "b_zero_point": np.array(b_zp, b_dtype), "y_scale": scales[2], "y_zero_point": np.array(y_zp, y_dtype)}
    expected = run_node("QLinearMatMul", inputs, y_dtype, opset=10)
    acc = matmul_accumulate(a, a_zp, b, b_zp)
    np.testing.assert_array_equal(qlinear_output(acc, qlinear_multiplier(*scales), y_zp, *RANGES[y_dtype], axis=-1),
                                  expected)
