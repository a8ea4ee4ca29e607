"""QLinearOpsToQdq (then QdqToFakeQuantize): pre-quantized ops become float ops between FakeQuantizes."""

import numpy as np
import onnx
from onnx import helper

import lpt
from lpt.normalize import normalize
from tests.graphs import ONNXRUNTIME_INT8_IS_EXACT, ir_model, model, op_types, run_ort

RNG = np.random.default_rng(0)
X_SCALE, X_ZP, Y_SCALE, Y_ZP = np.float32(0.02), np.uint8(120), np.float32(0.05), np.uint8(110)


def quantized_model(op_nodes, inits, x_shape):
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["x_q"], name="q_x")] + op_nodes + [
        helper.make_node("DequantizeLinear", ["y_q", "ys", "yz"], ["y"], name="dq_y")]
    inits = {"xs": X_SCALE, "xz": X_ZP, "ys": Y_SCALE, "yz": Y_ZP, **inits}
    return model(nodes, {"x": x_shape}, {"y": None}, inits)


def assert_within_one_lsb(proto, normalized, x):
    """Float conv + quantize vs the integer op's own requantization: at most 1 LSB apart.

    The integer op as ONNX's reference evaluator computes it (exact integers), and as onnxruntime
    does where its u8·s8 kernels are exact on this CPU."""
    ours = lpt.run_reference(normalized, {"x": x})["y"]
    originals = [lpt.run_reference(proto, {"x": x})["y"]] + ([run_ort(proto, {"x": x})[0]] if ONNXRUNTIME_INT8_IS_EXACT else [])
    for original in originals:
        lsb = np.abs(ours - original) / Y_SCALE
        assert lsb.max() <= 1.0 + 1e-4 and (lsb < 1e-4).mean() > 0.95


def test_qlinear_conv_with_bias():
    w_scale = np.array([0.01, 0.004, 0.02], np.float32)
    inits = {"w": RNG.integers(-127, 128, (3, 2, 3, 3)).astype(np.int8), "ws": w_scale, "wz": np.zeros(3, np.int8),
             "b": RNG.integers(-500, 500, 3).astype(np.int32)}
    conv = helper.make_node("QLinearConv", ["x_q", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y_q"],
                            name="conv", pads=[1, 1, 1, 1], strides=[2, 2])
    proto = quantized_model([conv], inits, [1, 2, 9, 9])
    m = ir_model(proto)
    assert normalize(m).modified
    assert op_types(m) == ["FakeQuantize", "FakeQuantize", "Conv", "FakeQuantize"]
    conv_node = m.graph[2]
    assert conv_node.attributes["strides"].as_ints() == (2, 2) and len(conv_node.inputs) == 3
    assert_within_one_lsb(proto, m, RNG.uniform(-2, 2, (1, 2, 9, 9)).astype(np.float32))


def test_qlinear_matmul():
    inits = {"w": RNG.integers(-127, 128, (8, 5)).astype(np.int8), "ws": np.float32(0.01), "wz": np.int8(0)}
    mm = helper.make_node("QLinearMatMul", ["x_q", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y_q"], name="mm")
    proto = quantized_model([mm], inits, [3, 8])
    m = ir_model(proto)
    assert normalize(m).modified
    assert op_types(m) == ["FakeQuantize", "FakeQuantize", "MatMul", "FakeQuantize"]
    assert_within_one_lsb(proto, m, RNG.uniform(-2, 2, (3, 8)).astype(np.float32))


def test_matmul_integer_with_scale_multiply():
    w_scale = np.float32(0.01)
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["x_q"], name="q_x"),
             helper.make_node("MatMulInteger", ["x_q", "w", "xz"], ["acc"], name="mmi"),
             helper.make_node("Cast", ["acc"], ["acc_f"], to=onnx.TensorProto.FLOAT),
             helper.make_node("Mul", ["acc_f", "combined"], ["y"])]
    inits = {"xs": X_SCALE, "xz": X_ZP, "w": RNG.integers(0, 256, (8, 5)).astype(np.uint8),
             "combined": np.float32(X_SCALE * w_scale)}
    proto = model(nodes, {"x": [3, 8]}, {"y": None}, inits)
    m = ir_model(proto)
    assert normalize(m).modified
    assert op_types(m) == ["FakeQuantize", "FakeQuantize", "MatMul"]
    x = RNG.uniform(-2, 2, (3, 8)).astype(np.float32)
    np.testing.assert_allclose(lpt.run_reference(m, {"x": x})["y"], run_ort(proto, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_matmul_integer_without_a_static_input_scale_is_kept():
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "xs", "xz"]),
             helper.make_node("MatMulInteger", ["x_q", "w", "xz"], ["acc"], name="mmi"),
             helper.make_node("Cast", ["acc"], ["acc_f"], to=onnx.TensorProto.FLOAT),
             helper.make_node("Mul", ["acc_f", "xs"], ["y"])]
    proto = model(nodes, {"x": [3, 8]}, {"y": None}, {"w": RNG.integers(0, 256, (8, 5)).astype(np.uint8)})
    m = ir_model(proto)
    normalize(m)
    assert "MatMulInteger" in op_types(m)
