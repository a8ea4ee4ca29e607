"""OpenVinoFakeQuantizeToLpt: the OpenVINO op moves into lpt's domain with its semantics."""

import numpy as np
from onnx import helper

import lpt
from lpt.graph.fake_quantize_op import read_fake_quantize
from lpt.normalize.openvino import OpenVinoFakeQuantizeToLpt
from tests.graphs import ir_model, model, op_types

LIMITS = {"il": np.float32(-1.0), "ih": np.float32(2.0), "ol": np.float32(-1.0), "oh": np.float32(2.0)}


def openvino_model(levels=256, limits=LIMITS):
    nodes = [helper.make_node("FakeQuantize", ["x", "il", "ih", "ol", "oh"], ["x_fq"], name="fq",
                              domain="org.openvinotoolkit", levels=levels),
             helper.make_node("Relu", ["x_fq"], ["y"], name="relu")]
    return model(nodes, {"x": [3, 7]}, {"y": [3, 7]}, limits, extra_opsets={"org.openvinotoolkit": 1})


def test_openvino_fake_quantize_becomes_lpt_fake_quantize_with_the_same_outputs():
    proto = openvino_model(levels=255)
    m = ir_model(proto)
    assert OpenVinoFakeQuantizeToLpt()(m).modified
    assert [(n.domain, n.op_type) for n in m.graph] == [("lpt", "FakeQuantize"), ("", "Relu")]
    fq = read_fake_quantize(m.graph[0])
    assert fq.levels == 255 and fq.semantics == "openvino"
    x = np.linspace(-2, 3, 21, dtype=np.float32).reshape(3, 7)
    np.testing.assert_array_equal(lpt.run_reference(m, {"x": x})["y"], lpt.run_reference(proto, {"x": x})["y"])
    expected = np.maximum(lpt.FakeQuantize(*LIMITS.values(), 255).apply(x), 0)
    np.testing.assert_array_equal(lpt.run_reference(m, {"x": x})["y"], expected)


def test_other_openvino_ops_are_left_alone():
    proto = openvino_model()
    proto.graph.node[0].op_type = "Swish"
    del proto.graph.node[0].input[1:]
    m = ir_model(proto)
    assert not OpenVinoFakeQuantizeToLpt()(m).modified
    assert op_types(m) == ["Swish", "Relu"]
