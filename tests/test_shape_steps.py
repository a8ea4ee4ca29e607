"""Shape arithmetic between lpt's steps is a step that computes once per set of shapes (lpt.backend.shape_steps)."""

import numpy as np
import pytest

import lpt
from lpt.backend import compile_model
from lpt.backend.shape_steps import BACKEND, REMEMBERED, Remembered
from lpt.crosscheck import run_onnxruntime
from tests.transformations.builders import RNG, Graph


def layer(g: Graph) -> str:
    """An int8 convolution and ReLU of x [N, 3, 6, 6]: a tensor lpt's step makes."""
    conv = g.op("Conv", [g.fq("x", 0.02, np.uint8(128)), g.weight((4, 3, 3, 3))], pads=[1, 1, 1, 1])
    return g.fq(g.op("Relu", [conv]), 0.03, np.uint8(0))


def rows_of(g: Graph, measured: str) -> str:
    """[N, -1] from Shape(measured), as exporters write a flatten: Shape, Gather, Unsqueeze, Concat."""
    batch = g.op("Gather", [g.op("Shape", [measured]), g.const(np.array(0, np.int64))], axis=0)
    return g.op("Concat", [g.op("Unsqueeze", [batch, g.const(np.array([0], np.int64))]),
                           g.const(np.array([-1], np.int64))], axis=0)


def plan_of(g: Graph):
    _, fq_model = g.build({"x": ["N", 3, 6, 6]}, ["y"])
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    return fq_model, compile_model(int8)


def test_a_flatten_to_a_computed_shape_runs_without_onnxruntime_and_computes_its_shape_once_per_shape():
    g = Graph()
    relu = layer(g)
    g.op("Reshape", [relu, rows_of(g, relu)], name="y")
    fq_model, plan = plan_of(g)
    assert [s.backend for s in plan.steps if s.backend not in ("int8 kernel", "lpt float32")] == [BACKEND]
    shapes = next(s for s in plan.steps if s.backend == BACKEND)
    assert shapes.op_types == ("Shape", "Gather", "Unsqueeze", "Concat")
    for batch in (2, 3, 2, 3, 2):
        x = RNG.uniform(-2, 2, (batch, 3, 6, 6)).astype(np.float32)
        ours = plan.run({"x": x})["y"]
        reference = run_onnxruntime(fq_model, {"x": x})["y"]
        assert ours.shape == reference.shape == (batch, 144)
        np.testing.assert_allclose(ours, reference, atol=0.031)  # the int8 layer: within 1 LSB (0.03) at ties
    assert shapes.run.computed == 2  # batches 2 and 3, each once


def test_shape_arithmetic_that_only_onnxruntime_reads_stays_in_its_region():
    """Sin is not lpt's: the Reshape reads its output, and the shape it computes stays in that region."""
    g = Graph()
    relu = layer(g)
    g.op("Reshape", [g.op("Sin", [relu]), rows_of(g, relu)], name="y")
    fq_model, plan = plan_of(g)
    assert BACKEND not in {s.backend for s in plan.steps}
    assert [sorted(s.op_types) for s in plan.steps if s.backend == "onnxruntime"] == \
        [sorted(("Sin", "Shape", "Gather", "Unsqueeze", "Concat", "Reshape"))]


def test_a_shape_of_a_tensor_onnxruntime_makes_stays_in_its_region():
    g = Graph()
    relu = layer(g)
    g.op("Reshape", [relu, rows_of(g, g.op("Sin", [relu]))], name="y")
    fq_model, plan = plan_of(g)
    assert BACKEND not in {s.backend for s in plan.steps}
    x = RNG.uniform(-2, 2, (2, 3, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(plan.run({"x": x})["y"], run_onnxruntime(fq_model, {"x": x})["y"], atol=0.031)


def test_shape_arithmetic_that_measures_a_tensor_made_from_its_own_results_stays_onnxruntimes():
    """t = [N, -1] from Shape(relu) reshapes relu into r; u reads t and Shape(r): one step would wait for r, made
    from t, which the step makes. The plan runs, as onnxruntime does."""
    g = Graph()
    relu = layer(g)
    t = rows_of(g, relu)
    r = g.op("Reshape", [relu, t])
    first, second = g.const(np.array([0], np.int64)), g.const(np.array([1], np.int64))
    last = g.const(np.array([2], np.int64))
    u = g.op("Concat", [g.op("Slice", [t, first, second]), g.op("Slice", [g.op("Shape", [r]), second, last])], axis=0)
    g.op("Reshape", [r, u], name="y")
    fq_model, plan = plan_of(g)
    assert BACKEND not in {s.backend for s in plan.steps}
    x = RNG.uniform(-2, 2, (3, 3, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(plan.run({"x": x})["y"], run_onnxruntime(fq_model, {"x": x})["y"], atol=0.031)


class Counting:
    input_names, output_names = ["t"], ["shape"]

    def __init__(self):
        self.calls = 0

    def __call__(self, t):
        self.calls += 1
        return [np.array(t.shape, np.int64)]


def test_remembered_results_are_read_only_and_the_oldest_shape_is_forgotten_first():
    region = Counting()
    remembered = Remembered(region)
    first = remembered(np.zeros((1, 2), np.float32))[0]
    with pytest.raises(ValueError):
        first[0] = 5  # every run shares it
    assert remembered(np.ones((1, 2), np.float32))[0] is first and region.calls == 1
    assert remembered(np.zeros((1, 2), np.int8))[0] is not first  # another dtype: computed again
    for n in range(REMEMBERED):
        remembered(np.zeros((n + 2, 2), np.float32))
    calls = region.calls
    remembered(np.zeros((1, 2), np.float32))
    assert region.calls == calls + 1
