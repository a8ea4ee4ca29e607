"""lpt's float32 Sigmoid, tanh, erf and log (lpt.numerics.exp): accurate, and defined where numpy's exp is not the same
everywhere."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
from onnx import helper

from lpt.numerics.exp import erf, log, sigmoid, tanh


def test_within_three_ulp_of_the_exact_sigmoid():
    x = np.linspace(-90, 90, 2_000_001, dtype=np.float32)
    exact = 1 / (1 + np.exp(-x.astype(np.float64)))
    ours = sigmoid(x)
    normal = exact >= 1e-30
    ulp = np.abs(ours[normal] - exact[normal]) / np.spacing(exact[normal].astype(np.float32))
    assert ulp.max() <= 3
    assert ours.dtype == np.float32 and np.all((ours >= 0) & (ours <= 1))


def test_the_ends_nan_and_signed_zero():
    x = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e4, -1e4, 86.0, -87.0])
    got = sigmoid(x)
    assert np.isnan(got[0])
    assert got[1] == 1 and got[5] == 1 and got[7] == 1
    assert 0 < got[2] == got[6] == got[8] < 1.7e-38  # clamped at −87, still a normal float
    assert got[3] == got[4] == 0.5


def test_close_to_onnxruntimes_sigmoid():
    """onnxruntime's Sigmoid is another approximation (it cuts the tails off): the two differ by at most 2e−7."""
    x = np.linspace(-30, 30, 600_001, dtype=np.float32)
    graph = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["y"])], "sigmoid",
                              [helper.make_tensor_value_info("x", 1, [None])], [helper.make_tensor_value_info("y", 1, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    [theirs] = session.run(None, {"x": x})
    assert np.abs(theirs - sigmoid(x)).max() <= 2e-7


def test_tanh_within_two_ulp_of_the_exact_one_on_both_sides_of_its_split():
    x = np.concatenate([np.linspace(-50, 50, 2_000_001, dtype=np.float32),
                        np.float32([0.625, -0.625, np.nextafter(np.float32(0.625), np.float32(0)), 1e-30, -1e-30])])
    exact = np.tanh(x.astype(np.float64))
    ours = tanh(x)
    ulp = np.abs(ours - exact) / np.spacing(np.abs(exact).astype(np.float32))
    assert ulp.max() <= 2
    assert np.array_equal(np.signbit(ours), np.signbit(x))  # odd, −0 included


def test_tanh_at_its_ends_and_close_to_onnxruntimes():
    got = tanh(np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e4, -1e4]))
    assert np.isnan(got[0]) and got[1] == got[5] == 1 and got[2] == got[6] == -1
    assert got[3] == 0 and not np.signbit(got[3]) and got[4] == 0 and np.signbit(got[4])
    x = np.linspace(-20, 20, 400_001, dtype=np.float32)
    graph = helper.make_graph([helper.make_node("Tanh", ["x"], ["y"])], "tanh",
                              [helper.make_tensor_value_info("x", 1, [None])], [helper.make_tensor_value_info("y", 1, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    [theirs] = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.abs(theirs - tanh(x)).max() <= 3e-7


def test_erf_within_two_ulp_of_the_exact_one_on_each_of_its_intervals():
    """Eight polynomials, one per half unit of [0, 4): both sides of each boundary, tiny and subnormal values
    (where a·p keeps the relative accuracy), and 1 from 4 on."""
    edges = np.arange(0, 4.5, 0.5, dtype=np.float32)
    x = np.concatenate([np.linspace(-4.5, 4.5, 900_001, dtype=np.float32), edges, -edges,
                        np.nextafter(edges, np.float32(0)), np.float32(10.0) ** np.arange(-44, 0, dtype=np.float32)])
    exact = np.array([math.erf(v) for v in x.astype(np.float64)])
    ours = erf(x)
    ulp = np.abs(ours - exact) / np.spacing(np.abs(exact).astype(np.float32))
    assert ulp.max() <= 2
    assert np.array_equal(np.signbit(ours), np.signbit(x))  # odd, −0 included
    got = erf(np.float32([np.nan, np.inf, -np.inf, 4.0, 1e30, -1e30]))
    assert np.isnan(got[0]) and got[1] == got[3] == got[4] == 1 and got[2] == got[5] == -1


def test_log_within_one_ulp_of_the_exact_one_from_subnormals_to_the_largest():
    """Both sides of √½ (where the mantissa is doubled), around 1 (where log is near 0: its relative accuracy),
    powers of two, subnormals (scaled by 2^23 first) and the largest float32."""
    x = np.concatenate([np.linspace(1e-3, 100, 2_000_001, dtype=np.float32), np.float32(2.0) ** np.arange(-149, 128),
                        np.float32(10.0) ** np.arange(-45, 38.5, 0.01, dtype=np.float32),
                        np.linspace(0.999, 1.001, 100_001, dtype=np.float32),
                        np.float32([np.sqrt(0.5)]) * np.float32([1, 2, 4]), np.finfo(np.float32).max[None]])
    x = x[x > 0]
    exact = np.log(x.astype(np.float64))
    ours = log(x)
    ulp = np.abs(ours - exact) / np.spacing(np.abs(exact).astype(np.float32))
    assert ulp[exact != 0].max() <= 1 and np.all(ours[exact == 0] == 0)
    got = log(np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, -1.0, 1.0]))
    assert np.isnan(got[0]) and got[1] == np.inf and np.isnan(got[2]) and got[3] == got[4] == -np.inf
    assert np.isnan(got[5]) and got[6] == 0 and not np.signbit(got[6])
