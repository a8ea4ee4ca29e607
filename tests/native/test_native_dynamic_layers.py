"""quantize_dynamic's convolution and matmul chains as one step (lpt.backend.dynamic_layers): onnxruntime's outputs,
bit for bit, from the step's NumPy run and from its native instruction."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import lpt.native
from lpt.backend import compile_model
from lpt.backend import dynamic_layers
from lpt.backend.dynamic_layers import SILU_FORMS, onnxruntime_silu_form, read_dynamic_layer
from lpt.numerics.onnxruntime_logistic import logistic
from lpt.numerics.onnxruntime_logistic import silu as onnxruntime_silu


def layer_nodes(x: str, y: str, name: str, bias_form: str, silu: bool, op: str) -> list:
    """One convolution or matmul (`op`) as quantize_dynamic writes it: the bias "int32" (onnxruntime before 1.9: Div
    by the scales' product, Floor, Cast, added to the accumulators), "float32" (added after the product), or None."""
    scales = f"{name}_scales"
    pads = {"pads": [1, 1, 1, 1]} if op == "ConvInteger" else {}
    nodes = [helper.make_node("DynamicQuantizeLinear", [x], [f"{x}_q", f"{x}_s", f"{x}_zp"]),
             helper.make_node("Mul", [f"{x}_s", f"{name}_w_scale"], [scales]),
             helper.make_node(op, [f"{x}_q", f"{name}_w", f"{x}_zp", f"{name}_w_zp"], [f"{name}_acc"], **pads)]
    acc = f"{name}_acc"
    if bias_form == "int32":
        nodes += [helper.make_node("Div", [f"{name}_b", scales], [f"{name}_bd"]),
                  helper.make_node("Floor", [f"{name}_bd"], [f"{name}_bf"]),
                  helper.make_node("Cast", [f"{name}_bf"], [f"{name}_bi"], to=TensorProto.INT32),
                  helper.make_node("Reshape", [f"{name}_bi", "bias_shape"], [f"{name}_br"]),
                  helper.make_node("Add", [acc, f"{name}_br"], [f"{name}_acc_b"])]
        acc = f"{name}_acc_b"
    out = y if bias_form != "float32" and not silu else f"{name}_scaled"
    nodes += [helper.make_node("Cast", [acc], [f"{name}_f"], to=TensorProto.FLOAT),
              helper.make_node("Mul", [f"{name}_f", scales], [out])]
    if bias_form == "float32":
        biased = f"{name}_biased" if silu else y
        nodes += [helper.make_node("Reshape", [f"{name}_b", "bias_shape"], [f"{name}_br"]),
                  helper.make_node("Add", [out, f"{name}_br"], [biased])]
        out = biased
    if silu:
        nodes += [helper.make_node("Sigmoid", [out], [f"{name}_sig"]),
                  helper.make_node("Mul", [out, f"{name}_sig"], [y])]
    return nodes


def layer_constants(rng, name: str, channels_in: int, channels_out: int, outliers: int, op: str,
                    per_channel: bool) -> list:
    """u8 weights around a zero point, a few of w − zw beyond int8 (Residuals), their scale (one, or one per output
    channel as lpt's `--dynamic` writes it), a bias."""
    shape = (channels_out, channels_in, 3, 3) if op == "ConvInteger" else (channels_in, channels_out)
    weights = rng.integers(70, 190, shape).astype(np.uint8)
    scale_shape = () if not per_channel else (channels_out, 1, 1) if op == "ConvInteger" else (channels_out,)
    weights.reshape(-1)[rng.choice(weights.size, outliers, replace=False)] = rng.choice([0, 255], outliers)
    return [numpy_helper.from_array(weights, f"{name}_w"),
            numpy_helper.from_array(np.uint8(rng.integers(110, 146)), f"{name}_w_zp"),
            numpy_helper.from_array(rng.uniform(0.001, 0.02, scale_shape).astype(np.float32), f"{name}_w_scale"),
            numpy_helper.from_array(rng.normal(0, 0.5, channels_out).astype(np.float32), f"{name}_b")]


def two_layers(seed: int, bias_form: str | None, silu: bool, channels: int, outliers: int,
               op: str = "ConvInteger", per_channel: bool = False) -> onnx.ModelProto:
    """x → layer → layer → y, the second reading the first's float32 output; a convolution's x [N, 3, H, W], a
    matmul's [N, rows, 3]."""
    rng = np.random.default_rng(seed)
    nodes = layer_nodes("x", "h", "one", bias_form, silu, op) + layer_nodes("h", "y", "two", bias_form, silu, op)
    bias_shape = [1, channels, 1, 1] if op == "ConvInteger" else [channels]
    inits = (layer_constants(rng, "one", 3, channels, outliers, op, per_channel)
             + layer_constants(rng, "two", channels, channels, outliers, op, per_channel)
             + [numpy_helper.from_array(np.array(bias_shape, np.int64), "bias_shape")])
    x_shape = [None, 3, None, None] if op == "ConvInteger" else [None, None, 3]
    graph = helper.make_graph(nodes, "dynamic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def onnxruntime_output(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@given(seed=st.integers(0, 2**32 - 1), scales_and_bias=st.sampled_from(
           [(False, "int32"), (False, "float32"), (False, None), (True, "float32"), (True, None)]),
       silu=st.booleans(), channels=st.sampled_from([5, 8, 19]), outliers=st.integers(0, 3), images=st.integers(1, 2),
       shift=st.floats(-2, 2), op=st.sampled_from(["ConvInteger", "MatMulInteger"]))
@settings(max_examples=50, deadline=None)
def test_two_dynamic_layers_give_onnxruntimes_bits(seed, scales_and_bias, silu, channels, outliers, images, shift, op):
    """channels 5 and 19 leave a tail past the eight lanes; a shifted source moves the zero point. Weight scales per
    channel (lpt's `--dynamic`) with the bias in float32: one Mul(s, sw) serves both here, as in onnxruntime's graphs."""
    per_channel, bias_form = scales_and_bias
    model = two_layers(seed, bias_form, silu, channels, outliers, op, per_channel)
    shape = (images, 3, 6, 7) if op == "ConvInteger" else (images, 5, 3)
    x = (np.random.default_rng(seed).normal(shift, 1, shape)).astype(np.float32)
    plan = compile_model(ir.serde.deserialize_model(model), threads=2)
    layers = [step for step in plan.steps if step.native and step.native[0] == "dynamic_layer"]
    assert len(layers) == 2 and all(("Sigmoid" in step.op_types) == (silu and onnxruntime_silu_form() is not None)
                                    for step in layers)
    [(engine, count)] = plan.engine_counts().items()  # what `lpt run` reports
    assert lpt.native.is_native_engine(engine) and count == 2
    expected = onnxruntime_output(model, x)
    assert np.array_equal(plan.run({"x": x})["y"], expected)  # the native program
    kept = plan.run({"x": x}, keep=True)  # each step's NumPy run, with the integers a per-layer check compares
    assert np.array_equal(kept["y"], expected)
    showing_insides = onnx.ModelProto()
    showing_insides.CopyFrom(model)
    inside = ["x_q", "x_zp", "one_acc", "h_q", "two_acc"]
    showing_insides.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in inside)
    session = ort.InferenceSession(showing_insides.SerializeToString(), providers=["CPUExecutionProvider"])
    for name, value in zip(inside, session.run(inside, {"x": x})):
        assert np.array_equal(kept[name], value), name


def test_quantize_dynamics_own_output_runs_as_one_step(tmp_path):
    """onnxruntime's quantize_dynamic of a Conv + SiLU today (its bias in float32): one step, onnxruntime's bits."""
    from onnxruntime.quantization import quantize_dynamic

    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    graph = helper.make_graph(nodes, "f32", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 9])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(rng.normal(0, 0.3, (12, 3, 3, 3)).astype(np.float32), "w"),
                               numpy_helper.from_array(rng.normal(0, 0.2, 12).astype(np.float32), "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "f32.onnx")
    quantize_dynamic(tmp_path / "f32.onnx", tmp_path / "dynamic.onnx", op_types_to_quantize=["Conv"])
    model = onnx.load(tmp_path / "dynamic.onnx")
    plan = compile_model(ir.serde.deserialize_model(model), threads=2)
    [step] = [s for s in plan.steps if s.native and s.native[0] == "dynamic_layer"]
    assert {"DynamicQuantizeLinear", "ConvInteger", "Add"} <= set(step.op_types)
    assert ("Sigmoid" in step.op_types) == (onnxruntime_silu_form() is not None)
    x = rng.normal(0, 1, (1, 3, 9, 9)).astype(np.float32)
    assert np.array_equal(plan.run({"x": x})["y"], onnxruntime_output(model, x))


def test_a_chain_read_elsewhere_is_not_taken():
    """The accumulators also read by a graph output: the chain's ops stay steps of their own."""
    model = two_layers(0, "int32", True, 8, 0)
    model.graph.output.append(helper.make_tensor_value_info("one_acc", TensorProto.INT32, None))
    graph = ir.serde.deserialize_model(model).graph
    first, second = [n for n in graph if n.op_type == "DynamicQuantizeLinear"]
    assert read_dynamic_layer(first) is None and read_dynamic_layer(second) is not None


@pytest.mark.parametrize("form", SILU_FORMS)
@pytest.mark.parametrize("eight_lanes", [True, False])
def test_the_stage_computes_onnxruntimes_sigmoid(eight_lanes, form, monkeypatch):
    """Accumulators whose products by the scale cover the logistic's range and its clamps at ±18, through the
    engine's stage on eight lanes and on one, in either form of the SiLU, against lpt.numerics.onnxruntime_logistic,
    and against onnxruntime where its fused SiLU is that form."""
    monkeypatch.setattr(dynamic_layers, "onnxruntime_silu_form", lambda: form)
    rng = np.random.default_rng(9)
    model = two_layers(1, None, True, 8, 0)
    plan = compile_model(ir.serde.deserialize_model(model), threads=1)
    assert all("Sigmoid" in step.op_types for step in plan.steps)
    x = rng.normal(0, 1, (1, 3, 40, 50)).astype(np.float32)
    previous = lpt.native.engine.float_lanes(eight_lanes)
    try:
        values = plan.run({"x": x})["y"]
    finally:
        lpt.native.engine.float_lanes(previous)
    assert np.array_equal(values, plan.run({"x": x}, keep=True)["y"])
    if onnxruntime_silu_form() == form:
        assert np.array_equal(values, onnxruntime_output(model, x))


def logistic_above_one() -> np.ndarray:
    """The float32 values whose logistic rounds above 1 (20, between 17.48 and 17.99): where the SiLU's forms part."""
    x = np.arange(np.float32(17).view(np.uint32), np.float32(18).view(np.uint32), dtype=np.uint32).view(np.float32)
    return x[logistic(x) > 1]


@pytest.mark.parametrize("form", SILU_FORMS)
@pytest.mark.parametrize("eight_lanes", [True, False])
def test_the_stage_clamps_the_logistic_in_its_clamped_form(eight_lanes, form, monkeypatch):
    """A matmul layer whose accumulators are 0 and whose int32 bias puts chosen values before the SiLU, one per
    channel: those where the logistic rounds above 1 and a few others (27 channels, a tail past eight lanes). The
    source's range makes its scale 2⁻⁸ and the weights' 2⁻¹¹, so the bias in steps of 2⁻¹⁹ is each value
    exactly."""
    monkeypatch.setattr(dynamic_layers, "onnxruntime_silu_form", lambda: form)
    before = np.concatenate([logistic_above_one(), np.float32([17.0, 18.0, 18.5, -18.0, -17.5, 1.0, -0.75])])
    assert len(before) == 27
    channels = len(before)
    graph = helper.make_graph(
        layer_nodes("x", "y", "one", "int32", True, "MatMulInteger"), "dynamic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.full((1, channels), 128, np.uint8), "one_w"),
         numpy_helper.from_array(np.uint8(128), "one_w_zp"),
         numpy_helper.from_array(np.float32(2.0 ** -11), "one_w_scale"),
         numpy_helper.from_array(before, "one_b"),
         numpy_helper.from_array(np.array([channels], np.int64), "bias_shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    plan = compile_model(ir.serde.deserialize_model(model), threads=1)
    [step] = plan.steps
    assert "Sigmoid" in step.op_types
    x = np.array([[0.0], [255 / 256]], np.float32)
    previous = lpt.native.engine.float_lanes(eight_lanes)
    try:
        values = plan.run({"x": x})["y"]
    finally:
        lpt.native.engine.float_lanes(previous)
    expected = onnxruntime_silu(before, clamped=form == "clamped")
    assert np.array_equal(values, np.stack([expected, expected]))
    assert np.array_equal(values, plan.run({"x": x}, keep=True)["y"])
    assert np.all((values[0, :20] == before[:20]) == (form == "clamped"))  # y·1 where clamped, else y·l, l > 1
    if onnxruntime_silu_form() == form:
        assert np.array_equal(values, onnxruntime_output(model, x))
