"""conv_transpose_accumulate against its int64 twin, and against onnxruntime's f32 ConvTranspose."""

import numpy as np
import onnxruntime as ort
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from lpt.kernels import conv_transpose_accumulate
from lpt.kernels.reference import conv_transpose_reference


@st.composite
def cases(draw):
    groups = draw(st.sampled_from([1, 2]))
    in_channels, out_per_group = groups * draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kernel = draw(st.integers(1, 3))
    strides = (draw(st.integers(1, 3)),) * 2
    dilations = (draw(st.integers(1, 2)),) * 2
    pads = (draw(st.integers(0, 1)),) * 4
    output_padding = (draw(st.integers(0, strides[0] - 1)),) * 2
    size = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 256, (2, in_channels, size, size)).astype(np.uint8)
    weights = rng.integers(-128, 128, (in_channels, out_per_group, kernel, kernel)).astype(np.int8)
    zero_point = int(draw(st.sampled_from([0, 128, 255])))
    weight_zp = rng.integers(-5, 5, groups * out_per_group) if draw(st.booleans()) else 0
    attributes = dict(groups=groups, strides=strides, dilations=dilations, pads=pads, output_padding=output_padding)
    return src, weights, zero_point, weight_zp, attributes


@given(cases())
@settings(max_examples=40, deadline=None)
def test_matches_the_int64_twin(case):
    src, weights, zero_point, weight_zp, attributes = case
    expected = conv_transpose_reference(src, weights, zero_point, weight_zp, **attributes)
    np.testing.assert_array_equal(conv_transpose_accumulate(src, weights, zero_point, weight_zp, **attributes),
                                  expected)


def test_matches_onnxruntime_conv_transpose_on_the_same_integers():
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, (1, 4, 5, 5)).astype(np.uint8)
    weights = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    attributes = dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], **attributes)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [1, 4, 5, 5])],
                              [helper.make_tensor_value_info("y", 1, None)],
                              [numpy_helper.from_array(weights.astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = session.run(None, {"x": src.astype(np.float32) - 128})[0]  # small sums: exact in f32 too
    ours = conv_transpose_accumulate(src, weights, 128, 0, **{k: tuple(v) for k, v in attributes.items()})
    np.testing.assert_array_equal(ours, theirs.astype(np.int64))
