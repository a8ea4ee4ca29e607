"""lpt.graph.specialize: a graph for one set of input shapes, the Ifs those shapes decide inlined."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from lpt.graph.specialize import specialize

F = TensorProto.FLOAT


def _branch(name, nodes, output, initializers=()):
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(output, F, None)], list(initializers))


def _model(nodes, inputs, outputs=("y",), initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, None) for n in inputs],
                              [helper.make_tensor_value_info(n, F, None) for n in outputs], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def squeeze_if_model():
    """PyTorch's scripted x.squeeze(0), then a rank test inside the squeezed branch, as silero_vad's decoder has:
    y = Relu(If(x.shape[0] == 1, If(rank(squeezed) == 2, Unsqueeze(squeezed, 0)·2, squeezed), x))."""
    inner = helper.make_node(
        "If", ["is_rank_2"], ["restored"],
        then_branch=_branch("rank2", [helper.make_node("Unsqueeze", ["squeezed", "axis0"], ["unsq"]),
                                      helper.make_node("Mul", ["unsq", "two"], ["restored_then"])], "restored_then",
                            [numpy_helper.from_array(np.float32(2), "two")]),
        else_branch=_branch("other", [helper.make_node("Identity", ["squeezed"], ["restored_else"])], "restored_else"))
    then_branch = _branch("squeeze", [
        helper.make_node("Squeeze", ["x", "axis0"], ["squeezed"]),
        helper.make_node("Shape", ["squeezed"], ["squeezed_shape"]),
        helper.make_node("Size", ["squeezed_shape"], ["rank"]),
        helper.make_node("Equal", ["rank", "two_dims"], ["is_rank_2"]),
        inner], "restored")
    else_branch = _branch("keep", [helper.make_node("Identity", ["x"], ["kept"])], "kept")
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["first"], axis=0),
             helper.make_node("Equal", ["first", "one"], ["is_one"]),
             helper.make_node("If", ["is_one"], ["chosen"], then_branch=then_branch, else_branch=else_branch),
             helper.make_node("Relu", ["chosen"], ["y"])]
    return _model(nodes, ["x"], initializers=[_ints("zero", 0), _ints("one", 1), _ints("axis0", [0]),
                                              _ints("two_dims", 2)])


def _run(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_the_ifs_the_shapes_decide_are_inlined_with_the_same_values():
    model = squeeze_if_model()
    before = model.SerializeToString()
    rng = np.random.default_rng(0)
    for shape, ops in (((1, 3, 4), {"Squeeze": 1, "Unsqueeze": 1, "Mul": 1, "Relu": 1}),  # both Ifs' then branches
                       ((1, 3), {"Squeeze": 1, "Relu": 1}),  # squeezed to rank 1: the inner If's else branch
                       ((2, 3, 4), {"Relu": 1})):  # kept as it is
        x = rng.normal(size=shape).astype(np.float32)
        specialized = specialize(model, {"x": shape})
        assert Counter(n.op_type for n in specialized.graph.node) == ops  # no If, Shape, Identity left
        [expected], [got] = _run(model, {"x": x}), _run(specialized, {"x": x})
        assert got.shape == expected.shape and np.array_equal(got, expected)
    assert model.SerializeToString() == before  # the model given is not changed


def test_an_if_on_values_stays():
    """A condition the data decides (the sum's sign) is no constant for any shape: the If stays, and with it what
    it reads."""
    then_branch = _branch("pos", [helper.make_node("Neg", ["x"], ["negated"])], "negated")
    else_branch = _branch("neg", [helper.make_node("Identity", ["x"], ["same"])], "same")
    model = _model([helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
                    helper.make_node("Greater", ["total", "zero"], ["positive"]),
                    helper.make_node("If", ["positive"], ["y"], then_branch=then_branch, else_branch=else_branch)],
                   ["x"], initializers=[numpy_helper.from_array(np.float32(0), "zero")])
    specialized = specialize(model, {"x": (2, 3)})
    assert [n.op_type for n in specialized.graph.node] == ["ReduceSum", "Greater", "If"]
    for sign in (1, -1):
        x = np.full((2, 3), sign, np.float32)
        assert np.array_equal(_run(specialized, {"x": x})[0], _run(model, {"x": x})[0])


def test_constant_arithmetic_is_folded_and_what_nothing_reads_dropped():
    """An LSTM's weights as PyTorch exports them (slices of one tensor, concatenated in another gate order): one
    initializer after; the initializers only those slices read are gone."""
    weights = np.arange(24, dtype=np.float32).reshape(6, 4)
    nodes = [helper.make_node("Slice", ["w", "s0", "s1", "axis0"], ["first"]),
             helper.make_node("Slice", ["w", "s1", "s2", "axis0"], ["second"]),
             helper.make_node("Concat", ["second", "first"], ["reordered"], axis=0),
             helper.make_node("MatMul", ["x", "reordered_t"], ["y"]),
             helper.make_node("Transpose", ["reordered"], ["reordered_t"])]
    nodes = [nodes[0], nodes[1], nodes[2], nodes[4], nodes[3]]
    model = _model(nodes, ["x"], initializers=[numpy_helper.from_array(weights, "w"), _ints("s0", [0]),
                                               _ints("s1", [2]), _ints("s2", [6]), _ints("axis0", [0])])
    specialized = specialize(model, {"x": (1, 4)})
    assert [n.op_type for n in specialized.graph.node] == ["MatMul"]
    [folded] = specialized.graph.initializer
    assert np.array_equal(numpy_helper.to_array(folded), np.concatenate([weights[2:], weights[:2]]).T)
    x = np.ones((1, 4), np.float32)
    assert np.array_equal(_run(specialized, {"x": x})[0], _run(model, {"x": x})[0])


def test_a_branch_whose_names_clash_with_the_graphs_is_not_inlined():
    """A branch value named as an outer one (onnx forbids it, an exporter may not care): inlining it would give
    one name two values, so the If stays, and still runs right."""
    then_branch = _branch("then", [helper.make_node("Neg", ["x"], ["t"])], "t")
    else_branch = _branch("else", [helper.make_node("Identity", ["x"], ["e"])], "e")
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Size", ["shape"], ["rank"]),
             helper.make_node("Equal", ["rank", "two"], ["is_two"]),
             helper.make_node("If", ["is_two"], ["chosen"], then_branch=then_branch, else_branch=else_branch),
             helper.make_node("Relu", ["chosen"], ["t0"]),
             helper.make_node("Add", ["t0", "chosen"], ["y"])]
    model = _model(nodes, ["x"], initializers=[_ints("two", 2)])
    model.graph.node[4].output[0] = "t"  # the outer graph's Relu now makes "t", as the then branch's Neg does
    model.graph.node[5].input[0] = "t"
    specialized = specialize(model, {"x": (2, 3)})
    assert "If" in [n.op_type for n in specialized.graph.node]
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 3
    assert np.array_equal(_run(specialized, {"x": x})[0], np.maximum(-x, 0) - x)
