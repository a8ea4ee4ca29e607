"""--estimator auto: the candidate with the least error at the reading layer's output wins; which layers read."""

import numpy as np
import pytest

from lpt.calibration import calibrate
from lpt.calibration.config import ActivationScheme
from lpt.calibration.insertion import activation_fake_quantize
from lpt.calibration.placement import place
from lpt.calibration.range_search import candidates, readers
from tests.calibration.nets import Net, as_ir, conv_net

MIXED = ActivationScheme(symmetric=False)


def outlier_inputs(n=2000):
    """[n, 2]: both features in [0, 1], except three values of feature 1 near 50."""
    x = np.random.default_rng(0).uniform(0, 1, (n, 2)).astype(np.float32)
    x[[10, 500, 1500], 1] = [48.0, 50.0, 49.0]
    return {"x": x}


def matmul_net(w):
    n = Net()
    n.op("MatMul", ["x", n.const("w", w)], "y")
    return n.build({"x": ["N", 2]}, ["y"])


def layer_errors(x, w, ranges):
    """{candidate: Σ‖(FQ_k(x) − x)·w‖²}, in NumPy."""
    return {name: float(np.sum(((activation_fake_quantize(lo, hi, MIXED).apply(x) - x) @ w).astype(np.float64) ** 2))
            for name, (lo, hi) in ranges.items()}


@pytest.mark.parametrize("w, clipped", [
    pytest.param([[1.0], [0.0]], True, id="outliers-meet-zero-weights"),  # clipping them costs nothing
    pytest.param([[0.0], [1.0]], False, id="outliers-carry-the-output"),  # clipping them costs everything
])
def test_auto_picks_the_candidate_with_the_least_error_at_the_layer_output(w, clipped):
    x = outlier_inputs()
    w = np.asarray(w, np.float32)
    result = calibrate(as_ir(matmul_net(w)), x, estimator="auto", quiet=True)
    low, high = result.ranges["x"]
    ranges = candidates(result.statistics.activations["x"], MIXED)
    errors = layer_errors(x["x"], w, ranges)
    best = min(errors, key=errors.get)
    assert (low, high) == ranges[best]  # the same choice as the NumPy errors make
    assert (high < 2.0) if clipped else (high > 45.0)
    assert len(set(errors.values())) > 1  # the candidates really differ


def test_the_error_is_measured_where_the_layer_reads_through_precision_preserving_ops():
    placement = place(as_ir(conv_net()))
    by_name = {p.name: p for p in placement.activations}
    assert [(n.name, i) for n, i in readers(by_name["relu"])] == [("y", 0)]  # MaxPool → Flatten → Gemm
    assert [(n.name, i) for n, i in readers(by_name["x"])] == [("conv", 0)]


def test_a_tensor_read_by_an_add_is_measured_on_itself():
    n = Net()
    a = n.op("Relu", [n.conv("x", "a", 1, 2)], "ra")
    b = n.op("Relu", [n.conv("x", "b", 1, 2)], "rb")
    n.conv(n.op("Add", [a, b], "sum"), "y", 2, 2)
    placement = place(as_ir(n.build({"x": ["N", 1, 8, 8]}, ["y"])))
    by_name = {p.name: p for p in placement.activations}
    assert readers(by_name["ra"]) is None and readers(by_name["sum"]) is not None
