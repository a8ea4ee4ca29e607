"""Placement rules, one test each with its negative case: exactly which tensors get FQs, and why not."""

import numpy as np
import pytest

from lpt.calibration.placement import place
from tests.calibration.nets import Net, as_ir


def fqs(proto, ignore=()):
    """({activation tensor: sorted consumer nodes}, {weight tensor: axis}, skipped) of the placement."""
    p = place(as_ir(proto), ignore)
    acts = {q.name: sorted(n.name for n, _ in q.uses) for q in p.activations}
    weights = {q.name: q.axis for q in p.weights}
    return acts, weights, [(s.node, s.op_type, s.reason) for s in p.skipped]


def test_conv_quantizes_its_activation_and_its_weight_per_output_channel():
    n = Net()
    n.conv("x", "y", 3, 4)
    acts, weights, skipped = fqs(n.build({"x": [1, 3, 8, 8]}, ["y"]))
    assert acts == {"x": ["y"]} and weights == {"y.w": 0} and skipped == []


def test_conv_with_a_computed_weight_stays_f32_with_a_reason():
    n = Net()
    n.op("Conv", ["x", "w"], "y")
    acts, weights, skipped = fqs(n.build({"x": [1, 3, 8, 8], "w": [4, 3, 3, 3]}, ["y"]))
    assert acts == {} and weights == {}
    assert skipped == [("y", "Conv", "the weight is not a constant")]


@pytest.mark.parametrize("trans_b, axis", [(1, 0), (0, 1)])
def test_gemm_weight_axis_is_the_output_axis(trans_b, axis):
    n = Net()
    shape = (5, 6) if trans_b else (6, 5)
    n.op("Gemm", ["x", n.weight("w", shape)], "y", transB=trans_b)
    acts, weights, _ = fqs(n.build({"x": [2, 6]}, ["y"]))
    assert acts == {"x": ["y"]} and weights == {"w": axis}


def test_matmul_weight_axis_is_the_last_and_conv_transpose_the_second():
    n = Net()
    m = n.op("MatMul", ["x", n.weight("wm", (3, 8, 4))], "m")
    r = n.op("Reshape", [m, n.const("shape", np.array([1, 3, 8, 4], np.int64))], "r")
    n.inits["shape"] = np.array([1, 3, 8, 4], np.int64)
    n.op("ConvTranspose", [r, n.weight("wt", (3, 2, 3, 3))], "y")
    acts, weights, _ = fqs(n.build({"x": [3, 8, 8]}, ["y"]))
    assert weights == {"wm": 2, "wt": 1}
    assert acts == {"x": ["m"], "m": ["r"]}  # Reshape passes the ConvTranspose's request up to m


def test_fq_goes_after_relu_not_before():
    n = Net()
    c1 = n.conv("x", "c1", 3, 4)
    r = n.op("Relu", [c1], "relu")
    n.conv(r, "y", 4, 4)
    acts, _, _ = fqs(n.build({"x": [1, 3, 8, 8]}, ["y"]))
    assert acts == {"x": ["c1"], "relu": ["y"]}  # nothing on c1, the Relu input


def test_a_model_output_read_by_a_conv_stays_unquantized():
    n = Net()
    c1 = n.conv("x", "c1", 3, 4)
    r = n.op("Relu", [c1], "relu")
    n.conv(r, "y", 4, 4)
    m = as_ir(n.build({"x": [1, 3, 8, 8]}, ["y", "relu"]))
    point = next(p for p in place(m).activations if p.name == "relu")
    assert [n.name for n, _ in point.uses] == ["y"]  # only the Conv reads the FQ; the output "relu" stays f32


def pool_net(extra_reader=False):
    n = Net()
    c = n.conv("x", "conv", 1, 4)
    r = n.op("Relu", [c], "relu")
    p = n.op("MaxPool", [r], "pool", kernel_shape=[2, 2], strides=[2, 2])
    f = n.op("Flatten", [p], "flat")
    n.gemm(f, "y", 64, 5)
    outputs = ["y"]
    if extra_reader:
        n.op("Sigmoid", [p], "side")
        outputs.append("side")
    return n.build({"x": [1, 1, 8, 8]}, outputs)


def test_one_fq_per_branch_through_precision_preserving_ops():
    acts, _, _ = fqs(pool_net())
    assert acts == {"x": ["conv"], "relu": ["pool"]}  # the Relu output serves the Gemm through MaxPool/Flatten


def test_propagation_stops_where_an_f32_op_also_reads_the_tensor():
    acts, _, _ = fqs(pool_net(extra_reader=True))
    assert acts == {"x": ["conv"], "pool": ["flat"]}  # moving above MaxPool would quantize the Sigmoid's input


def test_propagation_stops_at_a_pad_with_a_nonzero_value():
    def net(value):
        n = Net()
        p = n.op("Pad", ["x", n.const("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1])), n.const("v", value)], "pad")
        n.inits["pads"] = np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)
        n.conv(p, "y", 3, 4)
        return n.build({"x": [1, 3, 8, 8]}, ["y"])

    assert fqs(net(0.0))[0] == {"x": ["pad"]}
    assert fqs(net(0.5))[0] == {"pad": ["y"]}


def residual(second_from_conv=True, op="Add"):
    n = Net()
    a = n.op("Relu", [n.conv("x", "a", 3, 4)], "ra")
    b = n.conv("x", "b", 3, 4) if second_from_conv else "x2"
    s = n.op(op, [a, b], "sum")
    n.conv(s, "y", 4, 4)
    return n.build({"x": [1, 3, 8, 8], "x2": [1, 4, 8, 8]} if not second_from_conv else {"x": [1, 3, 8, 8]}, ["y"])


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_add_and_mul_of_two_quantized_branches_quantize_both_inputs(op):
    acts, _, skipped = fqs(residual(op=op))
    assert acts == {"x": ["a", "b"], "ra": ["sum"], "b": ["sum"], "sum": ["y"]}
    assert skipped == []


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_add_and_mul_with_an_unquantized_branch_stay_f32(op):
    acts, _, skipped = fqs(residual(second_from_conv=False, op=op))
    assert acts == {"x": ["a"], "sum": ["y"]}
    assert skipped == [("sum", op, "input 'x2' does not come from a quantized branch")]


def test_a_bias_add_after_a_matmul_keeps_its_output_a_quantized_branch():
    n = Net()
    a = n.op("Add", [n.op("MatMul", ["x", n.weight("wa", (4, 4))], "ma"), n.const("ba", [0.1] * 4)], "a")
    b = n.op("Mul", [n.op("MatMul", ["x", n.weight("wb", (4, 4))], "mb"), n.const("sb", 0.5)], "b")
    n.op("Add", [a, b], "y")
    acts, _, skipped = fqs(n.build({"x": [2, 4]}, ["y"]))
    assert acts == {"x": ["ma", "mb"], "a": ["y"], "b": ["y"]} and skipped == []


def test_a_tanh_gelu_of_a_layer_output_gets_no_fq_pair_inside():
    """0.5·x·(1 + tanh(c·(x + 0.044715·x³))) as jax2tf writes it: x·(k·x), x·that, x + that are
    functions of x alone, so their operands stay f32 (the Add of two layers still gets its pair)."""
    n = Net()
    x = n.op("Add", [n.op("MatMul", ["i", n.weight("w", (4, 4))], "m"), n.const("b", [0.1] * 4)], "x")
    square = n.op("Mul", [x, n.op("Mul", [n.const("k", 0.044715), x], "kx")], "square")
    cube = n.op("Mul", [x, square], "cube")
    inner = n.op("Add", [x, cube], "inner")
    t = n.op("Tanh", [n.op("Mul", [n.const("c", 0.79788456), inner], "scaled")], "t")
    half = n.op("Mul", [n.const("h", 0.5), n.op("Add", [n.const("one", 1.0), t], "plus_one")], "half")
    gelu = n.op("Mul", [x, half], "gelu")
    n.op("Add", [n.op("MatMul", [gelu, n.weight("w2", (4, 4))], "m2"), x], "y")
    acts, _, skipped = fqs(n.build({"i": [2, 4]}, ["y"]))
    assert acts == {"i": ["m"], "gelu": ["m2"], "m2": ["y"], "x": ["y"]}
    reasons = {node: reason for node, _, reason in skipped}
    assert set(reasons) == {"square", "cube", "inner", "gelu"}
    assert reasons["square"].startswith("both inputs are functions of 'm'")  # x = m + b
    assert reasons["gelu"] == "input 'half' does not come from a quantized branch"


def test_add_of_a_bias_constant_is_not_a_candidate():
    n = Net()
    m = n.op("MatMul", ["x", n.weight("w", (4, 3))], "m")
    n.op("Add", [m, n.const("b", [0.1, 0.2, 0.3])], "y")
    acts, weights, skipped = fqs(n.build({"x": [2, 4]}, ["y"]))
    assert acts == {"x": ["m"]} and weights == {"w": 1} and skipped == []


def concat_net(consumer="Conv"):
    n = Net()
    a = n.op("Relu", [n.conv("x", "a", 3, 2)], "ra")
    b = n.op("Relu", [n.conv("x", "b", 3, 2)], "rb")
    c = n.op("Concat", [a, b], "cat", axis=1)
    if consumer == "Conv":
        n.conv(c, "y", 4, 4)
    else:
        n.op("Softmax", [c], "y", axis=1)
    return n.build({"x": [1, 3, 8, 8]}, ["y"])


def test_concat_feeding_a_conv_quantizes_each_input_with_one_shared_range():
    p = place(as_ir(concat_net()))
    acts = {q.name: q for q in p.activations}
    assert sorted(acts) == ["ra", "rb", "x"]  # not "cat": one FQ per input instead
    assert acts["ra"].group is not None and acts["ra"].group == acts["rb"].group
    assert acts["x"].group is None


def test_concat_feeding_only_f32_ops_is_left_alone():
    acts, _, _ = fqs(concat_net(consumer="Softmax"))
    assert acts == {"x": ["a", "b"]}


def test_attention_matmul_quantizes_both_activations():
    n = Net()
    q = n.op("MatMul", ["x", n.weight("wq", (8, 8))], "q")
    k = n.op("MatMul", ["x", n.weight("wk", (8, 8))], "k")
    kt = n.op("Transpose", [k], "kt", perm=[0, 2, 1])
    n.op("MatMul", [q, kt], "scores")
    acts, weights, _ = fqs(n.build({"x": [2, 4, 8]}, ["scores"]))
    assert acts == {"x": ["k", "q"], "q": ["scores"], "k": ["kt"]}  # Transpose passes the request up to k
    assert weights == {"wq": 1, "wk": 1}


def test_an_embedding_table_stays_f32():
    n = Net()
    n.inits["table"] = RNG_TABLE
    e = n.op("Gather", ["table", "tokens"], "emb")
    n.op("MatMul", [e, n.weight("w", (8, 4))], "y")
    from onnx import TensorProto

    proto = n.build({"tokens": [2, 5]}, ["y"])
    proto.graph.input[0].type.tensor_type.elem_type = TensorProto.INT64
    acts, weights, _ = fqs(proto)
    assert acts == {"emb": ["y"]}  # the Gather output, not its table
    assert weights == {"w": 1}


RNG_TABLE = np.random.default_rng(0).normal(size=(17, 8)).astype(np.float32)


@pytest.mark.parametrize("pattern, reason", [
    ("b", "ignored (b)"),
    ("re:^b$", "ignored (re:^b$)"),
    ("Conv", "ignored (Conv)"),
])
def test_ignored_nodes_stay_f32_and_are_reported(pattern, reason):
    acts, weights, skipped = fqs(residual(), ignore=[pattern])
    assert ("b", "Conv", reason) in skipped
    assert "b.w" not in weights
    assert "sum" not in acts or pattern != "Conv"
    if pattern != "Conv":  # Add's second input no longer comes from a quantized branch
        assert ("sum", "Add", "input 'b' does not come from a quantized branch") in skipped


def test_an_ignore_pattern_matching_nothing_changes_nothing(caplog):
    assert fqs(residual(), ignore=["re:nothing"]) == fqs(residual())
    assert "matches no node" in caplog.text
