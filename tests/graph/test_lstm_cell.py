"""lpt.graph.lstm_cell: an LSTM written out as its cells' ops computes what onnxruntime's LSTM does."""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from lpt.graph.lstm_cell import unroll_lstms

F = TensorProto.FLOAT
ALL_OUTPUTS, STATES_ONLY, SEQUENCE_ONLY = ("Y", "Y_h", "Y_c"), ("", "Y_h", "Y_c"), ("Y",)


def lstm_model(seq=2, batch=1, input_size=3, hidden=4, *, bias=True, initial_h=True, initial_c=True,
               outputs=ALL_OUTPUTS, opset=15, directions=1, peepholes=False, sequence_lens=False,
               weights_as_input=False, x_dims=None, seed=0, **attributes):
    """A graph of one LSTM node named "lstm" reading X (and h0, c0 where asked) and the graph's outputs its
    outputs; its weights ~N(0, 0.3), seeded. The model and feeds ~N(0, 1) for its inputs."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape, scale=0.3: rng.normal(0, scale, shape).astype(np.float32)  # noqa: E731
    constants = {"W": normal(directions, 4 * hidden, input_size), "R": normal(directions, 4 * hidden, hidden)}
    if bias:
        constants["B"] = normal(directions, 8 * hidden)
    if peepholes:
        constants["P"] = normal(directions, 3 * hidden)
    if sequence_lens:
        constants["lens"] = np.full(batch, seq, np.int32)
    feeds = {"X": normal(seq, batch, input_size, scale=1.0)}
    state_shape = (directions, batch, hidden)
    if initial_h:
        feeds["h0"] = normal(*state_shape, scale=1.0)
    if initial_c:
        feeds["c0"] = normal(*state_shape, scale=1.0)
    if weights_as_input:
        feeds["W"] = constants.pop("W")
    names = ["X", "W", "R", "B" if bias else "", "lens" if sequence_lens else "", "h0" if initial_h else "",
             "c0" if initial_c else "", "P" if peepholes else ""]
    while names[-1] == "":
        names.pop()
    node = helper.make_node("LSTM", names, list(outputs), name="lstm", hidden_size=hidden, **attributes)
    inputs = [helper.make_tensor_value_info(name, F, x_dims if name == "X" and x_dims else array.shape)
              for name, array in feeds.items()]
    output_shapes = {"Y": [seq, *state_shape], "Y_h": state_shape, "Y_c": state_shape}
    graph = helper.make_graph([node], "lstm", inputs,
                              [helper.make_tensor_value_info(n, F, output_shapes[n]) for n in outputs if n],
                              [numpy_helper.from_array(array, name) for name, array in constants.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), feeds


def run(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def assert_same_outputs(before: onnx.ModelProto, after: onnx.ModelProto, feeds: dict) -> None:
    expected, actual = run(before, feeds), run(after, feeds)
    assert list(actual) == list(expected)
    for name in expected:
        assert actual[name].shape == expected[name].shape, name
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


def assert_unrolled(model: onnx.ModelProto, feeds: dict, **options) -> onnx.ModelProto:
    unrolled, count = unroll_lstms(model, **options)
    assert count == 1
    assert "LSTM" not in {node.op_type for node in unrolled.graph.node}
    onnx.checker.check_model(unrolled, full_check=True)  # one producer per name, types that fit
    assert_same_outputs(model, unrolled, feeds)
    return unrolled


STATES = [  # (B, h0, c0): a missing state is zeros, which the first step leaves out
    pytest.param(True, True, True, id="B-h0-c0"),
    pytest.param(False, False, False, id="no-B-no-states"),
    pytest.param(True, False, False, id="B-no-states"),
    pytest.param(False, True, True, id="no-B-h0-c0"),
    pytest.param(True, True, False, id="B-h0-only"),
    pytest.param(True, False, True, id="B-c0-only"),
]
SIZES = [  # (batch, input, hidden)
    pytest.param(1, 1, 1, id="b1-i1-h1"),
    pytest.param(3, 5, 4, id="b3-i5-h4"),
    pytest.param(1, 16, 16, id="b1-i16-h16"),
]


@pytest.mark.parametrize("bias, initial_h, initial_c", STATES)
@pytest.mark.parametrize("batch, input_size, hidden", SIZES)
@pytest.mark.parametrize("seq", [1, 2, 3])
def test_the_cells_compute_what_the_lstm_does(seq, batch, input_size, hidden, bias, initial_h, initial_c):
    model, feeds = lstm_model(seq, batch, input_size, hidden, bias=bias, initial_h=initial_h, initial_c=initial_c,
                              seed=seq * 100 + batch * 10 + hidden)
    assert_unrolled(model, feeds)


@pytest.mark.parametrize("outputs", [pytest.param(ALL_OUTPUTS, id="Y-Y_h-Y_c"), pytest.param(STATES_ONLY, id="Y_h-Y_c"),
                                     pytest.param(SEQUENCE_ONLY, id="Y")])
@pytest.mark.parametrize("opset", [11, 13, 15])  # Squeeze and Unsqueeze take their axes as an input from 13
@pytest.mark.parametrize("seq", [1, 3])
def test_only_the_outputs_named_are_made_in_each_opset(seq, opset, outputs):
    model, feeds = lstm_model(seq, batch=3, input_size=5, hidden=16, outputs=outputs, opset=opset)
    unrolled = assert_unrolled(model, feeds)
    assert [o.name for o in unrolled.graph.output] == [n for n in outputs if n]


def test_a_cell_is_sixteen_ops_and_the_weights_are_replaced():
    """Per step Gather, Concat, MatMul, Add, Slice, Sigmoid, Slice, Tanh, Slice i, Mul, Slice f, Mul, Add,
    Slice o, Tanh, Mul; before them a Squeeze each of h0 and c0, after them an Unsqueeze for Y_h."""
    model, feeds = lstm_model(seq=2, outputs=("", "Y_h"))
    unrolled = assert_unrolled(model, feeds)
    assert len(unrolled.graph.node) == 2 + 2 * 16 + 1
    assert Counter(n.op_type for n in unrolled.graph.node) == Counter(
        Squeeze=2, Gather=2, Concat=2, MatMul=2, Add=4, Slice=10, Sigmoid=2, Tanh=4, Mul=6, Unsqueeze=1)
    assert not {"W", "R", "B"} & {t.name for t in unrolled.graph.initializer}


def test_a_first_step_without_states_leaves_out_what_zeros_give():
    """h0 absent: x_0 · Wᵀ, no Concat; c0 absent: c = i⊙z, no Slice f, Mul f⊙c or Add."""
    model, feeds = lstm_model(seq=1, bias=False, initial_h=False, initial_c=False, outputs=("", "Y_h"))
    unrolled = assert_unrolled(model, feeds)
    assert [n.op_type for n in unrolled.graph.node] == [
        "Squeeze", "MatMul", "Slice", "Sigmoid", "Slice", "Tanh", "Slice", "Mul", "Slice", "Tanh", "Mul", "Unsqueeze"]


@pytest.mark.parametrize("scale, concatenated", [pytest.param(0.0, False, id="zeros"),
                                                 pytest.param(1.0, True, id="values")])
def test_constant_states_of_zeros_are_left_out(scale, concatenated):
    model, feeds = lstm_model(seq=1)
    graph = model.graph
    for name in ("h0", "c0"):
        graph.initializer.append(numpy_helper.from_array(feeds.pop(name) * np.float32(scale), name))
    kept_inputs = [v for v in graph.input if v.name == "X"]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    unrolled = assert_unrolled(model, feeds)
    assert ("Concat" in {n.op_type for n in unrolled.graph.node}) is concatenated
    assert ({"h0", "c0"} <= {t.name for t in unrolled.graph.initializer}) is concatenated


def test_weights_another_node_reads_are_kept():
    model, feeds = lstm_model(outputs=("", "Y_h"))
    model.graph.node.append(helper.make_node("Identity", ["W"], ["W_copy"]))
    model.graph.output.append(helper.make_tensor_value_info("W_copy", F, [1, 16, 3]))
    unrolled = assert_unrolled(model, feeds)
    assert {t.name for t in unrolled.graph.initializer} >= {"W"}
    assert not {"R", "B"} & {t.name for t in unrolled.graph.initializer}


def test_names_the_graph_has_already_are_not_taken():
    """Values, initializers and nodes named as the new ones would be, read after the LSTM and by it."""
    model, feeds = lstm_model(seq=2, outputs=ALL_OUTPUTS)
    graph = model.graph
    graph.initializer.append(numpy_helper.from_array(np.float32([2.0]), "lstm/B"))
    taken = ["lstm/W_R", "lstm/gates0", "lstm/x_h1", "lstm/ints_0", "lstm/int_1", "lstm/h0/squeezed"]
    graph.node[0].input[0] = taken[-1]  # the LSTM reads X through a chain of Identities named as below
    for position, (source, name) in enumerate(zip(["X", *taken], taken)):
        graph.node.insert(position, helper.make_node("Identity", [source], [name], name=f"lstm/Gather_x{position}"))
    graph.node.append(helper.make_node("Mul", ["Y_h", "lstm/B"], ["scaled"], name="lstm/Mul_h1"))
    graph.output.append(helper.make_tensor_value_info("scaled", F, [1, 1, 4]))
    graph.output.extend(helper.make_tensor_value_info(n, F, [2, 1, 3]) for n in taken)
    onnx.checker.check_model(model)
    unrolled = assert_unrolled(model, feeds)
    assert numpy_helper.to_array(next(t for t in unrolled.graph.initializer if t.name == "lstm/B")) == 2.0


def test_the_model_given_is_not_modified():
    model, _ = lstm_model()
    before = model.SerializeToString()
    _, count = unroll_lstms(model)
    assert count == 1
    assert model.SerializeToString() == before


@pytest.mark.parametrize("options, reason", [
    pytest.param(dict(direction="reverse"), "direction reverse", id="reverse"),
    pytest.param(dict(direction="bidirectional", directions=2), "direction bidirectional", id="bidirectional"),
    pytest.param(dict(clip=3.0), "clip is set", id="clip"),
    pytest.param(dict(activations=["HardSigmoid", "Tanh", "Tanh"]), "not ONNX's defaults", id="activations"),
    pytest.param(dict(peepholes=True), "peepholes", id="peepholes"),
    pytest.param(dict(sequence_lens=True), "sequence_lens", id="sequence_lens"),
    pytest.param(dict(seq=3, max_steps=2), "3 steps, more than 2 or none", id="too-many-steps"),
    pytest.param(dict(weights_as_input=True), "no initializer", id="W-a-graph-input"),
    pytest.param(dict(x_dims=["seq", 1, 3]), "not [seq, batch, input] of numbers", id="symbolic-seq"),
    pytest.param(dict(opset=9), "opset 9", id="opset-9"),
])
def test_what_is_not_unrolled_stays_and_says_why(options, reason, caplog):
    max_steps = options.pop("max_steps", 8)
    model, feeds = lstm_model(**options)
    with caplog.at_level(logging.DEBUG, logger="lpt.graph.lstm_cell"):
        unrolled, count = unroll_lstms(model, max_steps=max_steps)
    assert count == 0
    assert unrolled.SerializeToString() == model.SerializeToString()
    assert reason in caplog.text
    run(unrolled, feeds)  # a model onnxruntime runs: the case is a real one


def test_silero_vads_decoder_cell():
    """One step, batch 1, 128 inputs and hidden units, both states given, Y and the states read."""
    model, feeds = lstm_model(seq=1, batch=1, input_size=128, hidden=128, seed=7)
    assert_unrolled(model, feeds)
