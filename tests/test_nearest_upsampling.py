"""ONNX Resize by whole factors, nearest: lpt's step (a copy, in numpy or in a native program) against
onnxruntime's Resize, and the forms it leaves to onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from lpt.backend.float_steps import try_float_step
from lpt.kernels import upsample_nearest


def resize_model(scales=None, sizes=None, opset: int = 13, **attributes):
    """x [2, 3, 5, 4] → Resize(x, roi, scales, sizes) → y."""
    initializers = [numpy_helper.from_array(np.zeros(0, np.float32), "roi")]
    names = ["x", "roi", "", ""]
    if scales is not None:
        initializers.append(numpy_helper.from_array(np.array(scales, np.float32), "scales"))
        names[2] = "scales"
    if sizes is not None:
        initializers.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
        names[3] = "sizes"
    while names[-1] == "":
        names.pop()
    node = helper.make_node("Resize", names, ["y"], **attributes)
    graph = helper.make_graph([node], "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def onnxruntime_result(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def the_step(model):
    [node] = ir.serde.deserialize_model(model).graph
    return try_float_step(node)


TAKEN = [dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
         dict(mode="nearest"),  # half_pixel, round_prefer_floor: ONNX's defaults
         dict(mode="nearest", coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_ceil")]


@pytest.mark.parametrize("attributes", TAKEN)
@pytest.mark.parametrize("factors", [(1, 1), (2, 2), (3, 1), (1, 4), (4, 3)])
def test_upsampling_by_whole_factors_equals_onnxruntimes_resize(attributes, factors):
    x = np.random.default_rng(0).normal(0, 1, (2, 3, 5, 4)).astype(np.float32)
    for model in (resize_model(scales=[1, 1, *factors], **attributes),
                  resize_model(sizes=[2, 3, 5 * factors[0], 4 * factors[1]], **attributes)):
        expected = onnxruntime_result(model, x)
        assert np.array_equal(upsample_nearest(x, factors), expected)
        step, _ = the_step(model)
        assert np.array_equal(step.run(x)[0], expected)


@pytest.mark.parametrize("model, why", [
    (resize_model(scales=[1, 1, 2, 2], mode="linear"), "interpolates"),
    (resize_model(scales=[1, 1, 1.5, 2], mode="nearest"), "not a whole factor"),
    (resize_model(scales=[1, 1, 0.5, 0.5], mode="nearest"), "downsamples"),
    (resize_model(scales=[1, 2, 2, 2], mode="nearest"), "repeats channels"),
    (resize_model(scales=[1, 1, 4, 4], mode="nearest", coordinate_transformation_mode="asymmetric"),
     "round(y / 4) is not y // 4"),
    (resize_model(scales=[1, 1, 2, 2], mode="nearest", coordinate_transformation_mode="align_corners"),
     "another mapping"),
])
def test_other_resizes_stay_with_onnxruntime(model, why):
    assert the_step(model) is None, why

