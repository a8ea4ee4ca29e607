"""A dynamically quantized model's ops on the native engine (quantize_dynamic's form: DynamicQuantizeLinear,
then ConvInteger / MatMulInteger with u8 weights around a zero point), against ONNX's own definitions."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import lpt.native
from lpt.backend import compile_model
from lpt.backend.onnx_int8_steps import MAX_RESIDUALS
from lpt.errors import QuantizationError
from lpt.numerics import dynamic_quantize_linear

FLOATS = hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=40),
                    elements=st.floats(width=32, allow_nan=True, allow_infinity=True))


@given(x=FLOATS | hnp.arrays(np.float32, st.sampled_from([(0,), (3, 0)])))
@settings(max_examples=200, deadline=None)
def test_dynamic_quantize_equals_lpts_numerics(x):
    """NaN left out of the range, an all-zero tensor, an empty one; an infinite range the same error."""
    try:
        expected_q, expected_scale, expected_zero_point = dynamic_quantize_linear(x)
    except QuantizationError as expected:
        with pytest.raises(QuantizationError, match=str(expected).split(",")[0]):
            lpt.native.dynamic_quantize(x, threads=1)
        return
    q, scale, zero_point = lpt.native.dynamic_quantize(x, threads=1)
    assert q.dtype == np.uint8 and np.array_equal(q, expected_q)
    assert scale.tobytes() == np.asarray(expected_scale, np.float32).tobytes()
    assert int(zero_point) == int(expected_zero_point)


@pytest.mark.parametrize("shift", [0.0, -3.0, 2.5])
def test_dynamic_quantize_of_a_large_tensor_on_two_threads(shift):
    """Past the size where its loops split among threads: each thread's range, then the whole range."""
    x = (np.random.default_rng(1).normal(0, 1, (3, 64, 40, 40)) + shift).astype(np.float32)
    x[1, 5, 7, 9] = np.nan
    q, scale, zero_point = lpt.native.dynamic_quantize(x, threads=2)
    expected_q, expected_scale, expected_zero_point = dynamic_quantize_linear(x)
    assert np.array_equal(q, expected_q) and scale == expected_scale and zero_point == expected_zero_point


def dynamic_model(op: str, weights: np.ndarray, weight_zero_point: np.ndarray, x_shape: tuple, **attributes):
    """x (f32) → DynamicQuantizeLinear → op(x_q, W, x_zp, W_zp) → int32 y, as quantize_dynamic writes it."""
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_scale", "x_zp"]),
             helper.make_node(op, ["x_q", "w", "x_zp", "w_zp"], ["y"], **attributes)]
    graph = helper.make_graph(nodes, "dynamic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, None),
                               helper.make_tensor_value_info("x_scale", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(weight_zero_point, "w_zp")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def run_both(model: onnx.ModelProto, x: np.ndarray):
    """(lpt's y, ONNX's reference y, the engine that computed the integer op in lpt's plan)."""
    plan = compile_model(ir.serde.deserialize_model(model), threads=2)
    [engine] = [step.engine for step in plan.steps if step.op_types[0] in ("ConvInteger", "MatMulInteger")]
    return plan.run({"x": x})["y"], ReferenceEvaluator(model).run(None, {"x": x})[0], engine


@st.composite
def conv_integer_cases(draw):
    """u8 weights whose zero point leaves a few of w − zw outside int8 (a per-tensor or per-channel zw),
    strides, dilations, pads and groups, and a source whose range moves its zero point."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    groups = draw(st.integers(1, 3))
    out_channels, in_per_group = groups * draw(st.integers(1, 5)), draw(st.integers(1, 4))
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    weights = rng.integers(60, 200, (out_channels, in_per_group) + kernel).astype(np.uint8)
    outliers = draw(st.integers(0, 4))
    weights.reshape(-1)[rng.choice(weights.size, min(outliers, weights.size), replace=False)] = \
        rng.choice(np.array([0, 255], np.uint8), min(outliers, weights.size))
    per_channel = draw(st.booleans())
    zero_point = rng.integers(100, 156, out_channels if per_channel else ()).astype(np.uint8)
    attributes = dict(group=groups, strides=[draw(st.integers(1, 2)) for _ in range(2)],
                      dilations=[draw(st.integers(1, 2)) for _ in range(2)],
                      pads=[draw(st.integers(0, 2)) for _ in range(4)])
    x = (rng.normal(draw(st.floats(-1, 1)), 1, (draw(st.integers(1, 2)), groups * in_per_group, 7, 9))
         ).astype(np.float32)
    return weights, zero_point, attributes, x


@given(case=conv_integer_cases())
@settings(max_examples=40, deadline=None)
def test_a_conv_integer_with_u8_weights_around_a_zero_point(case):
    weights, zero_point, attributes, x = case
    got, expected, engine = run_both(dynamic_model("ConvInteger", weights, zero_point, x.shape, **attributes), x)
    assert got.dtype == np.int32 and np.array_equal(got, expected)
    assert lpt.native.is_native_engine(engine)


@given(seed=st.integers(0, 2**32 - 1), outliers=st.integers(0, 6), per_column=st.booleans(),
       rows=st.sampled_from([(1,), (5,), (2, 3)]))
@settings(max_examples=40, deadline=None)
def test_a_matmul_integer_with_u8_weights_around_a_zero_point(seed, outliers, per_column, rows):
    rng = np.random.default_rng(seed)
    k, n = int(rng.integers(1, 70)), int(rng.integers(1, 30))
    weights = rng.integers(60, 200, (k, n)).astype(np.uint8)
    weights.reshape(-1)[rng.choice(weights.size, min(outliers, weights.size), replace=False)] = 255
    zero_point = rng.integers(100, 156, n if per_column else ()).astype(np.uint8)
    x = rng.normal(0.3, 1, rows + (k,)).astype(np.float32)
    got, expected, engine = run_both(dynamic_model("MatMulInteger", weights, zero_point, x.shape), x)
    assert got.dtype == np.int32 and np.array_equal(got, expected)
    assert lpt.native.is_native_engine(engine)


def test_weights_with_many_values_outside_int8_stay_on_lpts_kernels():
    """u8 weights with a zero point of 0 leave int8 in half their values: adding each back would cost more
    than lpt's kernels, which take the op, with the same integers."""
    rng = np.random.default_rng(3)
    weights = rng.integers(0, 256, (8, 4, 3, 3)).astype(np.uint8)
    assert np.count_nonzero(weights > 127) > MAX_RESIDUALS
    x = rng.normal(0, 1, (1, 4, 6, 6)).astype(np.float32)
    got, expected, engine = run_both(dynamic_model("ConvInteger", weights, np.uint8(0), x.shape, pads=[1, 1, 1, 1]), x)
    assert np.array_equal(got, expected)
    assert not lpt.native.is_native_engine(engine)


def test_the_plan_counts_a_dynamic_models_products_by_engine():
    """What `lpt run` reports ("int8 layers: 1 on ..."), and the reference a check compares the engine with:
    the same graph compiled without the native engine, on lpt's kernels."""
    rng = np.random.default_rng(5)
    weights = rng.integers(60, 200, (16, 8)).astype(np.uint8)
    model = ir.serde.deserialize_model(dynamic_model("MatMulInteger", weights, np.uint8(128), (3, 16)))
    [(engine, count)] = compile_model(model, threads=1).engine_counts().items()
    assert lpt.native.is_native_engine(engine) and count == 1
    assert dict(compile_model(model, threads=1, native=False).engine_counts()) == {"lpt kernels": 1}
