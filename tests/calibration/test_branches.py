"""lpt.calibration.branches: the layers inside an If's branches are calibrated, each branch as a model of its own."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper

import lpt
from lpt.graph.fake_quantize_op import is_fake_quantize
from lpt.model_io import to_proto

RNG = np.random.default_rng(11)


def gated_network(by_mean: bool = False, relu: bool = True):
    """If(sr == 16000, Conv → Relu → Conv on Relu(x), Conv on Relu(x)): silero_vad's shape, each branch a network
    reading an outer value the outer graph computes (h = Relu(x)) and an outer constant (the shared weight w).
    `by_mean`: the condition is mean(x) > 0 instead, which each batch decides; without `relu` the branches read
    the input (then named h) itself."""
    def conv(name, x, w, y):
        return helper.make_node("Conv", [x, w], [y], name=name, pads=[1, 1])

    then_branch = helper.make_graph(
        [conv("then/conv1", "h", "w", "a"), helper.make_node("Relu", ["a"], ["r"], name="then/relu"),
         conv("then/conv2", "r", "w2", "then_y")],
        "then", [], [helper.make_tensor_value_info("then_y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w2", TensorProto.FLOAT, [4, 4, 3], RNG.normal(0, 0.3, 48).astype(np.float32))])
    else_branch = helper.make_graph([conv("else/conv", "h", "w", "else_y")], "else", [],
                                    [helper.make_tensor_value_info("else_y", TensorProto.FLOAT, None)])
    x = "x" if relu else "h"
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu")] if relu else []
    nodes += [helper.make_node("ReduceMean", [x], ["mean"], name="mean", keepdims=0),
             helper.make_node("Greater", ["mean", "zero"], ["is_16k"], name="positive") if by_mean else
             helper.make_node("Equal", ["sr", "rate"], ["is_16k"], name="equal"),
             helper.make_node("If", ["is_16k"], ["y"], name="gate", then_branch=then_branch, else_branch=else_branch)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", 4, 16]),
                     helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("rate", TensorProto.INT64, [], [16000]), helper.make_tensor("zero", TensorProto.FLOAT, [], [0]),
         helper.make_tensor("w", TensorProto.FLOAT, [4, 4, 3], RNG.normal(0, 0.3, 48).astype(np.float32))])
    return ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def samples(rate: int, n: int = 16, x: str = "x") -> dict[str, np.ndarray]:
    return {x: RNG.normal(0, 1, (n, 4, 16)).astype(np.float32), "sr": np.array(rate, np.int64)}


def branch_fake_quantizes(model: ir.Model, name: str) -> list[ir.Node]:
    [gate] = [n for n in model.graph if n.op_type == "If"]
    return [n for n in ir.traversal.RecursiveGraphIterator(gate.attributes[name].value) if is_fake_quantize(n)]


def test_the_branch_the_samples_take_is_fake_quantized_and_the_other_is_reported_f32():
    result = lpt.calibrate(gated_network(), samples(16000), quiet=True)
    # conv1 and conv2: an activation and a weight each; the else branch's conv is never run on the data
    assert len(branch_fake_quantizes(result.model, "then_branch")) == 4
    assert branch_fake_quantizes(result.model, "else_branch") == []
    assert not any(is_fake_quantize(n) for n in result.model.graph)  # the outer graph has no layer
    assert {t.tensor for t in result.report.tensors} == {"h", "w", "r", "w2"}
    [untaken] = [s for s in result.report.left_f32 if s.node == "gate/else_branch"]
    assert "no calibration sample takes this branch" in untaken.reason
    # the outer values the branch reads are the outer graph's again (no input of a branch's own)
    [gate] = [n for n in result.model.graph if n.op_type == "If"]
    assert len(gate.attributes["then_branch"].value.inputs) == 0


def test_the_ranges_in_a_branch_are_the_ones_its_own_values_take():
    """h's range is its values on the 16 kHz samples: Relu(x), from 0 to max(x) (minmax, per tensor)."""
    data = samples(16000)
    result = lpt.calibrate(gated_network(), data, quiet=True)
    [h] = [t for t in result.report.tensors if t.tensor == "h"]
    assert h.low == 0.0 and np.isclose(h.high, float(data["x"].max()), rtol=1e-6)


def test_the_fake_quantized_model_runs_in_onnxruntime_and_on_lpt_close_to_fp32_for_both_rates():
    model = gated_network()
    result = lpt.calibrate(model, samples(16000), quiet=True)
    portable = to_proto(lpt.to_portable(result.model))
    fq_session = ort.InferenceSession(portable.SerializeToString(), providers=["CPUExecutionProvider"])
    fp32_session = ort.InferenceSession(to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    int8_model = lpt.clone(result.model)
    lpt.transform(int8_model)
    plan = lpt.compile_model(int8_model, threads=1)
    [step] = [s for s in plan.steps if s.op_types == ("If",)]
    assert step.backend == "int8 kernel"  # the calibrated branch holds integer ops: lpt's plan runs it
    assert sum(plan.engine_counts().values()) == 2  # conv1 and conv2, in the branch's plan
    for rate in (16000, 8000):
        feeds = samples(rate, 4)
        expected = fp32_session.run(None, feeds)[0]
        fake_quantized = fq_session.run(None, feeds)[0]
        ours = plan.run(feeds)["y"]
        if rate == 16000:  # quantized: near fp32, and lpt's integers as onnxruntime's FQ model within a step
            assert not np.array_equal(fake_quantized, expected)
            assert np.abs(fake_quantized - expected).max() < 0.1 * np.abs(expected).max()
            assert np.abs(ours - fake_quantized).max() < 0.02 * np.abs(expected).max()
        else:  # the branch left f32: the fp32 values
            assert np.allclose(fake_quantized, expected, rtol=1e-5, atol=1e-6)
            assert np.allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_both_branches_are_calibrated_when_the_batches_take_both():
    positive, negative = (RNG.normal(shift, 1, (32, 4, 16)).astype(np.float32) for shift in (2, -2))
    batches = [{"x": positive, "sr": np.array(16000)}, {"x": negative, "sr": np.array(16000)}]
    result = lpt.calibrate(gated_network(by_mean=True), batches, quiet=True)
    assert len(branch_fake_quantizes(result.model, "then_branch")) == 4
    assert len(branch_fake_quantizes(result.model, "else_branch")) == 2
    assert not [s for s in result.report.left_f32 if s.node.startswith("gate/")]


def test_the_condition_on_a_fixed_scalar_input_is_computed_once_per_value():
    """Equal(sr, 16000) in a plan with steps of lpt's: an onnxruntime region remembered by sr's value."""
    from lpt.backend.shape_steps import Remembered

    result = lpt.calibrate(gated_network(relu=False), samples(16000, x="h"), quiet=True)
    int8_model = lpt.clone(result.model)
    lpt.transform(int8_model)
    plan = lpt.compile_model(int8_model, threads=1)
    [equal] = [s for s in plan.steps if s.op_types == ("Equal",)]
    assert isinstance(equal.run, Remembered) and equal.run.by_value
    runs = [plan.run(samples(rate, 2, x="h"))["y"] for rate in (16000, 16000, 8000, 16000)]
    assert equal.run.computed == 2 and all(r.shape == (2, 4, 16) for r in runs)
    assert [bool(v[0]) for v in equal.run.results.values()] == [True, False]  # 16000, then 8000
