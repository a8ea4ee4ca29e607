"""ONNX Resize by whole factors, nearest: lpt's step (a copy, in numpy or in a native program) against
onnxruntime's Resize, and the forms it leaves to onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import lpt
import lpt.native
from lpt.backend import compile_model
from lpt.backend.float_steps import try_float_step
from lpt.backend.native_program import ENGINE
from lpt.kernels import upsample_nearest
from lpt.model_io import clone
from lpt.transformations.pipeline import transform


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


def pyramid_net():
    """A feature pyramid's top-down step, as PaddleOCR's detector has it: a coarse map upsampled ×2
    (Resize nearest, asymmetric, floor) and added to a finer one, then a convolution."""
    rng = np.random.default_rng(1)
    weights = {"coarse.w": (8, 3, 3, 3), "fine.w": (8, 3, 1, 1), "head.w": (4, 8, 3, 3)}
    initializers = [numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)
                    for name, shape in weights.items()]
    initializers.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
    initializers.append(numpy_helper.from_array(np.zeros(0, np.float32), "roi"))
    nodes = [helper.make_node("Conv", ["x", "coarse.w"], ["coarse"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
             helper.make_node("Relu", ["coarse"], ["coarse.relu"]),
             helper.make_node("Resize", ["coarse.relu", "roi", "scales"], ["up"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             helper.make_node("Conv", ["x", "fine.w"], ["fine"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["up", "fine"], ["sum"]),
             helper.make_node("Conv", ["sum", "head.w"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)]
    graph = helper.make_graph(nodes, "pyramid", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.skipif(not lpt.native.available(), reason="lpt's native engine is not built")
def test_an_upsampling_between_int8_layers_keeps_the_network_one_native_call():
    """Left to onnxruntime, the Resize cut PaddleOCR's detector into three native programs and an
    onnxruntime region (2.9 ms of its 100); as a step, the whole network is one call."""
    rng = np.random.default_rng(2)
    fq = lpt.calibrate(ir.serde.deserialize_model(pyramid_net()),
                       {"x": rng.uniform(-1, 1, (8, 3, 16, 16)).astype(np.float32)}, quiet=True).model
    model = clone(fq)
    transform(model)
    plan = compile_model(model, threads=2)
    assert [s.engine for s in plan.run_steps] == [ENGINE]
    assert ("resize_nearest", (2, 2)) in [s.native for s in plan.steps]
    feeds = {"x": rng.uniform(-1, 1, (3, 3, 16, 16)).astype(np.float32)}
    fused, one_by_one = plan.run(feeds)["y"], plan.run(feeds, keep=True)["y"]
    kernels_only = compile_model(model, threads=1, native=False).run(feeds)["y"]
    assert np.array_equal(fused, one_by_one) and np.array_equal(fused, kernels_only)
