"""QdqToFakeQuantize: before/after graphs, and bit-exact outputs through a save round trip."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import lpt
from lpt.graph.fake_quantize_op import read_fake_quantize
from lpt.normalize.qdq import QdqToFakeQuantize
from tests.graphs import ir_model, model, op_types, run_ort, tricky_inputs


def qdq_model(opset, zero_point, scale=0.05, axis=None, weight=False):
    """x → Q → DQ → Relu; or, with weight=True, Conv(x, DQ(int8 weight))."""
    zp = np.asarray(zero_point)
    s = np.asarray(scale, np.float32)
    attrs = {} if axis is None else {"axis": axis}
    inits = {"s": s, "zp": zp}
    if weight:
        w = np.random.default_rng(0).integers(-127, 128, size=(s.size if s.ndim else 4, 3, 3, 3)).astype(np.int8)
        inits["w_q"] = w
        nodes = [helper.make_node("DequantizeLinear", ["w_q", "s", "zp"], ["w"], name="dq_w", **attrs),
                 helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])]
        return model(nodes, {"x": [1, 3, 5, 5]}, {"y": None}, inits, opset=opset)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["x_q"], name="q", **attrs),
             helper.make_node("DequantizeLinear", ["x_q", "s", "zp"], ["x_dq"], name="dq", **attrs),
             helper.make_node("Relu", ["x_dq"], ["y"], name="relu")]
    return model(nodes, {"x": [2, 3, 4, 5]}, {"y": None}, inits, opset=opset)


def roundtrip(proto, tmp_path):
    m = ir_model(proto)
    result = QdqToFakeQuantize()(m)
    path = lpt.save(m, tmp_path / "out.onnx")
    return result, m, onnx.load(path)


@pytest.mark.parametrize("opset", [10, 13, 19, 21])
@pytest.mark.parametrize("zero_point", [np.uint8(128), np.uint8(3), np.int8(0), np.int8(-5)], ids=["u8-128", "u8-odd", "i8-0", "i8-neg"])
def test_activation_pair_becomes_one_fake_quantize_and_stays_bit_exact(opset, zero_point, tmp_path):
    proto = qdq_model(opset, zero_point)
    result, normalized, saved = roundtrip(proto, tmp_path)
    assert result.modified
    assert op_types(normalized) == ["FakeQuantize", "Relu"]
    fq = read_fake_quantize(normalized.graph[0])
    assert fq.semantics == "onnx-qdq" and fq.levels == 256
    assert normalized.graph[0].outputs[0].name == "x_dq"  # the tensor keeps its name
    x = tricky_inputs([2, 3, 4, 5], 0.05, int(zero_point))
    np.testing.assert_array_equal(run_ort(saved, {"x": x})[0], run_ort(proto, {"x": x})[0])


@pytest.mark.parametrize("opset", [13, 21])
def test_per_channel_int8_weight_becomes_narrow_range_fake_quantize(opset, tmp_path):
    scale = np.array([0.01, 0.02, 0.5, 1 / 3], np.float32)
    proto = qdq_model(opset, np.zeros(4, np.int8), scale, axis=0, weight=True)
    result, normalized, saved = roundtrip(proto, tmp_path)
    assert result.modified and op_types(normalized) == ["FakeQuantize", "Conv"]
    fq = read_fake_quantize(normalized.graph[0])
    assert fq.levels == 255 and fq.per_channel_axis == 0 and fq.is_symmetric
    np.testing.assert_array_equal(fq.input_low.reshape(-1), -127 * scale)
    # Saved back as an int8 initializer + DequantizeLinear, with the very same integers.
    assert op_types(saved) == ["DequantizeLinear", "Conv"]
    original_q = numpy_helper.to_array(proto.graph.initializer[2])
    saved_q = max((numpy_helper.to_array(t) for t in saved.graph.initializer if t.data_type == onnx.TensorProto.INT8), key=np.size)
    np.testing.assert_array_equal(saved_q, original_q)
    x = np.random.default_rng(1).normal(size=(1, 3, 5, 5)).astype(np.float32)
    np.testing.assert_array_equal(run_ort(saved, {"x": x})[0], run_ort(proto, {"x": x})[0])


def test_one_quantize_feeding_two_dequantizes_gives_one_fake_quantize():
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["x_q"], name="q"),
             helper.make_node("DequantizeLinear", ["x_q", "s", "zp"], ["a"], name="dq_a"),
             helper.make_node("DequantizeLinear", ["x_q", "s", "zp"], ["b"], name="dq_b"),
             helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    proto = model(nodes, {"x": [4]}, {"y": None}, {"s": np.float32(0.1), "zp": np.uint8(10)})
    m = ir_model(proto)
    assert QdqToFakeQuantize()(m).modified
    assert op_types(m) == ["FakeQuantize", "Add"]
    add = m.graph[1]
    assert add.inputs[0] is add.inputs[1] is m.graph[0].outputs[0]


def test_quantize_with_an_integer_consumer_is_kept():
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["x_q"], name="q"),
             helper.make_node("DequantizeLinear", ["x_q", "s", "zp"], ["a"], name="dq"),
             helper.make_node("Cast", ["x_q"], ["c"], to=onnx.TensorProto.FLOAT, name="cast"),
             helper.make_node("Add", ["a", "c"], ["y"], name="add")]
    proto = model(nodes, {"x": [4]}, {"y": None}, {"s": np.float32(0.1), "zp": np.uint8(10)})
    m = ir_model(proto)
    assert not QdqToFakeQuantize()(m).modified
    assert op_types(m) == ["QuantizeLinear", "DequantizeLinear", "Cast", "Add"]


def test_mismatched_parameters_are_kept():
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["x_q"], name="q"),
             helper.make_node("DequantizeLinear", ["x_q", "s2", "zp"], ["y"], name="dq")]
    proto = model(nodes, {"x": [4]}, {"y": None}, {"s": np.float32(0.1), "s2": np.float32(0.2), "zp": np.uint8(0)})
    m = ir_model(proto)
    assert not QdqToFakeQuantize()(m).modified


def test_dequantized_graph_output_keeps_its_name(tmp_path):
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["x_q"], name="q"),
             helper.make_node("DequantizeLinear", ["x_q", "s", "zp"], ["y"], name="dq")]
    proto = model(nodes, {"x": [6]}, {"y": None}, {"s": np.float32(0.1), "zp": np.uint8(7)})
    result, normalized, saved = roundtrip(proto, tmp_path)
    assert result.modified
    assert [o.name for o in normalized.graph.outputs] == ["y"]
    x = tricky_inputs([6], 0.1, 7)
    np.testing.assert_array_equal(run_ort(saved, {"x": x})[0], run_ort(proto, {"x": x})[0])
