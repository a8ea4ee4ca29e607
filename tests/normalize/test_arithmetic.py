"""ArithmeticToFakeQuantize: both arithmetic spellings become one FakeQuantize, numbers agree."""

import numpy as np
import pytest
from onnx import helper

import lpt
from lpt.graph.fake_quantize_op import read_fake_quantize
from lpt.normalize.arithmetic import ArithmeticToFakeQuantize
from tests.graphs import ir_model, model, op_types, run_ort, tricky_inputs


def qdq_chain(qmin, qmax, zero_point, with_zero_point=True):
    """x → Div(s) → Round → Add(zp) → Clip(qmin, qmax) → Sub(zp) → Mul(s) → Relu."""
    nodes = [helper.make_node("Div", ["x", "s"], ["t0"]), helper.make_node("Round", ["t0"], ["t1"])]
    last = "t1"
    if with_zero_point:
        nodes.append(helper.make_node("Add", ["t1", "zp"], ["t2"]))
        last = "t2"
    nodes += [helper.make_node("Clip", [last, "qmin", "qmax"], ["t3"])]
    last = "t3"
    if with_zero_point:
        nodes.append(helper.make_node("Sub", ["t3", "zp"], ["t4"]))
        last = "t4"
    nodes += [helper.make_node("Mul", [last, "s"], ["x_fq"]), helper.make_node("Relu", ["x_fq"], ["y"])]
    inits = {"s": np.float32(0.05), "zp": np.float32(zero_point), "qmin": np.float32(qmin), "qmax": np.float32(qmax)}
    return model(nodes, {"x": [4, 16]}, {"y": None}, inits)


@pytest.mark.parametrize("qmin, qmax, zp, levels", [(0, 255, 131, 256), (-128, 127, 0, 256), (-127, 127, 0, 255)])
def test_quantize_dequantize_chain_becomes_an_exact_qdq_fake_quantize(qmin, qmax, zp, levels):
    proto = qdq_chain(qmin, qmax, zp)
    m = ir_model(proto)
    assert ArithmeticToFakeQuantize()(m).modified
    assert op_types(m) == ["FakeQuantize", "Relu"]
    fq = read_fake_quantize(m.graph[0])
    assert fq.semantics == "onnx-qdq" and fq.levels == levels and fq.integer_range == (qmin, qmax)
    x = tricky_inputs([4, 16], 0.05, zp)
    np.testing.assert_array_equal(lpt.run_reference(m, {"x": x})["y"], run_ort(proto, {"x": x})[0])


def test_chain_without_zero_point():
    m = ir_model(qdq_chain(-128, 127, 0, with_zero_point=False))
    assert ArithmeticToFakeQuantize()(m).modified
    assert op_types(m) == ["FakeQuantize", "Relu"]


def test_clip_that_is_not_an_integer_range_is_kept():
    m = ir_model(qdq_chain(3, 250, 0))
    assert not ArithmeticToFakeQuantize()(m).modified
    assert "Round" in op_types(m)


@pytest.mark.parametrize("crop", ["Clip", "MaxMin"])
def test_fake_quantize_formula_becomes_an_openvino_fake_quantize(crop):
    lo, hi, levels = -1.0, 3.0, 256
    step = np.float32((hi - lo) / (levels - 1))
    if crop == "Clip":
        nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["c"])]
    else:
        nodes = [helper.make_node("Max", ["x", "lo"], ["m"]), helper.make_node("Min", ["m", "hi"], ["c"])]
    nodes += [helper.make_node("Sub", ["c", "lo"], ["t0"]), helper.make_node("Div", ["t0", "step"], ["t1"]),
              helper.make_node("Round", ["t1"], ["t2"]), helper.make_node("Mul", ["t2", "step"], ["t3"]),
              helper.make_node("Add", ["t3", "lo"], ["y"])]
    inits = {"lo": np.float32(lo), "hi": np.float32(hi), "step": step}
    proto = model(nodes, {"x": [64]}, {"y": None}, inits)
    m = ir_model(proto)
    assert ArithmeticToFakeQuantize()(m).modified
    assert op_types(m) == ["FakeQuantize"]
    fq = read_fake_quantize(m.graph[0])
    assert fq.levels == 256 and fq.semantics == "openvino"
    x = np.random.default_rng(0).uniform(-2, 4, 64).astype(np.float32)
    # The same level everywhere; only the float32 rounding of the level's value differs
    # (the chain computes round(t)·step + lo, the affine form q·osc + ol).
    np.testing.assert_allclose(lpt.run_reference(m, {"x": x})["y"], run_ort(proto, {"x": x})[0], rtol=0, atol=1e-6)
