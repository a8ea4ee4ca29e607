"""quantize_linear / dequantize_linear / dynamic_quantize_linear against onnxruntime, bit for bit."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from lpt.numerics import dequantize_linear, dynamic_quantize_linear, quantize_linear
from lpt.numerics.quantize_linear import INTEGER_TYPES

IR_VERSION = {11: 6, 13: 7, 19: 9, 21: 10}  # an IR version each opset was released with
SCALES = [0.1, 1 / 3, 2**-7, 1e-3, 0.0123]
TYPES = {  # name: (numpy dtype of the ONNX tensor, zero point used)
    "uint8": (np.uint8, 128), "int8": (np.int8, -3), "uint16": (np.uint16, 30000), "int16": (np.int16, -5),
    "uint4": (ml_dtypes.uint4, 3), "int4": (ml_dtypes.int4, -1),
}


def _session(nodes, inputs, output_type, shape, initializers, opset):
    output = helper.make_tensor_value_info("y", output_type, shape)
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, [output], initializers),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = IR_VERSION[opset]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def ort_quantize(x, scale, zero_point, opset, **attributes) -> np.ndarray:
    """onnxruntime's QuantizeLinear; 4-bit results pass through Cast to int8 (ORT's Python API has no int4)."""
    initializers = [numpy_helper.from_array(np.asarray(scale, np.float32), "scale"),
                    numpy_helper.from_array(zero_point, "zero_point")]
    out_type = helper.np_dtype_to_tensor_dtype(zero_point.dtype)
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero_point"], ["y"], **attributes)]
    if out_type in (TensorProto.INT4, TensorProto.UINT4):
        nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero_point"], ["q"], **attributes),
                 helper.make_node("Cast", ["q"], ["y"], to=TensorProto.INT8)]
        out_type = TensorProto.INT8
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)]
    return _session(nodes, inputs, out_type, x.shape, initializers, opset).run(None, {"x": x})[0]


def ort_dequantize(q, scale, zero_point, opset, **attributes) -> np.ndarray:
    """onnxruntime's DequantizeLinear of a constant q (so 4-bit q needs no numpy feed)."""
    initializers = [numpy_helper.from_array(q, "q"), numpy_helper.from_array(np.asarray(scale, np.float32), "scale"),
                    numpy_helper.from_array(zero_point, "zero_point")]
    nodes = [helper.make_node("DequantizeLinear", ["q", "scale", "zero_point"], ["y"], **attributes)]
    return _session(nodes, [], TensorProto.FLOAT, q.shape, initializers, opset).run(None, {})[0]


def ort_dynamic_quantize(x) -> list[np.ndarray]:
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zero_point"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, x.shape),
                               helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
                               helper.make_tensor_value_info("zero_point", TensorProto.UINT8, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = IR_VERSION[11]
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


def awkward_x(scale: float, seed: int = 0) -> np.ndarray:
    """Special and out-of-range values, exact ties (k + ½)·scale, then random values; an odd length
    so that onnxruntime's vector loop and its scalar tail both run."""
    special = [0.0, -0.0, 1e6, -1e6, -3e38, 3e38, -1e30, np.inf, -np.inf, np.nan]
    ties = (np.arange(-300, 300) + 0.5) * scale
    random = np.random.default_rng(seed).standard_normal(2001) * scale * 100
    return np.concatenate([special, ties, random]).astype(np.float32)


def _zero_point(name, values):
    return np.asarray(values).astype(TYPES[name][0])


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("name, opset", [("uint8", 13), ("int8", 13), ("uint8", 19), ("int8", 19), ("uint8", 21),
                                         ("int8", 21), ("uint16", 21), ("int16", 21), ("uint4", 21), ("int4", 21)])
def test_quantize_per_tensor(name, opset, scale):
    x = awkward_x(scale)
    zero_point = _zero_point(name, TYPES[name][1])
    expected = ort_quantize(x, scale, zero_point, opset)
    got = quantize_linear(x, scale, zero_point)
    np.testing.assert_array_equal(got.astype(np.int32), expected.astype(np.int32))
    assert got.dtype == INTEGER_TYPES[name][2]


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("name, opset", [("uint8", 13), ("int8", 13), ("int8", 19), ("int16", 21), ("int4", 21)])
def test_quantize_per_axis(name, opset, axis):
    x = awkward_x(0.05, seed=1)[:3 * 5 * 171].reshape(3, 5, 171)
    channels = x.shape[axis]
    scale = np.linspace(1e-3, 0.1, channels).astype(np.float32)
    zero_point = _zero_point(name, np.arange(channels) % 5 - 2 + max(TYPES[name][1], 2))
    expected = ort_quantize(x, scale, zero_point, opset, axis=axis)
    got = quantize_linear(x, scale, zero_point, axis=axis)
    numbers = x < 1e30  # onnxruntime's int4 per-axis kernel wraps x/scale ≥ 2³¹ (see the test below)
    np.testing.assert_array_equal(got[numbers].astype(np.int32), expected[numbers].astype(np.int32))


@pytest.mark.parametrize("axis, block_size", [(1, 2), (1, 3), (-1, 4), (0, 2)])
@pytest.mark.parametrize("name", ["uint8", "int8", "int4"])
def test_quantize_blocked(name, axis, block_size):
    x = awkward_x(0.05, seed=2)[:4 * 7 * 9].reshape(4, 7, 9)
    shape = list(x.shape)
    shape[axis] = -(-shape[axis] // block_size)
    rng = np.random.default_rng(5)
    scale = rng.uniform(1e-3, 0.1, shape).astype(np.float32)
    zero_point = _zero_point(name, rng.integers(0, 6, shape))
    expected = ort_quantize(x, scale, zero_point, 21, axis=axis, block_size=block_size)
    got = quantize_linear(x, scale, zero_point, axis=axis, block_size=block_size)
    numbers = x < 1e30  # onnxruntime 1.31's blocked kernel wrapped x/scale ≥ 2³¹ (see the test below)
    np.testing.assert_array_equal(got[numbers].astype(np.int32), expected[numbers].astype(np.int32))


def test_quotients_beyond_int32_saturate_as_the_spec_says():
    """round(x/scale) past int32 (3e9, 3e38, +inf) saturates to qmax, blocked or not, and −inf and NaN
    give qmin, as onnxruntime's main (MLAS) kernel does. (onnxruntime 1.31's blocked and int4 kernels
    wrapped such quotients to INT32_MIN, i.e. qmin; 1.32 saturates. The test above compares only numbers.)"""
    x = np.array([[3e38, np.inf, 3e9, 2e9, -np.inf, np.nan]], np.float32).T.repeat(2, axis=1)
    scale, zero_point = np.ones((3, 2), np.float32), np.full((3, 2), 3, np.uint8)
    np.testing.assert_array_equal(quantize_linear(x, scale, zero_point, axis=0, block_size=2)[:, 0],
                                  [255, 255, 255, 255, 0, 0])
    np.testing.assert_array_equal(quantize_linear(x, scale[0], zero_point[0], axis=1)[:, 0],
                                  [255, 255, 255, 255, 0, 0])
    np.testing.assert_array_equal(ort_quantize(x, scale[0], zero_point[0], 13, axis=1)[:, 0],  # MLAS
                                  [255, 255, 255, 255, 0, 0])


@pytest.mark.parametrize("scale", [1e-3, 0.0123])
def test_onnxruntime_divides_and_these_inputs_tell_the_difference(scale):
    """lpt matches onnxruntime's x / scale; x · (1/scale) would fail this test on these same inputs."""
    x = awkward_x(scale)
    x = x[~np.isnan(x)]  # the reciprocal form is only compared on numbers
    zero_point = np.uint8(128)
    expected = ort_quantize(x, scale, zero_point, 13)
    with np.errstate(over="ignore"):
        reciprocal = np.clip(np.rint(x * (np.float32(1) / np.float32(scale))) + 128, 0, 255)
    assert np.count_nonzero(reciprocal != expected) > 0
    np.testing.assert_array_equal(quantize_linear(x, scale, zero_point), expected)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("name, opset", [("uint8", 13), ("int8", 13), ("uint8", 19), ("int16", 21), ("uint16", 21),
                                         ("int4", 21), ("uint4", 21)])
def test_dequantize_per_tensor_over_the_whole_type(name, opset, scale):
    qmin, qmax, _ = INTEGER_TYPES[name]
    q = _zero_point(name, np.arange(qmin, qmax + 1))
    zero_point = _zero_point(name, TYPES[name][1])
    expected = ort_dequantize(q, scale, zero_point, opset)
    got = dequantize_linear(q, scale, zero_point)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("attributes", [{"axis": 1}, {"axis": -1}, {"axis": 1, "block_size": 2}])
def test_dequantize_per_axis_and_blocked(attributes):
    rng = np.random.default_rng(6)
    q = rng.integers(-128, 128, (3, 5, 4)).astype(np.int8)
    axis = attributes["axis"]
    if "block_size" in attributes:
        shape = list(q.shape)
        shape[axis] = -(-q.shape[axis] // attributes["block_size"])
    else:
        shape = [q.shape[axis]]
    scale = rng.uniform(1e-3, 1, shape).astype(np.float32)
    zero_point = rng.integers(-10, 10, shape).astype(np.int8)
    expected = ort_dequantize(q, scale, zero_point, 21, **attributes)
    np.testing.assert_array_equal(dequantize_linear(q, scale, zero_point, **attributes), expected)


@pytest.mark.parametrize("x", [
    np.random.default_rng(8).standard_normal(1001) * 3,
    np.random.default_rng(9).uniform(0.5, 7, 333),  # positive only: the range is extended to 0
    -np.random.default_rng(10).uniform(0.5, 7, 333),  # negative only
    np.zeros(17),  # onnxruntime: scale 1.0
    np.array([2.5]),
    np.array([-1e30, 1e30, 0.3]),
    np.array([1e-30, -2e-30, 3e-30]),
    np.array([np.nan, 1.0, -0.5]),
], ids=["normal", "positive", "negative", "zeros", "single", "huge", "tiny", "nan"])
def test_dynamic_quantize(x):
    x = x.astype(np.float32)
    expected = ort_dynamic_quantize(x)
    got = dynamic_quantize_linear(x)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_array_equal(g, e)
