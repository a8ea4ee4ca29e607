"""ConcatTransformation and ConstantArithmeticTransformation."""

import numpy as np

from lpt.transformations.concat import ConcatTransformation
from lpt.transformations.constant_arithmetic import ConstantArithmeticTransformation
from lpt.transformations.fake_quantize_decomposition import FakeQuantizeDecomposition
from tests.graphs import op_types
from tests.transformations.builders import RNG, Graph, apply, assert_same_outputs, reasons


def concat(scale_b):
    g = Graph()
    g.op("Concat", [g.fq("a", 0.1, np.uint8(5)), g.fq("b", scale_b, np.uint8(5))], name="y", axis=1)
    return g.build({"a": [2, 3], "b": [2, 4]}, ["y"])[1]


def test_concat_of_equal_dequantizations_moves_them_after():
    before, after = concat(0.1), concat(0.1)
    apply([FakeQuantizeDecomposition, ConcatTransformation], after)
    assert op_types(after) == ["QuantizeLinear", "QuantizeLinear", "Concat", "Cast", "Sub", "Mul"]
    feeds = {"a": RNG.normal(size=(2, 3)).astype(np.float32), "b": RNG.normal(size=(2, 4)).astype(np.float32)}
    assert_same_outputs(before, after, feeds, atol=0)


def test_concat_of_different_scales_is_left_for_requantization():
    m = concat(0.2)
    apply([FakeQuantizeDecomposition, ConcatTransformation], m)
    assert "different scales" in reasons(m)["y"]


def test_constant_add_and_mul_fold_into_the_dequantization():
    def build():
        g = Graph()
        shifted = g.op("Add", [g.fq("x", 0.1, np.uint8(5)), g.const(np.float32(0.3))])
        g.op("Mul", [shifted, g.const(np.float32(2.0))], name="y")
        return g.build({"x": [16]}, ["y"])[1]

    before, after = build(), build()
    apply([FakeQuantizeDecomposition, ConstantArithmeticTransformation], after)
    assert op_types(after) == ["QuantizeLinear", "Cast", "Sub", "Mul"]
    sub, mul = after.graph[2], after.graph[3]
    np.testing.assert_allclose(sub.inputs[1].const_value.numpy(), 5 - 0.3 / 0.1, rtol=1e-6)
    np.testing.assert_allclose(mul.inputs[1].const_value.numpy(), 0.2, rtol=1e-6)
    assert_same_outputs(before, after, {"x": np.linspace(-1, 3, 16, dtype=np.float32)}, atol=1e-6)
