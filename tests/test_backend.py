"""The compiled plan: kernels where lpt has them, onnxruntime for the rest, same numbers as the graph."""

import numpy as np
import pytest

import lpt
from lpt.backend import compile_model
from tests.graphs import run_ort
from tests.transformations.builders import RNG
from tests.transformations.test_pipeline import conv_net


@pytest.fixture(scope="module")
def int8_net():
    _, m = conv_net()
    lpt.transform(m)
    return m


def test_plan_runs_the_int8_chains_on_kernels(int8_net):
    plan = compile_model(int8_net)
    kinds = [(s.op_types, s.backend) for s in plan.steps]
    assert kinds[0] == (("QuantizeLinear",), "int8 kernel")
    assert (("ConvInteger", "Cast", "Mul", "Add", "Relu", "QuantizeLinear"), "int8 kernel") in kinds
    assert (("MatMulInteger", "Cast", "Mul", "Add"), "int8 kernel") in kinds
    assert plan.fallback_ops() == {"Flatten": 1}


def test_plan_matches_onnxruntime_on_the_same_int8_graph_bit_for_bit(int8_net):
    x = RNG.uniform(-3, 3, (2, 3, 8, 8)).astype(np.float32)
    ours = compile_model(int8_net).run({"x": x})["y"]
    np.testing.assert_array_equal(ours, run_ort(int8_net, {"x": x})[0])


def test_plan_keeps_intermediates_on_request(int8_net):
    x = RNG.uniform(-3, 3, (2, 3, 8, 8)).astype(np.float32)
    everything = compile_model(int8_net).run({"x": x}, keep=True)
    assert everything["maxpool14/quantized"].dtype == np.uint8


def test_missing_input_is_a_data_error(int8_net):
    with pytest.raises(lpt.DataError, match="expects"):
        compile_model(int8_net).run({})
