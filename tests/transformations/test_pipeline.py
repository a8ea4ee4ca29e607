"""The whole runtime stage on small fake-quantized nets: the expected int8 graph, same numbers."""

import numpy as np

import lpt
from lpt.transformations.pipeline import transform
from tests.graphs import op_types
from tests.transformations.builders import RNG, Graph


def conv_net():
    g = Graph()
    x = g.fq("x", 0.02, np.uint8(128))
    conv = g.op("Conv", [x, g.weight((4, 3, 3, 3)), g.const(g.rng.normal(size=4).astype(np.float32), "b")],
                pads=[1, 1, 1, 1])
    relu = g.fq(g.op("Relu", [conv]), 0.03, np.uint8(0))
    pool = g.op("MaxPool", [relu], kernel_shape=[2, 2], strides=[2, 2])
    flat = g.op("Flatten", [pool])
    g.op("Gemm", [flat, g.weight((5, 64)), g.const(g.rng.normal(size=5).astype(np.float32), "c")], name="y", transB=1)
    return g.build({"x": [2, 3, 8, 8]}, ["y"])


def test_conv_net_becomes_integer_and_keeps_its_outputs():
    proto, m = conv_net()
    x = RNG.uniform(-2, 2, (2, 3, 8, 8)).astype(np.float32)
    before = lpt.run_reference(m, {"x": x})["y"]
    result = transform(m)
    assert op_types(m) == [
        "QuantizeLinear", "ConvInteger", "Cast", "Mul", "Add", "Relu", "QuantizeLinear",
        "MaxPool", "Flatten", "MatMulInteger", "Cast", "Mul", "Add",
    ]
    applied = {name for name, _ in result.applied}
    assert {"ConvTransformation", "MatMulTransformation", "MoveThroughPrecisionPreserved"} <= applied
    after = lpt.run_reference(m, {"x": x})["y"]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)
    assert [o.name for o in m.graph.outputs] == ["y"]


def test_a_saved_int8_graph_loads_as_it_is(tmp_path):
    """Its MatMulInteger → Cast → Mul looks like a third-party pre-quantized op, which lpt.load would
    turn back into FakeQuantize form; lpt's own int8 graphs are marked and left alone."""
    _, m = conv_net()
    transform(m)
    again = lpt.load(lpt.save(m, tmp_path / "int8.onnx"))
    assert op_types(again) == op_types(m)
    third_party = lpt.model_io.read_model(tmp_path / "int8.onnx")
    del third_party.metadata_props["lpt.graph"]
    lpt.normalize(third_party)
    assert "FakeQuantize" in op_types(third_party)
