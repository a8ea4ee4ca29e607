"""conv1d_as_matmul: a Transpose → one-tap Conv → Transpose (tf2onnx's Conv1D) becomes a MatMul in a region's
session."""

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from lpt.backend import fallback
from lpt.backend.conv1d_as_matmul import conv1d_as_matmul

RNG = np.random.default_rng(7)
SWAP = dict(perm=[0, 2, 1])


def conv1d_model(nodes, initializers, outputs=("y",), length=30, channels=12):
    source = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, length, channels])
    graph = helper.make_graph(nodes, "g", [source],
                              [onnx.ValueInfoProto(name=name) for name in outputs],
                              [numpy_helper.from_array(a, name) for name, a in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def weights(out_channels=5, channels=12, taps=1):
    return RNG.standard_normal((out_channels, channels, taps)).astype(np.float32)


def run(proto, x):
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def op_types(proto):
    return [node.op_type for node in proto.graph.node]


def test_a_conv1d_with_bias_becomes_a_matmul_and_an_add_of_the_same_values():
    nodes = [helper.make_node("Transpose", ["x"], ["t"], **SWAP),
             helper.make_node("Conv", ["t", "w", "b"], ["c"], kernel_shape=[1]),
             helper.make_node("Transpose", ["c"], ["u"], **SWAP),
             helper.make_node("Relu", ["u"], ["y"])]
    before = conv1d_model(nodes, {"w": weights(), "b": RNG.standard_normal(5).astype(np.float32)})
    after = conv1d_as_matmul(before)
    assert op_types(after) == ["MatMul", "Add", "Relu"]
    assert "w" not in {t.name for t in after.graph.initializer}  # onnxruntime would warn of it, unread
    assert op_types(before) == ["Transpose", "Conv", "Transpose", "Relu"]  # the model itself is left alone
    x = RNG.standard_normal((2, 30, 12)).astype(np.float32)
    expected, = run(before, x)
    ours, = run(after, x)
    assert ours.shape == (2, 30, 5)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_two_conv1ds_of_one_source_share_it_and_drop_its_transposes():
    """dnsmos_sig_bak_ovr's STFT: a cosine and a sine product of the same frames, each behind a Transpose of its own."""
    nodes = [helper.make_node("Transpose", ["x"], ["t1"], **SWAP), helper.make_node("Transpose", ["x"], ["t2"], **SWAP),
             helper.make_node("Conv", ["t1", "w1"], ["c1"], auto_pad="VALID", dilations=[1], group=1),
             helper.make_node("Conv", ["t2", "w2"], ["c2"], strides=[1], pads=[0, 0]),
             helper.make_node("Transpose", ["c1"], ["y1"], **SWAP),
             helper.make_node("Transpose", ["c2"], ["y2"], **SWAP)]
    before = conv1d_model(nodes, {"w1": weights(7), "w2": weights(3)}, outputs=("y1", "y2"))
    after = conv1d_as_matmul(before)
    assert op_types(after) == ["MatMul", "MatMul"]
    assert [list(n.input)[0] for n in after.graph.node] == ["x", "x"]
    x = RNG.standard_normal((2, 30, 12)).astype(np.float32)
    for ours, expected in zip(run(after, x), run(before, x)):
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_conv1ds_that_are_not_one_products_stay_convs():
    cases = {
        "three taps": (dict(kernel_shape=[3]), weights(taps=3)),
        "stride 2": (dict(strides=[2]), weights()),
        "padded": (dict(pads=[1, 1]), weights()),
        "two groups": (dict(group=2), weights(channels=6)),
    }
    for why, (attributes, w) in cases.items():
        nodes = [helper.make_node("Transpose", ["x"], ["t"], **SWAP),
                 helper.make_node("Conv", ["t", "w"], ["c"], **attributes),
                 helper.make_node("Transpose", ["c"], ["y"], **SWAP)]
        before = conv1d_model(nodes, {"w": w})
        assert conv1d_as_matmul(before) is before, why


def test_a_conv_whose_output_or_source_is_read_elsewhere_keeps_what_is_read():
    x = RNG.standard_normal((2, 30, 12)).astype(np.float32)
    # the Conv's own output also a graph output: nothing to gain, it stays
    nodes = [helper.make_node("Transpose", ["x"], ["t"], **SWAP), helper.make_node("Conv", ["t", "w"], ["c"]),
             helper.make_node("Transpose", ["c"], ["y"], **SWAP)]
    before = conv1d_model(nodes, {"w": weights()}, outputs=("y", "c"))
    assert conv1d_as_matmul(before) is before
    # a Transpose of another perm after it
    nodes = [helper.make_node("Transpose", ["x"], ["t"], **SWAP), helper.make_node("Conv", ["t", "w"], ["c"]),
             helper.make_node("Transpose", ["c"], ["y"], perm=[1, 0, 2])]
    before = conv1d_model(nodes, {"w": weights()})
    assert conv1d_as_matmul(before) is before
    # the first Transpose read by another node too: it stays for that one
    nodes = [helper.make_node("Transpose", ["x"], ["t"], **SWAP), helper.make_node("Conv", ["t", "w"], ["c"]),
             helper.make_node("Transpose", ["c"], ["y"], **SWAP), helper.make_node("Neg", ["t"], ["z"])]
    before = conv1d_model(nodes, {"w": weights()}, outputs=("y", "z"))
    after = conv1d_as_matmul(before)
    assert op_types(after) == ["Transpose", "MatMul", "Neg"]
    for ours, expected in zip(run(after, x), run(before, x)):
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_weights_a_subgraph_reads_stay():
    branch = helper.make_graph([helper.make_node("Identity", ["w"], ["out"])], "branch", [],
                               [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Transpose", ["x"], ["t"], **SWAP), helper.make_node("Conv", ["t", "w"], ["c"]),
             helper.make_node("Transpose", ["c"], ["y"], **SWAP),
             helper.make_node("If", ["flag"], ["z"], then_branch=branch, else_branch=branch)]
    before = conv1d_model(nodes, {"w": weights(), "flag": np.array(True)}, outputs=("y", "z"))
    after = conv1d_as_matmul(before)
    assert op_types(after) == ["MatMul", "If"]
    assert "w" in {t.name for t in after.graph.initializer}
    x = RNG.standard_normal((2, 30, 12)).astype(np.float32)
    for ours, expected in zip(run(after, x), run(before, x)):
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_a_region_runs_its_conv1d_as_a_matmul(monkeypatch):
    nodes = [helper.make_node("Transpose", ["x"], ["t"], **SWAP), helper.make_node("Conv", ["t", "w"], ["c"]),
             helper.make_node("Transpose", ["c"], ["y"], **SWAP)]
    proto = conv1d_model(nodes, {"w": weights()})
    model = ir.serde.deserialize_model(proto)
    sessions = []
    session = fallback._session
    monkeypatch.setattr(fallback, "_session", lambda p, *a, **k: sessions.append(op_types(p)) or session(p, *a, **k))
    constants = {"w": numpy_helper.to_array(proto.graph.initializer[0])}
    runner = fallback.RegionRunner(list(model.graph), {"": 17}, constants, {"y"})
    x = RNG.standard_normal((2, 30, 12)).astype(np.float32)
    ours, = runner(x)
    assert sessions == [["MatMul"]]
    np.testing.assert_allclose(ours, run(proto, x)[0], rtol=1e-5, atol=1e-5)
