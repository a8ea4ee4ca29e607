"""Weights held in Constant nodes, and QDQ inside If branches, are normalized like any other."""

import numpy as np
import onnx
from onnx import helper, numpy_helper

import lpt
from lpt.graph.fake_quantize_op import is_fake_quantize
from tests.graphs import model, run_ort


def test_weight_in_a_constant_node(tmp_path):
    w_q = np.random.default_rng(0).integers(-127, 128, (4, 6)).astype(np.int8)
    nodes = [helper.make_node("Constant", [], ["w_q"], value=numpy_helper.from_array(w_q)),
             helper.make_node("Constant", [], ["ws"], value=numpy_helper.from_array(np.float32(0.03))),
             helper.make_node("DequantizeLinear", ["w_q", "ws"], ["w"], name="dq_w"),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    proto = model(nodes, {"x": [2, 4]}, {"y": None})
    path = tmp_path / "m.onnx"
    path.write_bytes(proto.SerializeToString())
    m = lpt.load(path)
    assert [n.op_type for n in m.graph] == ["FakeQuantize", "MatMul"]
    x = np.random.default_rng(1).normal(size=(2, 4)).astype(np.float32)
    np.testing.assert_array_equal(lpt.run_reference(m, {"x": x})["y"], run_ort(proto, {"x": x})[0])


def test_qdq_inside_if_branches(tmp_path):
    def branch(name, scale):
        nodes = [helper.make_node("QuantizeLinear", ["x", f"{name}_s", f"{name}_z"], [f"{name}_q"]),
                 helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_y"])]
        inits = [numpy_helper.from_array(np.float32(scale), f"{name}_s"), numpy_helper.from_array(np.uint8(5), f"{name}_z")]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_y", onnx.TensorProto.FLOAT, [5])], inits)

    nodes = [helper.make_node("If", ["cond"], ["y"], then_branch=branch("then", 0.1), else_branch=branch("else", 0.25))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [5]),
                                           helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [5])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    path = tmp_path / "if.onnx"
    path.write_bytes(proto.SerializeToString())
    m = lpt.load(path)
    branches = [m.graph[0].attributes[b].as_graph() for b in ("then_branch", "else_branch")]
    assert all([n.op_type for n in g] == ["FakeQuantize"] and is_fake_quantize(g[0]) for g in branches)
    saved = onnx.load(lpt.save(m, tmp_path / "out.onnx"))
    x = np.array([-1.0, 0.05, 0.125, 0.3, 30.0], np.float32)
    for cond in (True, False):
        feeds = {"x": x, "cond": np.array(cond)}
        np.testing.assert_array_equal(run_ort(saved, feeds)[0], run_ort(proto, feeds)[0])
