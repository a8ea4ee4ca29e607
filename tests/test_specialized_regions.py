"""lpt.backend.specialized_regions: a region whose Ifs its inputs' shapes decide runs as lpt's plan for those shapes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import lpt
import lpt.backend.plan as plan_module
import lpt.native
from lpt.backend.plan import compile_model
from lpt.backend import specialized_regions
from lpt.backend.specialized_regions import SpecializedRegion
from tests.transformations.builders import Graph

HIDDEN, FEATURES = 16, 12
# Without the engine (not built, or LPT_ONEDNN=off) plans make no specialized regions: the last test checks that.
needs_the_engine = pytest.mark.skipif(not lpt.native.available(), reason="lpt's native engine is not available: "
                                      "plans make no specialized regions without it")
RNG = np.random.default_rng(5)


def _tensor(name, array):
    return onnx.numpy_helper.from_array(np.asarray(array), name)


def recurrent_decoder(condition: str = "batch"):
    """silero_vad's decoder, small: an int8 layer, then If(state.shape[1] != 0, one LSTM cell on the layer's
    output and the state, the state as it is). With `condition` "values" the If asks whether the state's sum is
    positive instead: no shape decides that."""
    g = Graph()
    features = g.op("MatMul", [g.fq("x", 0.02, np.uint8(128)), g.weight((8, FEATURES), axis=1)])
    weights = [RNG.normal(0, 0.3, shape).astype(np.float32) for shape in
               ((1, 4 * HIDDEN, FEATURES), (1, 4 * HIDDEN, HIDDEN), (1, 8 * HIDDEN))]
    cell = helper.make_graph([
        helper.make_node("Unsqueeze", [features, "axis0"], ["steps"]),
        helper.make_node("Gather", ["state", "zero"], ["h"], axis=0),
        helper.make_node("Gather", ["state", "one"], ["c"], axis=0),
        helper.make_node("Unsqueeze", ["h", "axis0"], ["h0"]),
        helper.make_node("Unsqueeze", ["c", "axis0"], ["c0"]),
        helper.make_node("LSTM", ["steps", "W", "R", "B", "", "h0", "c0"], ["", "y_h", "y_c"], hidden_size=HIDDEN),
        helper.make_node("Concat", ["y_h", "y_c"], ["next"], axis=0)],
        "cell", [], [helper.make_tensor_value_info("next", TensorProto.FLOAT, None)],
        [_tensor(n, w) for n, w in zip("WRB", weights)])
    unchanged = helper.make_graph([helper.make_node("Identity", ["state"], ["same"])], "unchanged", [],
                                  [helper.make_tensor_value_info("same", TensorProto.FLOAT, None)])
    if condition == "batch":
        batch = g.op("Gather", [g.op("Shape", ["state"]), g.const(np.int64(1))], axis=0)
        runs = g.op("Cast", [batch], to=TensorProto.BOOL)
    else:
        runs = g.op("Greater", [g.op("ReduceSum", ["state"], keepdims=0), g.const(np.float32(0))])
    for name, value in (("axis0", np.array([0], np.int64)), ("zero", np.int64(0)), ("one", np.int64(1))):
        g.inits[name] = value
    g.nodes.append(helper.make_node("If", [runs], ["next_state"], name="decoder", then_branch=cell,
                                    else_branch=unchanged))
    _, fq_model = g.build({"x": ["batch", 8], "state": [2, "batch", HIDDEN]}, ["next_state"])
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    return int8


def _plans(int8):
    """The plan, and the plan with its regions left to onnxruntime whole (as before specialized regions)."""
    specialized = compile_model(int8, threads=2)
    original = plan_module.SpecializedRegion
    plan_module.SpecializedRegion = lambda runner, threads: runner
    try:
        whole = compile_model(int8, threads=2)
    finally:
        plan_module.SpecializedRegion = original
    return specialized, whole


def _feeds(batch):
    return {"x": RNG.uniform(-2, 2, (batch, 8)).astype(np.float32),
            "state": RNG.normal(0, 0.5, (2, batch, HIDDEN)).astype(np.float32)}


@needs_the_engine
def test_the_lstm_cell_in_a_branch_the_batch_decides_runs_on_lpts_native_steps():
    plan, whole = _plans(recurrent_decoder())
    [region] = [s for s in plan.steps if isinstance(s.run, SpecializedRegion)]
    for batch in (1, 3, 1):
        feeds = _feeds(batch)
        # the cell's sums in lpt's order (kernels.dense), its Sigmoid and Tanh lpt's: a few float32 steps apart
        np.testing.assert_allclose(plan.run(feeds)["next_state"], whole.run(feeds)["next_state"], rtol=1e-5, atol=1e-6)
    assert len(region.run.plans) == 2  # one plan per set of shapes, compiled at its first run
    for specialized, ran_on in region.run.plans.values():
        assert ran_on == "lpt float32"
        assert {s.backend for s in specialized.steps} == {"lpt float32"}  # no onnxruntime step: no LSTM, no If
        assert len(specialized.run_steps) == 1 and "Sigmoid" in specialized.run_steps[0].op_types  # one native program


@needs_the_engine
def test_a_region_whose_if_the_values_decide_runs_as_before():
    plan, whole = _plans(recurrent_decoder(condition="values"))
    [region] = [s for s in plan.steps if isinstance(s.run, SpecializedRegion)]
    for sign, batch in ((1, 2), (-1, 2), (1, 3)):
        feeds = _feeds(batch)
        feeds["state"] = sign * np.abs(feeds["state"])
        assert np.array_equal(plan.run(feeds)["next_state"], whole.run(feeds)["next_state"])
    # the first shapes left the If: the next ones are not tried
    assert not region.run.shapes_decide
    assert [plan for plan, _ in region.run.plans.values()] == [region.run.runner]
    assert plan.backend_counts()["onnxruntime"] >= 3  # the If and its condition's nodes


@needs_the_engine
def test_past_its_sets_of_shapes_a_region_runs_as_it_is(monkeypatch):
    """A region fed ever new shapes would compile at every run: past SPECIALIZED sets, new ones run as before."""
    monkeypatch.setattr(specialized_regions, "SPECIALIZED", 2)
    plan, whole = _plans(recurrent_decoder())
    [region] = [s for s in plan.steps if isinstance(s.run, SpecializedRegion)]
    for batch in (1, 2, 3, 4, 2):
        feeds = _feeds(batch)
        np.testing.assert_allclose(plan.run(feeds)["next_state"], whole.run(feeds)["next_state"], rtol=1e-5, atol=1e-6)
        assert region.run.ran_on == ("onnxruntime" if batch > 2 else "lpt float32")
        assert plan.backend_counts()["onnxruntime"] == (len(region.nodes) if batch > 2 else 0)
    assert sorted(shapes[0][0] for shapes in region.run.plans) == [(2, 1, HIDDEN), (2, 2, HIDDEN)]  # the states'


def test_without_the_native_engine_no_region_is_specialized(monkeypatch):
    """The NumPy forms of a specialized plan's float32 steps (lpt's exp for its Sigmoid and Tanh) cost more than
    onnxruntime's session: without the engine the region stays onnxruntime's, with its values."""
    monkeypatch.setattr(plan_module, "native_engine_available", lambda: False)
    plan, whole = _plans(recurrent_decoder())
    [region] = [s for s in plan.steps if s.backend == "onnxruntime"]
    assert not isinstance(region.run, SpecializedRegion)
    feeds = _feeds(2)
    assert np.array_equal(plan.run(feeds)["next_state"], whole.run(feeds)["next_state"])
