"""lpt.backend.if_steps: an If whose condition lpt computes runs its branch as a plan of lpt's own."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import lpt
import lpt.backend.plan as plan_module
from lpt.backend.float_steps import BACKEND as FLOAT_BACKEND
from lpt.backend.plan import compile_model
from lpt.errors import DataError
from tests.transformations.builders import Graph


def wake_word_classifier():
    """openWakeWord's tail: score = Sigmoid(Gemm(x)); If(score >= 0.5, then verifier(x) · score, else score).
    The then branch reads an outer input (x), an outer value lpt makes (score) and an outer constant."""
    g = Graph()
    score = g.op("Sigmoid", [g.op("Gemm", [g.fq("x", 0.02, np.uint8(128)), g.weight((1, 6)),
                                          g.const(np.zeros(1, np.float32))], transB=1)], name="score")
    verifier_weight = g.const(g.rng.normal(size=(6, 1)).astype(np.float32), "verifier")
    condition = g.op("Cast", [g.op("GreaterOrEqual", [score, g.const(np.float32(0.5))])], to=TensorProto.BOOL)
    then_branch = helper.make_graph(
        [helper.make_node("MatMul", ["x", verifier_weight], ["verified"]),
         helper.make_node("Mul", ["verified", "score"], ["confirmed"])],
        "then", [], [helper.make_tensor_value_info("confirmed", TensorProto.FLOAT, None)])
    else_branch = helper.make_graph([helper.make_node("Identity", ["score"], ["passed"])], "else", [],
                                    [helper.make_tensor_value_info("passed", TensorProto.FLOAT, None)])
    g.op("If", [condition], name="y", then_branch=then_branch, else_branch=else_branch)
    return g.build({"x": [1, 6]}, ["y"])[1]


def test_the_branch_the_condition_names_runs_with_the_outer_values_it_reads():
    """Both branches met; the same bits as with the If left to onnxruntime, which runs the then branch's
    MatMul and Mul on the same score."""
    model = wake_word_classifier()
    lpt.transform(model)
    plan = compile_model(model, threads=1)
    [step] = [s for s in plan.steps if s.op_types == ("If",)]
    assert step.backend == FLOAT_BACKEND and "onnxruntime" not in {s.backend for s in plan.run_steps}
    original = plan_module.try_if_step
    plan_module.try_if_step = lambda *args, **kwargs: None
    try:
        in_onnxruntime = compile_model(model, threads=1)
    finally:
        plan_module.try_if_step = original
    assert "onnxruntime" in {s.backend for s in in_onnxruntime.steps}
    rng = np.random.default_rng(3)
    taken = set()
    for _ in range(40):
        x = rng.uniform(-2, 2, (1, 6)).astype(np.float32)
        ours = plan.run({"x": x}, keep=True)
        taken.add(bool(ours[step.inputs[0]].reshape(-1)[0]))
        assert np.array_equal(ours["y"], in_onnxruntime.run({"x": x})["y"])
    assert taken == {True, False}


def test_a_condition_of_more_than_one_value_is_a_data_error():
    model = wake_word_classifier()
    lpt.transform(model)
    plan = compile_model(model, threads=1)
    with pytest.raises(DataError, match="condition holds 2 values"):
        plan.run({"x": np.zeros((2, 6), np.float32)})


def test_an_if_whose_branch_holds_integer_ops_runs_on_lpts_plan_with_onnxruntimes_values():
    """A condition given as an input (not lpt's), a branch that quantizes and dequantizes: the If is still
    lpt's step, its branch a plan of its own, with onnxruntime's values for either condition."""
    scale, zero_point = helper.make_tensor("s", TensorProto.FLOAT, [], [0.05]), helper.make_tensor(
        "z", TensorProto.UINT8, [], [128])
    then_branch = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]), helper.make_node("Mul", ["d", "two"], ["doubled"])],
        "then", [], [helper.make_tensor_value_info("doubled", TensorProto.FLOAT, None)], [scale, zero_point])
    else_branch = helper.make_graph([helper.make_node("Identity", ["x"], ["same"])], "else", [],
                                    [helper.make_tensor_value_info("same", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    plan = compile_model(ir.serde.deserialize_model(proto), threads=1)
    assert [s.op_types for s in plan.steps] == [("If",)] and plan.steps[0].backend == "int8 kernel"
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(5).uniform(-3, 3, (2, 3)).astype(np.float32)
    for cond in (True, False):
        feeds = {"x": x, "cond": np.array(cond)}
        assert np.array_equal(plan.run(feeds)["y"], session.run(None, feeds)[0])


def squeezing_if(g: Graph, x: str, axis: int, name: str | None = None) -> str:
    """x.squeeze(axis) as a scripted PyTorch model exports it: If(Shape(x)[axis] == 1, Squeeze, Identity)."""
    size = g.op("Gather", [g.op("Shape", [x]), g.const(np.array([axis], np.int64))], axis=0)
    condition = g.op("Equal", [size, g.const(np.array([1], np.int64))])
    axes = g.const(np.array([axis], np.int64))
    then_branch = helper.make_graph([helper.make_node("Squeeze", [x, axes], ["squeezed"])], "then", [],
                                    [helper.make_tensor_value_info("squeezed", TensorProto.FLOAT, None)])
    else_branch = helper.make_graph([helper.make_node("Identity", [x], ["kept"])], "else", [],
                                    [helper.make_tensor_value_info("kept", TensorProto.FLOAT, None)])
    return g.op("If", [condition], name=name, then_branch=then_branch, else_branch=else_branch)


def test_a_squeezing_if_and_the_mean_after_it_run_in_the_native_program():
    """silero_vad_16k_op15's tail: a 1×1 convolution into one channel, Sigmoid, squeezed along that channel by an
    If, the mean over axis 1 (of a tensor whose rank the graph does not give), then an Unsqueeze."""
    g = Graph()
    conv = g.op("Conv", [g.fq("x", 0.02, np.uint8(128)), g.weight((1, 4, 1))])
    mean = g.op("ReduceMean", [squeezing_if(g, g.op("Sigmoid", [conv]), 1)], axes=[1], keepdims=0)
    g.op("Unsqueeze", [mean, g.const(np.array([1], np.int64))], name="y")
    fq_model = g.build({"x": ["N", 4, "T"]}, ["y"], checked=False)[1]  # the If's output has no one rank
    model = lpt.clone(fq_model)
    lpt.transform(model)
    plan = compile_model(model, threads=1)
    assert "onnxruntime" not in {s.backend for s in plan.steps}
    [squeeze] = [s for s in plan.steps if "If" in s.op_types]
    assert squeeze.op_types == ("Shape", "Gather", "Equal", "If") and squeeze.native == ("squeeze_ones", (1,))
    if lpt.native.available():
        [program] = plan.run_steps
    x = np.random.default_rng(4).uniform(-2, 2, (2, 4, 7)).astype(np.float32)
    ours = plan.run({"x": x})["y"]
    assert ours.shape == (2, 1)
    if lpt.native.available():
        assert program.run.native, "the program gave way to its steps"
    np.testing.assert_array_equal(ours, compile_model(model, native=False).run({"x": x})["y"])
    np.testing.assert_allclose(ours, lpt.crosscheck.run_onnxruntime(fq_model, {"x": x})["y"], atol=2e-3)


def test_a_squeezing_if_passes_a_longer_axis_on():
    g = Graph()
    conv = g.op("Conv", [g.fq("x", 0.02, np.uint8(128)), g.weight((3, 4, 1))])
    squeezing_if(g, g.op("Relu", [conv]), -1, name="y")
    fq_model = g.build({"x": ["N", 4, "T"]}, ["y"], checked=False)[1]
    model = lpt.clone(fq_model)
    lpt.transform(model)
    plan = compile_model(model, threads=1)
    assert "onnxruntime" not in {s.backend for s in plan.steps}
    rng = np.random.default_rng(5)
    for length, shape in ((1, (2, 3)), (5, (2, 3, 5)), (1, (2, 3))):
        x = rng.uniform(-2, 2, (2, 4, length)).astype(np.float32)
        ours = plan.run({"x": x})["y"]
        assert ours.shape == shape
        np.testing.assert_array_equal(ours, compile_model(model, native=False).run({"x": x})["y"])
        np.testing.assert_allclose(ours, lpt.crosscheck.run_onnxruntime(fq_model, {"x": x})["y"], atol=0.021)
    if lpt.native.available():
        [program] = plan.run_steps
        assert program.run.native, "the program gave way to its steps"


def test_an_if_whose_condition_is_read_elsewhere_is_no_squeeze():
    g = Graph()
    conv = g.op("Conv", [g.fq("x", 0.02, np.uint8(128)), g.weight((3, 4, 1))])
    y = squeezing_if(g, g.op("Relu", [conv]), -1, name="y")
    condition = next(n for n in g.nodes if n.op_type == "If").input[0]
    g.op("Cast", [condition], name="c", to=TensorProto.FLOAT)
    model = g.build({"x": ["N", 4, "T"]}, [y, "c"], checked=False)[1]
    lpt.transform(model)
    assert not any(s.native == ("squeeze_ones", (-1,)) for s in compile_model(model).steps)
