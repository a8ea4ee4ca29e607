"""lpt.numerics.onnxruntime_logistic: onnxruntime's Sigmoid and its Sigmoid·x, bit for bit."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from lpt.backend.dynamic_layers import onnxruntime_silu_form
from lpt.numerics.onnxruntime_logistic import logistic, silu


def onnxruntime_session(nodes, options: ort.SessionOptions | None = None):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    return ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
                                .SerializeToString(), options, providers=["CPUExecutionProvider"])


def values() -> np.ndarray:
    """Its clamps at ±18, infinities, a NaN (which passes through), values over [−25, 25] and random bit patterns
    (every exponent)."""
    edges = np.array([np.nan, np.inf, -np.inf, 18, 18.5, -18, -30, -0.0, 0.0, 1e-30, -1e-45], np.float32)
    rng = np.random.default_rng(2)
    return np.concatenate([edges, rng.uniform(-25, 25, 200_000).astype(np.float32),
                           rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)])


def near_the_upper_clamp() -> np.ndarray:
    """Every float32 in [17, 18), where the logistic rounds above 1 on 20 of them, and values()."""
    return np.concatenate([values(), np.arange(np.float32(17).view(np.uint32), np.float32(18).view(np.uint32),
                                               dtype=np.uint32).view(np.float32)])


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit, any NaN equal to any NaN."""
    return np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(a.view(np.uint32)[~np.isnan(a)],
                                                                       b.view(np.uint32)[~np.isnan(b)])


def test_logistic_is_onnxruntimes_sigmoid():
    x = values()
    got = logistic(x)
    assert np.isnan(got[0]) and got[3] == got[4] and got[5] == got[6]
    assert same_bits(got, onnxruntime_session([helper.make_node("Sigmoid", ["x"], ["y"])]).run(None, {"x": x})[0])


def test_silu_is_onnxruntimes_sigmoid_then_mul():
    """The two ops as onnxruntime runs them unfused. (Fused, they are its QuickGelu, which MLAS computes so on AVX2
    and with the logistic clamped at 1 on AVX-512F: lpt.backend.dynamic_layers asks which at run time.)"""
    x = values()
    unfused = ort.SessionOptions()
    unfused.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime_session([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
                                  unfused)
    assert same_bits(silu(x), session.run(None, {"x": x})[0])


def test_the_clamped_silu_is_x_where_the_logistic_rounds_above_one():
    x = near_the_upper_clamp()
    above = logistic(x) > 1
    assert above.sum() == 20
    assert same_bits(silu(x, clamped=True)[above], x[above])
    assert same_bits(silu(x, clamped=True)[~above], silu(x)[~above])


def test_onnxruntimes_fused_silu_is_the_form_lpt_found():
    """The probe (lpt.backend.dynamic_layers.onnxruntime_silu_form) looks at 50 001 values in [−20, 20]; its answer
    holds on every exponent, the infinities and a NaN too."""
    form = onnxruntime_silu_form()
    if form is None:  # lpt then leaves the Sigmoid and the Mul to onnxruntime: no form of lpt's to hold it to
        pytest.skip(f"onnxruntime {ort.__version__}'s fused Sigmoid·x on this CPU is neither x·logistic(x) nor "
                    "x·min(1, logistic(x)), so lpt runs it in onnxruntime and computes no SiLU of its own to check")
    x = near_the_upper_clamp()
    fused = onnxruntime_session([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])])
    assert same_bits(silu(x, clamped=form == "clamped"), fused.run(None, {"x": x})[0])
