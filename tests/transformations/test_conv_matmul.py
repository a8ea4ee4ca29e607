"""ConvTransformation and MatMulTransformation: integer accumulation, dequantization after."""

import numpy as np
import pytest

from lpt.transformations.pipeline import DECOMPOSITION, transform
from lpt.transformations.conv import ConvTransformation
from lpt.transformations.matmul import MatMulTransformation
from tests.graphs import op_types
from tests.transformations.builders import RNG, Graph, assert_same_outputs, reasons


def run_subset(m, *transformations):
    return transform(m, DECOMPOSITION + transformations)


@pytest.mark.parametrize("group, zero_point", [(1, np.uint8(128)), (1, np.int8(0)), (4, np.uint8(3))],
                         ids=["u8-zp128", "i8-zp0", "depthwise"])
def test_conv_becomes_conv_integer(group, zero_point):
    def build():
        g = Graph()
        w = g.weight((4, 4 // group, 3, 3))
        g.op("Conv", [g.fq("x", 0.02, zero_point), w, g.const(g.rng.normal(size=4).astype(np.float32))], name="y",
             group=group, pads=[1, 1, 1, 1], strides=[2, 1])
        return g.build({"x": [1, 4, 7, 7]}, ["y"])[1]

    before, after = build(), build()
    run_subset(after, ConvTransformation)
    assert op_types(after) == ["QuantizeLinear", "ConvInteger", "Cast", "Mul", "Add"]
    conv = after.graph[1]
    assert conv.attributes["group"].as_int() == group
    assert (len(conv.inputs) == 3) == bool(zero_point)  # x_zero_point only when non-zero
    assert after.graph[3].inputs[1].const_value.numpy().shape == (1, 4, 1, 1)
    x = RNG.uniform(-2, 2, (1, 4, 7, 7)).astype(np.float32)
    assert_same_outputs(before, after, {"x": x}, atol=1e-5)


def test_conv_with_per_channel_activation_stays_float():
    g = Graph()
    x = g.fq("x", np.array([0.1, 0.2], np.float32), np.array([0, 0], np.uint8), axis=1)
    g.op("Conv", [x, g.weight((3, 2, 1, 1))], name="y")
    m = g.build({"x": [1, 2, 3, 3]}, ["y"])[1]
    run_subset(m, ConvTransformation)
    assert "Conv" in op_types(m) and "per channel" in reasons(m)["y"]


def test_gemm_with_trans_b_alpha_beta():
    def build():
        g = Graph()
        g.op("Gemm", [g.fq("x", 0.05, np.uint8(100)), g.weight((5, 6)), g.const(g.rng.normal(size=5).astype(np.float32))],
             name="y", transB=1, alpha=0.5, beta=2.0)
        return g.build({"x": [3, 6]}, ["y"])[1]

    before, after = build(), build()
    run_subset(after, MatMulTransformation)
    assert op_types(after) == ["QuantizeLinear", "MatMulInteger", "Cast", "Mul", "Add"]
    assert after.graph[1].inputs[1].const_value.numpy().shape == (6, 5)  # transB applied to the constant
    assert_same_outputs(before, after, {"x": RNG.uniform(-3, 3, (3, 6)).astype(np.float32)}, atol=1e-5)


def test_matmul_of_two_activations_as_in_attention():
    def build():
        g = Graph()
        g.op("MatMul", [g.fq("q", 0.05, np.int8(0)), g.fq("k", 0.04, np.uint8(128))], name="y")
        return g.build({"q": [2, 4, 8], "k": [2, 8, 4]}, ["y"])[1]

    before, after = build(), build()
    run_subset(after, MatMulTransformation)
    assert op_types(after) == ["QuantizeLinear", "QuantizeLinear", "MatMulInteger", "Cast", "Mul"]
    feeds = {"q": RNG.normal(size=(2, 4, 8)).astype(np.float32), "k": RNG.normal(size=(2, 8, 4)).astype(np.float32)}
    assert_same_outputs(before, after, feeds, atol=1e-5)


@pytest.mark.parametrize("zero_point", [np.uint8(128), np.int8(0)])
def test_conv_transpose_becomes_an_integer_conv_transpose(zero_point):
    def build():
        g = Graph()
        g.op("ConvTranspose", [g.fq("x", 0.02, zero_point), g.weight((2, 3, 3, 3), axis=1),
                               g.const(g.rng.normal(size=3).astype(np.float32))], name="y",
             strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])
        return g.build({"x": [1, 2, 4, 4]}, ["y"])[1]

    before, after = build(), build()
    run_subset(after, ConvTransformation)
    assert op_types(after) == ["QuantizeLinear", "ConvTransposeInteger", "Cast", "Mul", "Add"]
    assert after.graph[2].inputs[0].dtype.name == "INT32"
    x = RNG.uniform(-2, 2, (1, 2, 4, 4)).astype(np.float32)
    assert_same_outputs(before, after, {"x": x}, atol=1e-5)


def test_conv_transpose_with_output_shape_says_why_it_stays_float():
    g = Graph()
    g.op("ConvTranspose", [g.fq("x", 0.02, np.uint8(128)), g.weight((2, 3, 3, 3), axis=1)], name="y",
         output_shape=[5, 5])
    m = g.build({"x": [1, 2, 3, 3]}, ["y"])[1]
    run_subset(m, ConvTransformation)
    assert "output_shape" in reasons(m)["y"]


def test_a_1d_conv_whose_output_rank_the_graph_does_not_know():
    """A Reshape with a shape computed at run time leaves ranks unknown: the weights still say 1-D."""
    def build():
        g = Graph()
        g.op("Conv", [g.fq("x", 0.02, np.uint8(128)), g.weight((4, 3, 1)), g.const(g.rng.normal(size=4).astype(np.float32))],
             name="y")
        _, m = g.build({"x": [2, 3, 5]}, ["y"])
        for value in (m.graph.outputs[0], *(v for n in m.graph for v in n.outputs)):
            value.shape = None
        return m

    before, after = build(), build()
    run_subset(after, ConvTransformation)
    assert [n.inputs[1].const_value.numpy().shape for n in after.graph if n.op_type in ("Mul", "Add")] == [(1, 4, 1)] * 2
    assert_same_outputs(before, after, {"x": RNG.uniform(-2, 2, (2, 3, 5)).astype(np.float32)})
