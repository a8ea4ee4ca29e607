"""lpt.kernels.float_ops against onnxruntime: the float32 ops between int8 layers, where lpt defines the order.

Measured with onnxruntime 1.32: HardSwish and the average pools listed in kernels.float_ops give the
same bits; these tests allow the last bits, so that another order of additions in a later onnxruntime
does not fail them (lpt's order is pinned by the native engine's tests, tests/native/test_native_float_ops.py)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from lpt.kernels import average_pool, extreme_over_middle_axes, hard_swish, layer_norm, softmax
from lpt.kernels.float_ops import sum_in_lanes
from lpt.numerics.exp import erf


def onnxruntime(node, x: np.ndarray) -> np.ndarray:
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, None)],
                              [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_hard_swish_is_onnxruntimes():
    x = np.concatenate([np.random.default_rng(0).normal(0, 4, 200_000), np.linspace(-4, 4, 80_001)]).astype(np.float32)
    np.testing.assert_array_max_ulp(hard_swish(x), onnxruntime(helper.make_node("HardSwish", ["x"], ["y"]), x), maxulp=1)


@pytest.mark.parametrize("kernel, stride, pads", [
    (2, 2, (0, 0, 0, 0)), (3, 1, (1, 1, 1, 1)), (3, 2, (1, 1, 1, 1)), (3, 2, (0, 1, 1, 0)), (5, 1, (2, 2, 2, 2)),
    (3, 3, (0, 0, 0, 0)),  # onnxruntime 1.32 adds row by row here
])
@pytest.mark.parametrize("include_pad", [False, True])
def test_average_pool_is_onnxruntimes_but_for_the_order_of_additions(kernel, stride, pads, include_pad):
    x = np.random.default_rng(kernel * 10 + stride).normal(0, 1, (2, 8, 13, 11)).astype(np.float32)
    theirs = onnxruntime(helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[kernel] * 2, strides=[stride] * 2,
                                          pads=list(pads), count_include_pad=int(include_pad)), x)
    ours = average_pool(x, (kernel, kernel), (stride, stride), pads, include_pad)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)


def test_softmax_layer_norm_and_erf_are_close_to_onnxruntimes():
    rng = np.random.default_rng(3)
    x = rng.normal(0, 4, (3, 64, 37)).astype(np.float32)
    np.testing.assert_allclose(softmax(x), onnxruntime(helper.make_node("Softmax", ["x"], ["y"], axis=-1), x),
                               rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(erf(x), onnxruntime(helper.make_node("Erf", ["x"], ["y"]), x), rtol=0, atol=3e-7)
    gamma, beta = rng.normal(1, 0.3, 37).astype(np.float32), rng.normal(0, 0.3, 37).astype(np.float32)
    graph = helper.make_graph([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)],
                              "g", [helper.make_tensor_value_info("x", 1, None)], [helper.make_tensor_value_info("y", 1, None)],
                              [numpy_helper.from_array(gamma, "g"), numpy_helper.from_array(beta, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(layer_norm(x, gamma, beta, 1e-5), theirs, rtol=1e-5, atol=2e-6)


def test_the_lanes_add_in_their_order():
    """Lane j takes x[j], x[j + 8], …; the lanes pair as ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7))."""
    x = np.zeros(11, np.float32)
    x[[0, 8]] = 1e8, -1e8  # lane 0: cancels exactly when added in its order
    x[1] = 1.0
    assert sum_in_lanes(x)[0] == 1.0
    # (2^24 + 0) + (1 + 1) is 2^24 + 2; added one after another, each + 1 rounds back to 2^24
    assert sum_in_lanes(np.float32([2.0**24, 0, 1, 1, 0, 0, 0, 0]))[0] == 2.0**24 + 2


def test_a_max_over_the_middle_axes_is_onnxruntimes_reduce_max_and_settles_zeros_and_nans_by_the_first():
    """ReduceMax / ReduceMin over the positions of [N, H, W, C]: onnxruntime's values where there is one
    maximum; of equal ones (−0 and +0) the first, and of NaNs the first (a NaN's payload kept)."""
    x = np.random.default_rng(3).normal(0, 1, (2, 5, 7, 3)).astype(np.float32)
    for op, smallest in (("ReduceMax", False), ("ReduceMin", True)):
        expected = onnxruntime(helper.make_node(op, ["x"], ["y"], axes=[1, 2], keepdims=0), x)
        assert np.array_equal(extreme_over_middle_axes(x, False, smallest), expected)
        assert extreme_over_middle_axes(x, True, smallest).shape == (2, 1, 1, 3)
    zeros = np.float32([[[-0.0, 0.0]], [[0.0, -0.0]]]).transpose(1, 0, 2)  # [1, 2, 2]: channel 0 −0 first
    assert np.signbit(extreme_over_middle_axes(zeros, False)).tolist() == [[True, False]]
    nans = np.float32([1.0, 5.0, 2.0]).reshape(1, 3, 1).repeat(2, axis=2)
    first, second = np.uint32(0x7FC00001).view(np.float32), np.uint32(0x7FC00002).view(np.float32)
    nans[0, 1, 1], nans[0, 2, 1] = first, second
    result = extreme_over_middle_axes(nans, False)
    assert result[0, 0] == 5.0 and result.view(np.uint32)[0, 1] == 0x7FC00001
    assert extreme_over_middle_axes(np.zeros((1, 0, 2), np.float32), False, True).tolist() == [[np.inf, np.inf]]
