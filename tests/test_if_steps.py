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
