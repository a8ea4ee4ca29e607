"""FakeQuantizeDecomposition and FoldWeightFakeQuantize: FQ → quantize + dequantize."""

import numpy as np
import pytest

from lpt.transformations.fake_quantize_decomposition import FakeQuantizeDecomposition
from lpt.transformations.fold_weight_fake_quantize import FoldWeightFakeQuantize
from tests.graphs import op_types, tricky_inputs
from tests.transformations.builders import RNG, Graph, apply, assert_same_outputs, openvino_fq, reasons


@pytest.mark.parametrize("zero_point, expected", [
    pytest.param(np.uint8(0), ["QuantizeLinear", "Cast", "Mul", "Relu"], id="u8-zp0-no-subtract"),
    pytest.param(np.uint8(131), ["QuantizeLinear", "Cast", "Sub", "Mul", "Relu"], id="u8-odd-zp"),
    pytest.param(np.int8(-3), ["QuantizeLinear", "Cast", "Sub", "Mul", "Relu"], id="i8"),
])
def test_qdq_fake_quantize_splits_bit_exactly(zero_point, expected):
    g = Graph()
    g.op("Relu", [g.fq("x", 0.05, zero_point)], name="y")
    _, before = g.build({"x": [4, 16]}, ["y"])
    _, after = g.build({"x": [4, 16]}, ["y"])
    assert apply([FakeQuantizeDecomposition], after).modified
    assert op_types(after) == expected
    x = tricky_inputs([4, 16], 0.05, int(zero_point))
    assert_same_outputs(before, after, {"x": x}, atol=0)


@pytest.mark.parametrize("ol, dtype", [(0.0, "UINT8"), (-1.0, "INT8")])
def test_openvino_fake_quantize_becomes_lpt_quantize(ol, dtype):
    g = Graph()
    g.op("Relu", [openvino_fq(g, "x", 256, ol, 3.0)], name="y")
    _, before = g.build({"x": [64]}, ["y"], output_shapes={"y": [64]})
    _, after = g.build({"x": [64]}, ["y"], output_shapes={"y": [64]})
    apply([FakeQuantizeDecomposition], after)
    quantize = after.graph[0]
    assert (quantize.domain, quantize.op_type) == ("lpt", "Quantize")
    assert quantize.outputs[0].dtype.name == dtype
    x = np.linspace(-2, 4, 64, dtype=np.float32)
    # Same levels; the dequantization's f32 rounding may differ from the FQ's fused multiply-add.
    assert_same_outputs(before, after, {"x": x}, atol=1e-6)


@pytest.mark.parametrize("levels, il, ih, reason", [
    (16, 0.0, 1.0, "levels 16 is not an 8-bit range"),
    (256, 1.0, 0.0, "inverted interval"),
])
def test_fake_quantize_without_an_integer_form_stays(levels, il, ih, reason):
    g = Graph()
    g.op("Relu", [openvino_fq(g, "x", levels, il, ih)], name="y")
    _, m = g.build({"x": [8]}, ["y"], output_shapes={"y": [8]})
    assert not apply([FakeQuantizeDecomposition], m).modified
    assert op_types(m) == ["FakeQuantize", "Relu"]
    assert reason in reasons(m)["x_fq"]


def test_weights_fold_into_int8_constants_with_per_channel_scales():
    g = Graph()
    g.op("Conv", ["x", g.weight((4, 2, 3, 3))], name="y")
    _, before = g.build({"x": [1, 2, 5, 5]}, ["y"])
    _, after = g.build({"x": [1, 2, 5, 5]}, ["y"])
    apply([FoldWeightFakeQuantize], after)
    assert op_types(after) == ["Cast", "Mul", "Conv"]
    weights = after.graph[0].inputs[0].const_value.numpy()
    assert weights.dtype == np.int8 and weights.min() >= -127
    assert after.graph[1].inputs[1].const_value.numpy().shape == (4, 1, 1, 1)
    assert_same_outputs(before, after, {"x": RNG.normal(size=(1, 2, 5, 5)).astype(np.float32)}, atol=0)


def test_openvino_weight_fake_quantize_levels_255_is_symmetric_int8():
    g = Graph()
    w = g.const(g.rng.normal(size=(3, 4)).astype(np.float32), "w")
    absmax = np.abs(g.inits[w]).max(axis=1, keepdims=True)
    g.op("Gemm", ["x", openvino_fq(g, w, 255, -absmax, absmax)], name="y", transB=1)
    _, before = g.build({"x": [2, 4]}, ["y"])
    _, after = g.build({"x": [2, 4]}, ["y"])
    apply([FoldWeightFakeQuantize], after)
    assert op_types(after) == ["Cast", "Mul", "Gemm"]  # zero point 0: no Subtract
    q = after.graph[0].inputs[0].const_value.numpy()
    assert q.dtype == np.int8 and np.abs(q).max() == 127
    assert_same_outputs(before, after, {"x": RNG.normal(size=(2, 4)).astype(np.float32)}, atol=1e-6)
