"""Integer arithmetic on constants is folded when a plan is compiled (lpt.backend.constant_folding)."""

import numpy as np
import onnx_ir as ir

import lpt
from lpt.backend import compile_model
from lpt.backend.constant_folding import fold_integer_constants
from lpt.crosscheck import run_onnxruntime
from tests.transformations.builders import RNG, Graph


def reflection_pads(g: Graph) -> str:
    """[0, 0, 0, 0, 0, 0, 1, 2] (the ends of H and W) for a Pad of [N, C, H, W], written out as an STFT's exporter
    writes its pads: from the shape of a constant, through Gather, Sub, ConstantOfShape and Concat."""
    border = g.const(np.array([1, 2], np.int64))
    count = g.op("Gather", [g.op("Shape", [border]), g.const(np.array([0], np.int64))], axis=0)
    zeros = g.op("ConstantOfShape", [g.op("Sub", [g.const(np.array(8, np.int64)), count])],
                 value=ir.serde.serialize_tensor(ir.tensor(np.array([0], np.int64))))
    return g.op("Concat", [zeros, border], axis=0)


def test_a_reflection_pad_whose_pads_are_computed_from_constants_is_lpts():
    g = Graph()
    conv = g.op("Conv", [g.fq("x", 0.02, np.uint8(128)), g.weight((4, 3, 3, 3))], pads=[1, 1, 1, 1])
    relu = g.fq(g.op("Relu", [conv]), 0.03, np.uint8(0))
    g.op("Pad", [relu, reflection_pads(g)], name="y", mode="reflect")
    _, fq_model = g.build({"x": [1, 3, 6, 6]}, ["y"])
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    plan = compile_model(int8)
    assert "onnxruntime" not in {s.backend for s in plan.steps}
    assert "Pad" in {op for s in plan.steps for op in s.op_types}
    x = RNG.uniform(-2, 2, (1, 3, 6, 6)).astype(np.float32)
    ours, reference = plan.run({"x": x})["y"], run_onnxruntime(fq_model, {"x": x})["y"]
    assert ours.shape == reference.shape == (1, 4, 7, 8)
    np.testing.assert_allclose(ours, reference, atol=0.031)  # the int8 layer: within 1 LSB (0.03) at ties


def test_folding_replaces_integer_arithmetic_on_constants_and_leaves_the_rest():
    g = Graph()
    target = g.op("Concat", [g.op("Shape", [g.const(np.zeros((2, 3), np.float32))]),
                             g.const(np.array([-1], np.int64))], axis=0)  # [2, 3, -1]: folded
    scaled = g.op("Mul", [g.const(np.float32(2)), g.const(np.float32(3))])  # float: stays a node
    quantized = g.op("QuantizeLinear", [g.const(np.ones(4, np.float32)), g.const(np.float32(0.1)),
                                        g.const(np.uint8(0))])  # a quantization: stays
    g.op("Reshape", [g.op("Mul", ["x", scaled]), target], name="y")
    g.op("Cast", [quantized], name="q", to=1)
    model = g.build({"x": [2, 3, 4]}, ["y", "q"])[1]
    before = [n.op_type for n in model.graph]
    assert fold_integer_constants(model) == 2  # the Shape, then the Concat reading its result
    assert [n.op_type for n in model.graph] == [op for op in before if op not in ("Shape", "Concat")]
    reshape = next(n for n in model.graph if n.op_type == "Reshape")
    assert reshape.inputs[1].const_value.numpy().tolist() == [2, 3, -1]
    x = RNG.uniform(-1, 1, (2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(run_onnxruntime(model, {"x": x})["y"], (x * 6).reshape(2, 3, -1))


def test_compiling_does_not_fold_the_callers_model():
    g = Graph()
    g.op("Reshape", ["x", g.op("Shape", [g.const(np.zeros((4, 2), np.float32))])], name="y")
    model = g.build({"x": [2, 4]}, ["y"])[1]
    compile_model(model)
    assert [n.op_type for n in model.graph] == ["Shape", "Reshape"]


def test_a_result_larger_than_shape_arithmetic_is_never_computed():
    """A ConstantOfShape or a Range past MAX_VALUES is left as a node, its size known from its inputs before any
    evaluation (a hostile one of 10^10 values would fill the memory)."""
    g = Graph()
    huge = g.op("ConstantOfShape", [g.const(np.array([300, 300], np.int64))],
                value=ir.serde.serialize_tensor(ir.tensor(np.array([7], np.int64))))
    steps = g.op("Range", [g.const(np.array(0, np.int64)), g.const(np.array(100_000, np.int64)),
                           g.const(np.array(1, np.int64))])
    counts = g.op("Add", [g.op("Cast", [g.op("ReduceSum", [huge], keepdims=0)], to=1),
                          g.op("Cast", [g.op("Size", [steps])], to=1)])
    g.op("Add", ["x", counts], name="y")
    model = g.build({"x": [2]}, ["y"])[1]
    assert fold_integer_constants(model) == 0
    assert {n.op_type for n in model.graph} >= {"ConstantOfShape", "Range"}
