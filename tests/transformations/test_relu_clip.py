"""ReluTransformation and ClipTransformation: thresholds move into the integer domain."""

import numpy as np
import pytest

from lpt.transformations.clip import ClipTransformation
from lpt.transformations.fake_quantize_decomposition import FakeQuantizeDecomposition
from lpt.transformations.relu import ReluTransformation
from tests.graphs import op_types
from tests.transformations.builders import Graph, apply, assert_same_outputs, openvino_fq, reasons


@pytest.mark.parametrize("zero_point, integer_op", [(np.int8(0), "Relu"), (np.uint8(128), "Max"), (np.int8(-20), "Max"),
                                                    (np.uint8(0), "Cast")])  # u8 with zp 0: already ≥ 0, Relu removed
def test_relu_runs_on_integers(zero_point, integer_op):
    def build():
        g = Graph()
        g.op("Relu", [g.fq("x", 0.05, zero_point)], name="y")
        return g.build({"x": [64]}, ["y"])[1]

    before, after = build(), build()
    apply([FakeQuantizeDecomposition, ReluTransformation], after)
    ops = op_types(after)
    assert ops[1] == integer_op and ops[-1] == "Mul"
    x = np.linspace(-5, 5, 64, dtype=np.float32)
    assert_same_outputs(before, after, {"x": x}, atol=0)


def test_relu_needs_an_integer_zero_point():
    g = Graph()
    # [-0.3, 1.0] on 256 levels puts 0.0 between two levels: the shift is not an integer.
    g.op("Relu", [openvino_fq(g, "x", 256, -0.3, 1.0)], name="y")
    _, m = g.build({"x": [8]}, ["y"], output_shapes={"y": [8]})
    apply([FakeQuantizeDecomposition, ReluTransformation], m)
    assert "zero point is not an integer" in reasons(m)["y"]


def test_relu6_clip_runs_on_integers_within_one_step():
    def build():
        g = Graph()
        g.op("Clip", [g.fq("x", 0.05, np.uint8(20)), g.const(np.float32(0)), g.const(np.float32(6.01))], name="y")
        return g.build({"x": [128]}, ["y"])[1]

    before, after = build(), build()
    apply([FakeQuantizeDecomposition, ClipTransformation], after)
    assert op_types(after) == ["QuantizeLinear", "Clip", "Cast", "Sub", "Mul"]
    clip = after.graph[1]
    assert [clip.inputs[i].const_value.numpy().item() for i in (1, 2)] == [20, 20 + 120]  # ⌊6.01/0.05⌋ = 120
    x = np.linspace(-2, 8, 128, dtype=np.float32)
    assert_same_outputs(before, after, {"x": x}, atol=0.05)


@pytest.mark.parametrize("activation, bounds", [("Relu", ()), ("Clip", (0.0, 6.0))])
def test_an_activation_on_an_accumulator_stays_in_the_output_stage(activation, bounds):
    """Conv without a bias: its dequantization reaches the activation directly, but ONNX has no int32 Relu or
    Clip before opset 14, and the layer's kernel applies it in f32 anyway (ConvInteger → Cast → Mul → Relu → Q)."""
    from lpt.backend import compile_model
    from lpt.transformations.pipeline import transform

    g = Graph()
    conv = g.op("Conv", [g.fq("x", 0.02, np.uint8(128)), g.weight((4, 3, 3, 3))], pads=[1, 1, 1, 1])
    g.fq(g.op(activation, [conv, *(g.const(np.float32(b)) for b in bounds)], name="act"), 0.03, np.uint8(0))
    _, m = g.build({"x": [2, 3, 8, 8]}, ["act_fq"], opset=13)
    transform(m)
    assert reasons(m)["act"].startswith("an int32 accumulator")
    fused = [s.op_types for s in compile_model(m).steps if "ConvInteger" in s.op_types]
    assert fused == [("ConvInteger", "Cast", "Mul", activation, "QuantizeLinear")]
