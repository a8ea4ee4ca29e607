"""MoveThroughPrecisionPreserved: the dequantization moves past ops that only move values."""

import numpy as np
import pytest
from onnx import helper

from lpt.transformations.fake_quantize_decomposition import FakeQuantizeDecomposition
from lpt.transformations.precision_preserved import MoveThroughPrecisionPreserved
from tests.graphs import op_types
from tests.transformations.builders import RNG, Graph, apply, assert_same_outputs, reasons

SHAPE = [2, 3, 4, 4]
PER_CHANNEL = dict(scale=np.array([0.1, 0.2, 0.05], np.float32), zero_point=np.array([0, 10, 3], np.uint8), axis=1)


def graph(op_type, per_channel=False, **attrs):
    g = Graph()
    params = PER_CHANNEL if per_channel else dict(scale=0.1, zero_point=np.uint8(7))
    x = g.fq("x", **params)
    extra = []
    if op_type == "Reshape":
        extra = [g.const(np.array([2, -1], np.int64))]
    if op_type == "Pad":
        value = attrs.pop("value", None)  # None: no constant_value input, which means 0.0
        extra = [g.const(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))] + ([] if value is None else [g.const(np.float32(value))])
    g.op(op_type, [x, *extra], name="y", **attrs)
    return g


CASES = [
    pytest.param("MaxPool", False, {"kernel_shape": [2, 2]}, True, id="maxpool"),
    pytest.param("MaxPool", True, {"kernel_shape": [2, 2]}, True, id="maxpool-per-channel"),
    pytest.param("Reshape", False, {}, True, id="reshape"),
    pytest.param("Reshape", True, {}, False, id="reshape-merges-channels"),
    pytest.param("Transpose", True, {"perm": [0, 2, 3, 1]}, True, id="transpose-per-channel"),
    pytest.param("Flatten", False, {}, True, id="flatten"),
    pytest.param("Pad", False, {"value": 0.0}, True, id="pad-zero"),
    pytest.param("Pad", False, {}, True, id="pad-default-zero"),
    pytest.param("Pad", True, {}, False, id="pad-zero-per-channel-zero-points"),
    pytest.param("Pad", False, {"value": 0.05}, False, id="pad-off-grid"),
]


@pytest.mark.parametrize("op_type, per_channel, attrs, moved", CASES)
def test_move_through(op_type, per_channel, attrs, moved):
    _, before = graph(op_type, per_channel, **dict(attrs)).build({"x": SHAPE}, ["y"])
    _, after = graph(op_type, per_channel, **dict(attrs)).build({"x": SHAPE}, ["y"])
    result = apply([FakeQuantizeDecomposition, MoveThroughPrecisionPreserved], after)
    assert ("MoveThroughPrecisionPreserved", "y") in result.applied if moved else True
    ops = op_types(after)
    if moved:
        assert ops.index(op_type) < ops.index("Cast") and ops[-1] == "Mul"
        assert after.graph.outputs[0].name == "y"
    else:
        assert ops.index(op_type) == len(ops) - 1 and reasons(after)["y"]
    x = RNG.uniform(-3, 6, SHAPE).astype(np.float32)
    assert_same_outputs(before, after, {"x": x}, atol=0)


def test_split_gives_each_output_its_own_dequantization():
    def build():
        g = Graph()
        a, b = "a", "b"
        g.nodes.append(helper.make_node("Split", [g.fq("x", 0.1, np.uint8(7))], [a, b], name="split", axis=1,
                                        num_outputs=2))
        g.op("Relu", [a], name="y")
        g.op("Relu", [b], name="z")
        return g.build({"x": [2, 4]}, ["y", "z"], opset=18)[1]

    before, after = build(), build()
    apply([FakeQuantizeDecomposition, MoveThroughPrecisionPreserved], after)
    split = next(n for n in after.graph if n.op_type == "Split")
    assert all(o.dtype.name == "UINT8" for o in split.outputs)
    assert [n.op_type for n in after.graph].count("Cast") == 2
    assert_same_outputs(before, after, {"x": RNG.uniform(-1, 2, (2, 4)).astype(np.float32)}, atol=0)


def test_maxpool_refuses_a_negative_scale():
    g = Graph()
    g.op("MaxPool", [g.fq("x", -0.1, np.int8(0))], name="y", kernel_shape=[2, 2])
    _, m = g.build({"x": SHAPE}, ["y"])
    apply([FakeQuantizeDecomposition, MoveThroughPrecisionPreserved], m)
    assert "non-positive scale" in reasons(m)["y"]
