"""What stays in f32 runs as onnxruntime regions: untyped values, heads after int8 layers, subgraphs."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

import lpt
from lpt import kernels
from lpt.backend import compile_model
from lpt.backend.float_steps import try_float_step
from lpt.crosscheck import run_onnxruntime
from lpt.errors import DataError
from lpt.normalize import normalize
from tests.graphs import ir_model, model
from tests.native.test_native_float_ops import moments_one_by_one
from tests.transformations.builders import RNG, Graph


def regions(plan):
    return [s.op_types for s in plan.steps if s.backend != "int8 kernel"]


def plan_without_onnxruntime(g: Graph, inputs: dict, **build):
    """The graph's FQ model, its int8 graph and that graph's plan, which must hold no onnxruntime session."""
    _, fq_model = g.build(inputs, ["y"], **build)
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    plan = compile_model(int8)
    assert "onnxruntime" not in {s.backend for s in plan.steps}, regions(plan)
    return fq_model, int8, plan


def run_against_numpy_and_onnxruntime(fq_model, int8, plan, x: np.ndarray, **tolerance) -> np.ndarray:
    """The plan's y: the NumPy plan's bits, and onnxruntime's values on the FQ model within `tolerance`."""
    ours = plan.run({"x": x})["y"]
    np.testing.assert_array_equal(ours, compile_model(int8, native=False).run({"x": x})["y"])
    np.testing.assert_allclose(ours, run_onnxruntime(fq_model, {"x": x})["y"], **tolerance)
    return ours


def test_a_head_whose_values_have_no_type_runs_as_one_region():
    """com.microsoft's Gelu is onnxruntime's, unknown to onnx's shape inference: every value after it is untyped."""
    g = Graph()
    conv = g.op("Conv", [g.fq("x", 0.02, np.uint8(128)), g.weight((4, 3, 3, 3)), g.const(np.ones(4, np.float32))],
                pads=[1, 1, 1, 1])
    relu = g.fq(g.op("Relu", [conv]), 0.03, np.uint8(0))
    gelu = g.op("Gelu", [relu])
    g.nodes[-1].domain = "com.microsoft"
    soft = g.op("Softmax", [gelu], axis=1)
    g.op("Reshape", [soft, g.const(np.array([2, -1], np.int64))], name="y")
    proto, fq_model = g.build({"x": [2, 3, 8, 8]}, ["y"], output_shapes={"y": [2, 256]}, extra_opsets={"com.microsoft": 1})
    assert not any(v.name == soft for v in onnx.shape_inference.infer_shapes(proto).graph.value_info)
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    plan = compile_model(int8)
    assert regions(plan) == [("Gelu", "Softmax", "Reshape")]
    x = RNG.uniform(-2, 2, (2, 3, 8, 8)).astype(np.float32)
    ours = plan.run({"x": x})["y"]
    reference = run_onnxruntime(fq_model, {"x": x})["y"]
    assert ours.shape == reference.shape == (2, 256)
    np.testing.assert_allclose(ours, reference, atol=1e-3)  # the int8 layer is within 1 LSB (0.03) at ties


def test_f32_nodes_on_both_sides_of_an_int8_step_run_in_order():
    """Sigmoid(x) feeds the int8 conv and, past it, an Add: it cannot share a region with that Add."""
    g = Graph()
    squashed = g.op("Sigmoid", ["x"])
    conv = g.op("Conv", [g.fq(squashed, 1 / 255, np.uint8(0)), g.weight((3, 3, 1, 1))])
    g.op("Add", [g.fq(conv, 0.02, np.uint8(128)), squashed], name="y")
    _, fq_model = g.build({"x": [1, 3, 4, 4]}, ["y"])
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    plan = compile_model(int8)
    assert regions(plan) == [("Sigmoid",), ("Add",)]
    x = RNG.uniform(-2, 2, (1, 3, 4, 4)).astype(np.float32)
    # ONNX's reference Sigmoid and onnxruntime's may differ in the last bit
    np.testing.assert_allclose(plan.run({"x": x})["y"], lpt.run_reference(int8, {"x": x})["y"], rtol=1e-6)


@pytest.mark.parametrize("side, threads", [(4, 1), (128, 2)])
def test_a_region_of_small_tensors_between_lpts_steps_runs_on_one_thread(side, threads):
    """The same f32 region (com.microsoft's Gelu, onnxruntime's) after a layer: on one thread where its
    tensors are small (waking a second thread for each op costs more than it saves), on the plan's
    threads where the graph says they hold 2^15 values or more; the same values either way."""
    g = Graph()
    conv = g.op("Conv", [g.fq("x", 0.02, np.uint8(128)), g.weight((4, 3, 1, 1)), g.const(np.ones(4, np.float32))])
    g.op("Gelu", [conv], name="y")
    g.nodes[-1].domain = "com.microsoft"
    _, fq_model = g.build({"x": [1, 3, side, side]}, ["y"], output_shapes={"y": [1, 4, side, side]},
                          extra_opsets={"com.microsoft": 1})
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    plan = compile_model(int8, threads=2)
    [region] = [s for s in plan.steps if s.backend == "onnxruntime"]
    assert region.run.threads == threads
    x = RNG.uniform(-2, 2, (1, 3, side, side)).astype(np.float32)
    np.testing.assert_allclose(plan.run({"x": x})["y"], run_onnxruntime(fq_model, {"x": x})["y"], atol=1e-3)


@pytest.mark.parametrize("where", ["graph", "if branch", "none"])
def test_a_region_with_a_recurrent_op_spins_only_while_it_runs(where):
    """An LSTM after a layer (its output, 128 steps × 256, too large for one thread), directly or in an If's
    branch, wakes the region's threads at each step: that region spins while it runs (RECURRENT_OPS); the
    same region with a float32 MatMul in the LSTM's place does not. The values are onnxruntime's either way."""
    g = Graph()
    conv = g.fq(g.op("Conv", [g.fq("x", 0.02, np.uint8(128)), g.weight((4, 3, 1)), g.const(np.ones(4, np.float32))]),
                0.03, np.uint8(128))
    steps = g.op("Transpose", [conv], perm=[2, 0, 1])  # [T, N, C]
    if where == "none":
        g.op("MatMul", [steps, g.const(RNG.normal(0, 0.1, (4, 256)).astype(np.float32))], name="y")
    else:
        weights = [g.const(RNG.normal(0, 0.1, shape).astype(np.float32)) for shape in ((1, 1024, 4), (1, 1024, 256))]
        lstm = helper.make_node("LSTM", [steps, *weights], ["y"], name="lstm", hidden_size=256)
        if where == "graph":
            g.nodes.append(lstm)
        else:
            branch = helper.make_graph([lstm], "recurrent", [], [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
            g.nodes.append(helper.make_node("If", [g.const(np.array(True))], ["y_if"], name="if", then_branch=branch,
                                            else_branch=branch))
            g.op("Identity", ["y_if"], name="y")
    shape = [128, 1, 256] if where == "none" else [128, 1, 1, 256]
    _, fq_model = g.build({"x": [1, 3, 128]}, ["y"], output_shapes={"y": shape})
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    plan = compile_model(int8, threads=2)
    [region] = [s for s in plan.steps if s.backend == "onnxruntime"]
    runner = getattr(region.run, "runner", region.run)  # a region with an If is a SpecializedRegion's (with the engine)
    assert runner.threads == 2 and runner.spin_while_running == (where != "none")
    x = RNG.uniform(-2, 2, (1, 3, 128)).astype(np.float32)
    np.testing.assert_allclose(plan.run({"x": x})["y"], run_onnxruntime(fq_model, {"x": x})["y"], atol=2e-3)


def test_a_subgraph_reads_a_value_another_step_made():
    """An If whose branches read the int8 layer's output from the outer scope."""
    g = Graph()
    conv = g.fq(g.op("Conv", [g.fq("x", 0.02, np.uint8(128)), g.weight((2, 3, 1, 1))]), 0.03, np.uint8(128))
    branch = lambda op, out: helper.make_graph(  # noqa: E731
        [helper.make_node(op, [conv], [out])], op, [], [helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None)])
    g.nodes.append(helper.make_node("If", ["flag"], ["y"], name="if", then_branch=branch("Relu", "r"),
                                    else_branch=branch("Neg", "n")))
    proto = model(g.nodes, {"x": [1, 3, 2, 2]}, {"y": None}, g.inits, opset=17, extra_inputs={"flag": onnx.TensorProto.BOOL})
    fq_model = ir_model(proto)
    normalize(fq_model)
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    plan = compile_model(int8)
    x = RNG.uniform(-2, 2, (1, 3, 2, 2)).astype(np.float32)
    for value in (True, False):
        feeds = {"x": x, "flag": np.array(value)}
        np.testing.assert_array_equal(plan.run(feeds)["y"], lpt.run_reference(int8, feeds)["y"])


def yolo_head_model(path):
    """YOLOv5's Detect on two levels: Conv → Reshape [N, 3, 7, H, W] → Transpose → Sigmoid → Split (xy, wh, conf)
    → xy·2 − 0.5 + grid, (wh·2)² · anchors → Concat → Reshape [N, 3HW, 7]; the levels concatenated."""
    rng = np.random.default_rng(1)
    inits = {"split": np.array([2, 2, 3], np.int64), "two": np.array(2, np.float32), "half": np.array(0.5, np.float32)}
    nodes, levels = [], []
    for level, (size, stride) in enumerate([(8, 2), (4, 4)]):
        def n(name):
            return f"l{level}_{name}"

        inits.update({n("w"): rng.normal(0, 0.3, (21, 3, 3, 3)).astype(np.float32),
                      n("b"): rng.normal(0, 0.1, 21).astype(np.float32),
                      n("grid_shape"): np.array([-1, 3, 7, size, size], np.int64),
                      n("grid"): rng.uniform(0, size, (1, 3, size, size, 2)).astype(np.float32),
                      n("anchors"): rng.uniform(1, 5, (1, 3, 1, 1, 2)).astype(np.float32),
                      n("rows"): np.array([-1, 3 * size * size, 7], np.int64)})
        nodes += [helper.make_node("Conv", ["x", n("w"), n("b")], [n("conv")], pads=[1, 1, 1, 1], strides=[stride] * 2),
                  helper.make_node("Reshape", [n("conv"), n("grid_shape")], [n("cells")]),
                  helper.make_node("Transpose", [n("cells")], [n("last")], perm=[0, 1, 3, 4, 2]),
                  helper.make_node("Sigmoid", [n("last")], [n("s")]),
                  helper.make_node("Split", [n("s"), "split"], [n("xy"), n("wh"), n("conf")], axis=4),
                  helper.make_node("Mul", [n("xy"), "two"], [n("xy2")]),
                  helper.make_node("Sub", [n("xy2"), "half"], [n("xy3")]),
                  helper.make_node("Add", [n("xy3"), n("grid")], [n("xy4")]),
                  helper.make_node("Mul", [n("wh"), "two"], [n("wh2")]),
                  helper.make_node("Pow", [n("wh2"), "two"], [n("wh3")]),
                  helper.make_node("Mul", [n("wh3"), n("anchors")], [n("wh4")]),
                  helper.make_node("Concat", [n("xy4"), n("wh4"), n("conf")], [n("boxes")], axis=4),
                  helper.make_node("Reshape", [n("boxes"), n("rows")], [n("out")])]
        levels.append(n("out"))
    nodes.append(helper.make_node("Concat", levels, ["y"], axis=1))
    onnx.save(model(nodes, {"x": ["N", 3, 16, 16]}, {"y": None}, inits, opset=13), path)


def test_a_detection_head_quantizes_and_keeps_every_rank(tmp_path):
    yolo_head_model(tmp_path / "head.onnx")
    data = {"x": RNG.uniform(0, 1, (8, 3, 16, 16)).astype(np.float32)}
    result = lpt.quantize(tmp_path / "head.onnx", data, subset_size=8)
    ours = result.run(data)["y"]
    fp32 = run_onnxruntime(lpt.read_model(tmp_path / "head.onnx"), data)["y"]
    assert ours.shape == fp32.shape == (8, 240, 7)
    assert result.report.agreement.outputs["y"].sqnr_db > 30
    assert result.report.check.max_lsb <= 1


def test_a_third_party_qdq_detection_head_runs_on_lpt(tmp_path):
    """onnxruntime's quantize_static around every op of the head: unnamed nodes, many DQ → op → Q chains."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = iter([{"x": data["x"][i:i + 1]} for i in range(len(data["x"]))])

        def get_next(self):
            return next(self.samples, None)

    yolo_head_model(tmp_path / "head.onnx")
    data = {"x": RNG.uniform(0, 1, (8, 3, 16, 16)).astype(np.float32)}
    quantize_static(str(tmp_path / "head.onnx"), str(tmp_path / "head.qdq.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, op_types_to_quantize=["Conv", "Reshape", "Transpose", "Sigmoid", "Split", "Mul",
                                                            "Add", "Sub", "Pow", "Concat"])
    result = lpt.quantize(tmp_path / "head.qdq.onnx", data, subset_size=8)
    assert result.report.calibration is None  # already fake-quantized
    assert result.run(data)["y"].shape == (8, 240, 7)
    assert result.report.check.max_lsb <= 1


@pytest.mark.parametrize("opset", [11, 12])
def test_an_old_opset_model_gets_per_channel_weights_at_opset_13(tmp_path, opset):
    rng = np.random.default_rng(2)
    inits = {"w": rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "b": rng.normal(0, 0.1, 4).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    onnx.save(model(nodes, {"x": ["N", 3, 8, 8]}, {"y": None}, inits, opset=opset), tmp_path / "old.onnx")
    data = {"x": RNG.uniform(-1, 1, (4, 3, 8, 8)).astype(np.float32)}
    result = lpt.quantize(tmp_path / "old.onnx", data, subset_size=4)
    fq_path, _ = result.save(tmp_path / "old")
    saved = onnx.load(fq_path)
    onnx.checker.check_model(saved, full_check=True)
    assert next(o.version for o in saved.opset_import if o.domain == "") == 13
    assert any(n.op_type == "DequantizeLinear" and any(a.name == "axis" for a in n.attribute) for n in saved.graph.node)
    run_onnxruntime(saved, data)  # loads and runs
    assert result.report.check.max_lsb <= 1


def test_a_dynamically_quantized_model_runs_as_it_is(tmp_path):
    """onnxruntime's quantize_dynamic output (DynamicQuantizeLinear + ConvInteger): no calibration, lpt's backend."""
    from onnxruntime.quantization import quantize_dynamic

    rng = np.random.default_rng(3)
    inits = {"w": rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "b": rng.normal(0, 0.1, 4).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    onnx.save(model(nodes, {"x": ["N", 3, 8, 8]}, {"y": None}, inits, opset=13), tmp_path / "fp32.onnx")
    quantize_dynamic(tmp_path / "fp32.onnx", tmp_path / "dynamic.onnx", op_types_to_quantize=["Conv"])
    assert "ConvInteger" in {n.op_type for n in onnx.load(tmp_path / "dynamic.onnx").graph.node}
    data = {"x": RNG.uniform(-1, 1, (4, 3, 8, 8)).astype(np.float32)}
    result = lpt.quantize(tmp_path / "dynamic.onnx", data, subset_size=4)
    assert result.report.calibration is None
    assert ("DynamicQuantizeLinear",) in [s.op_types[:1] for s in result.plan.steps if s.backend == "int8 kernel"]
    ours = result.run(data)["y"]
    np.testing.assert_allclose(ours, lpt.run_reference(lpt.read_model(tmp_path / "dynamic.onnx"), data)["y"],
                               rtol=1e-5, atol=1e-5)


def test_an_op_no_runtime_knows_is_named():
    g = Graph()
    g.op("Relu", [g.op("Frobnicate", [g.fq("x", 0.02, np.uint8(128))])], name="y")
    g.nodes[-2].domain = "example.custom"
    _, m = g.build({"x": [2, 3]}, ["y"], output_shapes={"y": [2, 3]}, extra_opsets={"example.custom": 1})
    lpt.transform(m)
    with pytest.raises(lpt.ModelError, match=r"no runtime lpt uses has the op example.custom::Frobnicate"):
        compile_model(m)


def test_float_ops_between_int8_layers_are_lpts_and_keep_one_native_program():
    """The HardSwish, average pool, squeeze-excite scale and concat between two int8 layers are lpt's float32
    steps, and so is a HardSwish on the model's input that only the first layer's quantization reads; with the
    native engine the layers and those ops run as one program, with the bits of lpt's kernels and close to
    onnxruntime."""
    import lpt.native
    from lpt.backend.float_steps import BACKEND
    from lpt.backend.native_program import ENGINE

    g = Graph()
    first = g.op("Conv", [g.fq(g.op("HardSwish", ["x"]), 0.02, np.uint8(128)), g.weight((8, 3, 3, 3)),
                          g.const(np.ones(8, np.float32))], pads=[1, 1, 1, 1])
    swish = g.op("HardSwish", [first])
    gate = g.op("Sigmoid", [g.op("Conv", [g.fq(g.op("GlobalAveragePool", [swish]), 0.05, np.uint8(0)),
                                          g.weight((8, 8, 1, 1))])])
    scaled = g.op("Concat", [g.op("Mul", [swish, gate]), first], axis=1)
    pooled = g.op("AveragePool", [scaled], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    g.op("Conv", [g.fq(pooled, 0.05, np.uint8(100)), g.weight((4, 16, 1, 1))], name="y")
    _, fq_model = g.build({"x": [2, 3, 8, 8]}, ["y"])
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    plan = compile_model(int8)
    assert [s.op_types for s in plan.steps if s.backend == "onnxruntime"] == []
    assert {s.op_types[0] for s in plan.steps if s.backend == BACKEND} == {
        "HardSwish", "GlobalAveragePool", "Mul", "Concat", "AveragePool"}
    x = RNG.uniform(-3, 3, (2, 3, 8, 8)).astype(np.float32)
    ours = plan.run({"x": x})["y"]
    np.testing.assert_array_equal(ours, compile_model(int8, native=False).run({"x": x})["y"])
    np.testing.assert_allclose(ours, run_onnxruntime(int8, {"x": x})["y"], rtol=1e-5, atol=1e-5)
    if lpt.native.available():
        assert [s.engine for s in plan.run_steps] == [ENGINE]


def test_a_token_embedding_starts_the_native_program_and_refuses_an_index_outside_its_table():
    import lpt.native
    from lpt.backend.native_program import ENGINE
    from lpt.errors import DataError

    g = Graph()
    embedded = g.op("Gather", [g.const(g.rng.normal(size=(11, 8)).astype(np.float32)), "tokens"])
    positioned = g.op("Add", [embedded, g.const(g.rng.normal(size=(1, 5, 8)).astype(np.float32))])
    g.op("MatMul", [g.fq(positioned, 0.03, np.uint8(128)), g.weight((8, 4), axis=1)], name="y")
    proto, fq_model = g.build({"tokens": [None, 5]}, ["y"])
    proto.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.INT64
    fq_model = ir_model(proto)
    normalize(fq_model)
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    plan = compile_model(int8)
    assert not [s for s in plan.steps if s.backend == "onnxruntime"]
    tokens = np.array([[0, 3, 10, -1, 4], [2, 2, 9, 0, -11]], np.int64)
    # against the fake-quantized model: onnxruntime's u8×s8 MatMulInteger saturates on a CPU without VNNI
    np.testing.assert_allclose(plan.run({"tokens": tokens})["y"], run_onnxruntime(fq_model, {"tokens": tokens})["y"],
                               rtol=1e-5, atol=1e-5)
    if lpt.native.available():
        assert [s.engine for s in plan.run_steps] == [ENGINE]
    with pytest.raises(DataError, match="Gather.*outside"):
        plan.run({"tokens": np.array([[0, 1, 2, 3, 11]], np.int64)})


def test_a_layer_norm_written_out_is_lpts():
    """ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add between two int8 layers (openWakeWord's
    models): lpt's float32 steps, in the layers' native program, with the bits of lpt's kernels."""
    g = Graph()
    x = g.op("MatMul", [g.fq("x", 0.03, np.uint8(128)), g.weight((8, 16), axis=1)])
    mean = g.op("ReduceMean", [x], axes=[-1])
    centred = g.op("Sub", [x, mean])
    variance = g.op("ReduceMean", [g.op("Pow", [centred, g.const(np.float32(2.0))])], axes=[-1])
    deviation = g.op("Sqrt", [g.op("Add", [variance, g.const(np.float32(1e-5))])])
    normed = g.op("Add", [g.op("Mul", [g.op("Div", [centred, deviation]), g.const(np.full(16, 1.5, np.float32))]),
                          g.const(np.full(16, 0.1, np.float32))])
    g.op("MatMul", [g.fq(normed, 0.05, np.uint8(128)), g.weight((16, 4), axis=1)], name="y")
    _, fq_model = g.build({"x": [3, 8]}, ["y"])
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    plan = compile_model(int8)
    assert [s.op_types for s in plan.steps if s.backend == "onnxruntime"] == []
    x_values = RNG.uniform(-3, 3, (3, 8)).astype(np.float32)
    ours = plan.run({"x": x_values})["y"]
    np.testing.assert_array_equal(ours, compile_model(int8, native=False).run({"x": x_values})["y"])
    np.testing.assert_allclose(ours, run_onnxruntime(fq_model, {"x": x_values})["y"], atol=0.05)  # an LSB at ties


def test_a_global_max_of_channels_last_maps_is_lpts():
    """Conv → Transpose to [N, H, W, C] → ReduceMax over H and W → a dense layer (DNSMOS's Keras tail): the
    max a step of lpt's in the layers' native program, its transpose no copy; onnxruntime's values."""
    import lpt.native

    g = Graph()
    conv = g.op("Conv", [g.fq("x", 0.02, np.uint8(128)), g.weight((16, 3, 3, 3)), g.const(np.ones(16, np.float32))],
                pads=[1, 1, 1, 1])
    maps = g.op("Transpose", [g.op("Relu", [conv])], perm=[0, 2, 3, 1])
    pooled = g.op("ReduceMax", [maps], axes=[1, 2], keepdims=0)
    g.op("MatMul", [g.fq(pooled, 0.05, np.uint8(0)), g.weight((16, 4), axis=1)], name="y")
    fq_model, int8, plan = plan_without_onnxruntime(g, {"x": [2, 3, 9, 7]})
    assert regions(plan) == [("Transpose",), ("ReduceMax",)]
    # the same levels: the dense layer's float32 sums differ in their last bits at most
    run_against_numpy_and_onnxruntime(fq_model, int8, plan, RNG.uniform(-2, 2, (2, 3, 9, 7)).astype(np.float32),
                                      rtol=1e-6, atol=1e-5)
    if lpt.native.available():
        assert len(plan.run_steps) == 1


def test_a_float_max_pool_and_a_squeeze_of_every_axis_of_one_are_lpts():
    """PLCMOS's float32 MaxPool after a LeakyRelu layer, and its head: a Squeeze without axes → Sigmoid →
    Mul → Add, whose shapes onnx cannot infer (the Squeeze's rank depends on the batch). lpt's steps, no
    onnxruntime session, onnxruntime's values."""
    import lpt.native

    g = Graph()
    conv = g.op("Conv", [g.fq("x", 0.02, np.uint8(128)), g.weight((8, 2, 1, 3)), g.const(np.ones(8, np.float32))],
                pads=[0, 1, 0, 1])
    pooled = g.op("MaxPool", [g.op("LeakyRelu", [conv], alpha=0.1)], kernel_shape=[1, 4], strides=[1, 4])
    flat = g.op("Reshape", [g.fq(pooled, 0.05, np.uint8(20)), g.const(np.int64([0, -1]))])  # [N, 32]
    dense = g.op("MatMul", [flat, g.weight((32, 1), axis=1)])  # [N, 1]
    score = g.op("Sigmoid", [g.op("Squeeze", [dense])])
    g.op("Add", [g.op("Mul", [score, g.const(np.float32(4.0))]), g.const(np.float32(1.0))], name="y")
    fq_model, int8, plan = plan_without_onnxruntime(g, {"x": [1, 2, 1, 16]}, output_shapes={"y": []})
    x = RNG.uniform(-2, 2, (1, 2, 1, 16)).astype(np.float32)
    assert run_against_numpy_and_onnxruntime(fq_model, int8, plan, x, rtol=1e-6).shape == ()
    if lpt.native.available():
        assert {("squeeze", ()), ("max_pool", ((1, 4), (1, 4), (1, 1), (0, 0, 0, 0)))} <= {s.native for s in plan.steps}


def test_a_zero_padding_before_the_first_layer_is_lpts():
    """openWakeWord's embedding model: its input quantized, then a Keras ZeroPadding2D (a constant Pad on
    [N, H, W, C]) before the first convolution. lpt's step (on the 8-bit values), in the layers' native
    program, with onnxruntime's values."""
    import lpt.native

    g = Graph()
    padded = g.op("Pad", [g.fq("x", 0.02, np.uint8(128)), g.const(np.int64([0, 0, 1, 0, 0, 0, 1, 0]))])
    maps = g.op("Transpose", [padded], perm=[0, 3, 1, 2])
    g.op("Conv", [maps, g.weight((4, 1, 3, 3)), g.const(np.ones(4, np.float32))], name="y")
    fq_model, int8, plan = plan_without_onnxruntime(g, {"x": [1, 6, 5, 1]})
    ours = run_against_numpy_and_onnxruntime(fq_model, int8, plan, RNG.uniform(-2, 2, (1, 6, 5, 1)).astype(np.float32),
                                             rtol=1e-6, atol=1e-5)
    assert ours.shape == (1, 4, 4, 5)  # W padded 5 → 7, then a 3×3 convolution without pads
    if lpt.native.available():
        assert len(plan.run_steps) == 1


def gelu_between_two_layers(swap: bool, layer_output_read_elsewhere: bool):
    """Div(x, √2) → Erf → Add(1) → Mul(x) → Mul(0.5) between two int8 layers (PaddleOCR's exports), the
    operands of its Add and Muls on either side; with `layer_output_read_elsewhere`, x is a model output too."""
    g = Graph()
    x = g.op("MatMul", [g.fq("x", 0.03, np.uint8(128)), g.weight((8, 16), axis=1)])
    e = g.op("Erf", [g.op("Div", [x, g.const(np.float32(1.4142135))])])
    one, half = g.const(np.float32(1.0)), g.const(np.float32(0.5))
    shifted = g.op("Add", [one, e] if swap else [e, one])
    product = g.op("Mul", [shifted, x] if swap else [x, shifted])
    y = g.op("Mul", [half, product] if swap else [product, half])
    g.op("MatMul", [g.fq(y, 0.05, np.uint8(10)), g.weight((16, 4), axis=1)], name="y")
    _, fq_model = g.build({"x": [64, 8]}, ["y", x] if layer_output_read_elsewhere else ["y"])
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    return fq_model, int8


@pytest.mark.parametrize("operands", ["as paddle writes them", "swapped"])
def test_a_gelu_written_out_is_one_step_with_the_bits_of_its_five_ops(operands):
    """A GELU whose input is also read elsewhere: one float32 step and one instruction of the layers'
    native program, with the bits of the five ops one by one (lpt's erf)."""
    import lpt.native

    fq_model, int8 = gelu_between_two_layers(operands == "swapped", layer_output_read_elsewhere=True)
    plan = compile_model(int8)
    [step] = [s for s in plan.steps if "Erf" in s.op_types]
    assert step.op_types == ("Div", "Erf", "Add", "Mul", "Mul") and step.native[0] == "gelu"
    if lpt.native.available():
        assert len(plan.run_steps) == 1 and plan.run_steps[0].engine == "native program"
    x_values = RNG.uniform(-3, 3, (64, 8)).astype(np.float32)
    ours = plan.run({"x": x_values})["y"]
    np.testing.assert_array_equal(ours, compile_model(int8, native=False).run({"x": x_values})["y"])
    np.testing.assert_allclose(ours, run_onnxruntime(fq_model, {"x": x_values})["y"], atol=0.05)  # an LSB at ties


@pytest.mark.parametrize("operands", ["as paddle writes them", "swapped"])
def test_a_gelu_read_by_a_quantize_alone_is_the_layers_post_op_with_the_same_bits(operands):
    """The same GELU, its input read by nothing else: a post-op of the layer's output stage, so the layer
    writes 8-bit values instead of float32 ones for the GELU to read; the values are those of the GELU
    as its own step, bit for bit, on the engine and on the NumPy kernels."""
    swap = operands == "swapped"
    fq_model, int8 = gelu_between_two_layers(swap, layer_output_read_elsewhere=False)
    plan = compile_model(int8)
    [step] = [s for s in plan.steps if "Erf" in s.op_types]
    assert step.op_types[:3] == ("MatMulInteger", "Cast", "Mul") and step.op_types[-1] == "QuantizeLinear"
    assert step.layer.post_ops == (kernels.Gelu(np.float32(1.4142135), 1.0, 0.5),)
    _, separate = gelu_between_two_layers(swap, layer_output_read_elsewhere=True)
    x_values = RNG.uniform(-3, 3, (64, 8)).astype(np.float32)
    ours = plan.run({"x": x_values})["y"]
    np.testing.assert_array_equal(ours, compile_model(separate).run({"x": x_values})["y"])
    np.testing.assert_array_equal(ours, compile_model(int8, native=False).run({"x": x_values})["y"])
    np.testing.assert_allclose(ours, run_onnxruntime(fq_model, {"x": x_values})["y"], atol=0.05)  # an LSB at ties


def activation_between_two_layers(activation: str, swap: bool, layer_output_read_elsewhere: bool):
    """Conv → an activation → a quantized Conv: Sigmoid → Mul(x, sigmoid(x)) (YOLO's SiLU, as ddddocr's exports
    write it), HardSigmoid → Mul(x, hard_sigmoid(x)) (a hard swish before opset 14), or a HardSwish node."""
    g = Graph()
    x = g.op("Conv", [g.fq("x", 0.03, np.uint8(128)), g.weight((8, 3, 3, 3)), g.const(np.zeros(8, np.float32))],
             pads=[1, 1, 1, 1])
    if activation == "HardSwish":
        y = g.op("HardSwish", [x])
    else:
        gate = g.op("Sigmoid", [x]) if activation == "SiLU" else g.op("HardSigmoid", [x], alpha=0.2, beta=0.5)
        y = g.op("Mul", [gate, x] if swap else [x, gate])
    g.op("Conv", [g.fq(y, 0.05, np.uint8(10)), g.weight((4, 8, 1, 1))], name="y")
    _, fq_model = g.build({"x": [2, 3, 6, 6]}, ["y", x] if layer_output_read_elsewhere else ["y"])
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    return fq_model, int8


@pytest.mark.parametrize("activation, operands, post_op", [
    ("SiLU", "x · f(x)", kernels.Silu()), ("SiLU", "f(x) · x", kernels.Silu()),
    ("hard swish", "x · f(x)", kernels.HardSwish(float(np.float32(0.2)), 0.5)),
    ("hard swish", "f(x) · x", kernels.HardSwish(float(np.float32(0.2)), 0.5)),
    ("HardSwish", "", kernels.HardSwish(float(np.float32(1 / 6)), 0.5))])
def test_an_activation_read_by_a_quantize_alone_is_the_layers_post_op_with_the_same_bits(activation, operands, post_op):
    """A SiLU or a hard swish: a post-op of the layer's output stage (the layer writes 8-bit values, not float32
    ones for the activation's ops to read), with the bits of those ops as their own steps."""
    swap = operands == "f(x) · x"
    fq_model, int8 = activation_between_two_layers(activation, swap, layer_output_read_elsewhere=False)
    plan = compile_model(int8)
    [step] = [s for s in plan.steps if s.layer is not None and s.layer.post_ops]
    assert step.op_types[:3] == ("ConvInteger", "Cast", "Mul") and step.op_types[-1] == "QuantizeLinear"
    assert step.layer.post_ops == (post_op,)
    _, separate = activation_between_two_layers(activation, swap, layer_output_read_elsewhere=True)
    assert not [s for s in compile_model(separate).steps if s.layer is not None and s.layer.post_ops]
    x_values = RNG.uniform(-3, 3, (2, 3, 6, 6)).astype(np.float32)
    ours = plan.run({"x": x_values})["y"]
    np.testing.assert_array_equal(ours, compile_model(separate).run({"x": x_values})["y"])
    np.testing.assert_array_equal(ours, compile_model(int8, native=False).run({"x": x_values})["y"])
    np.testing.assert_allclose(ours, run_onnxruntime(fq_model, {"x": x_values})["y"], atol=0.05)  # an LSB at ties


def test_a_float_op_between_two_parts_of_one_onnxruntime_region_stays_in_it():
    """Sub(x, ReduceMax(x)) → Softplus: the Sub reads an int8 layer's output, but lpt takes neither the
    ReduceMax before it nor the Softplus after it; taken, it would cut their region in two sessions."""
    g = Graph()
    x = g.op("MatMul", [g.fq("x", 0.03, np.uint8(128)), g.weight((8, 16), axis=1)])
    softened = g.op("Softplus", [g.op("Sub", [x, g.op("ReduceMax", [x], axes=[-1])])])
    g.op("MatMul", [g.fq(softened, 0.05, np.uint8(0)), g.weight((16, 4), axis=1)], name="y")
    _, fq_model = g.build({"x": [3, 8]}, ["y"])
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    plan = compile_model(int8)
    assert [s.op_types for s in plan.steps if s.backend == "onnxruntime"] == [("ReduceMax", "Sub", "Softplus")]


def test_batch_norm_swish_and_squeezes_after_a_layer_are_lpts():
    """PaddleOCR's exports: Conv → Identity → BatchNormalization → Sigmoid → Mul (a swish), then HardSigmoid →
    Mul, Unsqueeze/Squeeze; TensorFlow's LeakyRelu → Max(c): lpt's float32 steps, with the bits of lpt's
    kernels, close to onnxruntime."""
    from lpt.backend.float_steps import BACKEND

    g = Graph()
    conv = g.op("Identity", [g.op("Conv", [g.fq("x", 0.02, np.uint8(128)), g.weight((6, 3, 3, 3))], pads=[1, 1, 1, 1])])
    stats = [g.const(g.rng.uniform(0.5, 1.5, 6).astype(np.float32)) for _ in range(2)]
    normed = g.op("BatchNormalization", [conv, stats[0], g.const(g.rng.normal(size=6).astype(np.float32)),
                                         g.const(g.rng.normal(size=6).astype(np.float32)), stats[1]], epsilon=1e-3)
    swish = g.op("Max", [g.op("LeakyRelu", [g.op("Mul", [normed, g.op("Sigmoid", [normed])])], alpha=0.2),
                         g.const(np.float32(-0.1))])
    gated = g.op("Mul", [swish, g.op("HardSigmoid", [swish], alpha=0.2, beta=0.5)])
    squeezed = g.op("Squeeze", [g.op("Unsqueeze", [gated, g.const(np.array([0], np.int64))]),
                                g.const(np.array([0], np.int64))])
    g.op("Conv", [g.fq(squeezed, 0.05, np.uint8(128)), g.weight((4, 6, 1, 1))], name="y")
    _, fq_model = g.build({"x": [2, 3, 8, 8]}, ["y"])
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    plan = compile_model(int8)
    # (the Identity right after the Conv belongs to the layer's chain)
    assert {s.op_types[0] for s in plan.steps if s.backend == BACKEND} == {
        "BatchNormalization", "Sigmoid", "Mul", "LeakyRelu", "Max", "HardSigmoid", "Unsqueeze", "Squeeze"}
    assert not [s for s in plan.steps if s.backend == "onnxruntime"]
    x = RNG.uniform(-3, 3, (2, 3, 8, 8)).astype(np.float32)
    ours = plan.run({"x": x})["y"]
    np.testing.assert_array_equal(ours, compile_model(int8, native=False).run({"x": x})["y"])
    np.testing.assert_allclose(ours, run_onnxruntime(fq_model, {"x": x})["y"], atol=0.1)  # an LSB at ties


def test_a_dynamically_quantized_swish_keeps_onnxruntimes_sigmoid(tmp_path):
    """ddddocr's old model: Conv → Sigmoid·x, quantized by quantize_dynamic, so the next layer's scale comes
    from its input's range at run time. lpt's own Sigmoid, a few float32 steps from onnxruntime's, could
    move that range and every level with it: in such a plan the Sigmoid is onnxruntime's, inside the layer's
    step on the native engine (lpt.backend.dynamic_layers) where lpt knows the form of onnxruntime's fused SiLU on
    this CPU, else in an onnxruntime region, and the outputs are onnxruntime's to the bit."""
    import lpt.native
    from lpt.backend.dynamic_layers import onnxruntime_silu_form
    from onnxruntime.quantization import quantize_dynamic

    rng = np.random.default_rng(4)
    inits = {"w": rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "v": rng.normal(0, 0.3, (5, 4, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Mul", ["c", "s"], ["swish"]), helper.make_node("Conv", ["swish", "v"], ["y"])]
    onnx.save(model(nodes, {"x": ["N", 3, 8, 8]}, {"y": None}, inits, opset=13), tmp_path / "fp32.onnx")
    quantize_dynamic(tmp_path / "fp32.onnx", tmp_path / "dynamic.onnx", op_types_to_quantize=["Conv"])
    dynamic = lpt.read_model(tmp_path / "dynamic.onnx")
    int8 = lpt.clone(dynamic)
    lpt.transform(int8)
    plan = compile_model(int8)
    [step] = [s for s in plan.steps if "Sigmoid" in s.op_types]
    if lpt.native.available() and onnxruntime_silu_form() is not None:
        assert step.native[0] == "dynamic_layer"
    else:
        assert step.backend == "onnxruntime"
    x = RNG.uniform(-2, 2, (4, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(plan.run({"x": x})["y"], run_onnxruntime(dynamic, {"x": x})["y"])


def test_reshapes_to_shapes_computed_at_run_time_are_lpts_steps():
    """ddddocr's classifier: Reshape([T, N, C] → [T·N, C]) before a MatMul and back after it, each target a
    Concat of the input's Shape: numpy's reshapes (an onnxruntime session each before), with the same values,
    and a target the input cannot take a one-line DataError."""
    g = Graph()
    x = g.fq("x", 0.03, np.uint8(128))
    sizes = g.op("Shape", ["x"])
    steps_and_batch = g.op("Slice", [sizes, g.const(np.array([0], np.int64)), g.const(np.array([2], np.int64))])
    flat = g.op("Reshape", [x, g.op("Concat", [g.const(np.array([-1], np.int64)), g.op("Slice", [
        sizes, g.const(np.array([2], np.int64)), g.const(np.array([3], np.int64))])], axis=0)])
    y = g.op("MatMul", [flat, g.weight((16, 6), axis=1)])
    g.op("Reshape", [g.op("Add", [y, g.const(np.linspace(-1, 1, 6).astype(np.float32))]),
                     g.op("Concat", [steps_and_batch, g.const(np.array([-1], np.int64))], axis=0)], name="out")
    _, fq_model = g.build({"x": ["T", "N", 16]}, ["out"])
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    plan = compile_model(int8)
    reshapes = [s for s in plan.steps if s.op_types == ("Reshape",)]
    assert len(reshapes) == 2 and all(s.backend != "onnxruntime" for s in reshapes)
    # the shapes' arithmetic: lpt.backend.shape_steps (tests/test_shape_steps.py), an onnxruntime session before
    assert [s.backend for s in plan.steps].count("onnxruntime") == 0
    assert [s.op_types for s in plan.steps if s.backend == "lpt shapes"] == [("Shape", "Slice", "Slice", "Concat", "Concat")]
    x_values = RNG.uniform(-3, 3, (5, 2, 16)).astype(np.float32)
    ours = plan.run({"x": x_values})["out"]
    assert ours.shape == (5, 2, 6)
    np.testing.assert_array_equal(ours, compile_model(int8, native=False).run({"x": x_values})["out"])
    np.testing.assert_allclose(ours, run_onnxruntime(fq_model, {"x": x_values})["out"], rtol=1e-5, atol=1e-4)
    step = reshapes[0]
    with pytest.raises(lpt.DataError, match="cannot take the shape"):
        step.run(np.zeros((5, 2, 16), np.uint8), np.array([-1, 7], np.int64))


def jax2tf_convolution() -> tuple[Graph, str]:
    """magika's middle, as jax2tf writes it: [N, T, C] quantized, Unsqueeze to [N, T, C, 1], a Slice of
    every value, Transpose to [N, C, T, 1], a 5×1 convolution, a Slice of every value and a Squeeze to
    [N, C', T'], the bias Add (its output's name returned too), GELU's tanh approximation in nine ops,
    GlobalMaxPool, Squeeze."""
    g = Graph()
    x = g.op("Unsqueeze", [g.fq("x", 0.03, np.uint8(128)), g.const(np.int64([3]))])
    whole = g.op("Slice", [x, g.const(np.int64([0, 0, 0, 0])), g.const(np.int64([10**9] * 4)),
                           g.const(np.int64([0, 2, 1, 3])), g.const(np.int64([1, 1, 1, 1]))])
    conv = g.op("Conv", [g.op("Transpose", [whole], perm=[0, 2, 1, 3]), g.weight((12, 16, 5, 1))])
    cut = g.op("Slice", [conv, g.const(np.int64([0, 0, 0, 0])), g.const(np.int64([2**31 - 1] * 3 + [1])),
                         g.const(np.int64([0, 1, 2, 3]))])
    v = g.op("Add", [g.op("Squeeze", [cut, g.const(np.int64([3]))]),
                     g.const(np.linspace(-1, 1, 12).astype(np.float32).reshape(1, 12, 1))])
    cubed = g.op("Mul", [v, g.op("Mul", [v, g.op("Mul", [g.const(np.float32(0.044715)), v])])])
    inner = g.op("Mul", [g.const(np.float32(0.7978846)), g.op("Add", [v, cubed])])
    shifted = g.op("Add", [g.const(np.ones((1, 1, 1), np.float32)), g.op("Tanh", [inner])])
    gelu = g.op("Mul", [v, g.op("Mul", [g.const(np.float32(0.5)), shifted])])
    g.op("Squeeze", [g.op("GlobalMaxPool", [gelu]), g.const(np.int64([2]))], name="y")
    return g, v


def test_a_jax2tf_convolution_tail_is_lpts_with_the_bits_of_its_ops():
    """magika's middle in one native program that keeps running natively (two images: the bias broadcast
    over both): the Slices, Transpose and Squeezes lpt's layout steps, the nine GELU ops one step with the bits
    of the nine one by one (lpt's tanh), the global max lpt's; onnxruntime's values within its tanh's."""
    import lpt.native
    from lpt.numerics.exp import tanh

    g, v_name = jax2tf_convolution()
    fq_model, int8, plan = plan_without_onnxruntime(g, {"x": ["N", 30, 16]})
    [gelu] = [s for s in plan.steps if "Tanh" in s.op_types]
    assert gelu.op_types == ("Mul", "Mul", "Mul", "Add", "Mul", "Tanh", "Add", "Mul", "Mul")
    assert {s.native[0] for s in plan.steps if s.op_types in (("Slice",), ("GlobalMaxPool",))} == {"slice", "global_max"}
    x = RNG.uniform(-3, 3, (2, 30, 16)).astype(np.float32)
    ours = run_against_numpy_and_onnxruntime(fq_model, int8, plan, x, rtol=1e-5, atol=1e-5)
    v = compile_model(int8, native=False).run({"x": x}, keep=True)[v_name]
    cube, root, one, half = np.float32(0.044715), np.float32(0.7978846), np.float32(1), np.float32(0.5)
    one_by_one = v * (half * (one + tanh(root * (v + v * (v * (cube * v))))))
    np.testing.assert_array_equal(ours, one_by_one.max(axis=2))
    if lpt.native.available():
        [program] = plan.run_steps
        assert program.run.native, "the program gave way to its steps"


def layer_and_rows(g: Graph) -> tuple[str, str]:
    """A layer's float32 output [N, 6] from the input x [N, 5], and [M, 1] computed from the input rows' shape
    [M, 2] (as jax2tf computes a Reshape's shape from the model input's batch)."""
    x = g.op("MatMul", [g.fq("x", 0.03, np.uint8(128)), g.weight((5, 6), axis=1)])
    rows = g.op("Concat", [g.op("Slice", [g.op("Shape", ["rows"]), g.const(np.int64([0])), g.const(np.int64([1]))]),
                           g.const(np.int64([1]))], axis=0)
    return x, rows


def plan_with_rows(g: Graph, path):
    """(FQ model, int8 model, plan, its onnxruntime regions) of layer_and_rows' graph, loaded as lpt loads it
    (shape inference that propagates the shape's values, and cannot tie M to N)."""
    proto, _ = g.build({"x": ["N", 5], "rows": ["M", 2]}, ["y"])
    onnx.save(proto, path)
    fq_model = lpt.load(path)
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    plan = compile_model(int8)
    return fq_model, int8, plan, [s.op_types for s in plan.steps if s.backend == "onnxruntime"]


def test_a_jax2tf_layer_norm_of_rows_whose_shapes_come_from_another_input(tmp_path):
    """magika's second LayerNorm: over axis 1 of [N, C], its Reshapes and Expands given [M, 1] computed from
    another tensor's shape (here another input's), which shape inference (lpt.load's, propagating the
    shape's values) cannot tie to N. It is one step of lpt's in the native program, with the ops' values
    one at a time, when M is N at the run; when it is not, onnxruntime refuses the Reshape, and lpt says
    why in one line."""
    from lpt.errors import DataError

    g = Graph()
    x, rows = layer_and_rows(g)
    factor = g.const(np.float32(1 / 6))
    mean = g.op("Mul", [g.op("ReduceSum", [x, g.const(np.int64([1]))], keepdims=0), factor])
    second = g.op("Mul", [g.op("ReduceSum", [g.op("Mul", [x, x]), g.const(np.int64([1]))], keepdims=0), factor])
    positive = g.op("Max", [g.const(np.float32(0)), g.op("Sub", [second, g.op("Mul", [mean, mean])])])
    variance = g.op("Expand", [g.op("Reshape", [positive, rows]), rows])
    inverse = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [variance, g.const(np.float32(1e-6))])])])
    gamma, beta = np.linspace(0.5, 2, 6).astype(np.float32), np.linspace(-1, 1, 6).astype(np.float32)
    scale = g.op("Mul", [inverse, g.const(gamma.reshape(1, 6))])
    centered = g.op("Sub", [x, g.op("Expand", [g.op("Reshape", [mean, rows]), rows])])
    normed = g.op("Add", [g.op("Mul", [centered, scale]), g.const(beta.reshape(1, 6))])
    g.op("MatMul", [g.fq(normed, 0.02, np.uint8(128)), g.weight((6, 3), axis=1)], name="y")
    fq_model, int8, plan, sessions = plan_with_rows(g, tmp_path / "norm.onnx")
    assert sessions == []  # the rows' shape is lpt.backend.shape_steps'
    assert [s.op_types for s in plan.steps if s.backend == "lpt shapes"] == [("Shape", "Slice", "Concat")]
    [norm] = [s for s in plan.steps if "ReduceSum" in s.op_types]
    assert len(norm.op_types) == 19 and norm.native[0] == "moment_layer_norm"
    feeds = {"x": RNG.uniform(-3, 3, (4, 5)).astype(np.float32), "rows": np.zeros((4, 2), np.float32)}
    ours = plan.run(feeds)["y"]
    np.testing.assert_array_equal(ours, compile_model(int8, native=False).run(feeds)["y"])
    np.testing.assert_allclose(ours, run_onnxruntime(fq_model, feeds)["y"], atol=0.05)
    values = compile_model(int8, native=False).run(feeds, keep=True)
    np.testing.assert_array_equal(values[norm.outputs[0]],
                                  moments_one_by_one(values[norm.inputs[0]], np.float32(1 / 6), np.float32(1e-6), gamma, beta))
    if lpt.native.available():  # the layer norm's program and the layer's before the shapes' region
        [program] = [s for s in plan.run_steps if "ReduceSum" in s.op_types]
        assert program.run.native, "the program gave way to its steps"
    feeds["rows"] = np.zeros((3, 2), np.float32)
    with pytest.raises(Exception):
        run_onnxruntime(fq_model, feeds)
    with pytest.raises(DataError, match=r"LayerNorm's Reshape or Expand is given the shape \[\[3, 1\]\], not its input's \[4, 6\]"):
        plan.run(feeds)


def written_softmax_plan(path, floor: float):
    """plan_with_rows of a layer → jax.nn.softmax as jax2tf writes it (Max(floor, ReduceMax(x)), ...), its
    Reshapes and Expands given [M, 1]."""
    g = Graph()
    x, rows = layer_and_rows(g)
    peak = g.op("Max", [g.const(np.float32(floor)), g.op("ReduceMax", [x], axes=[1], keepdims=0)])
    e = g.op("Exp", [g.op("Sub", [x, g.op("Expand", [g.op("Reshape", [peak, rows]), rows])])])
    total = g.op("ReduceSum", [e, g.const(np.int64([1]))], keepdims=0)
    g.op("Div", [e, g.op("Expand", [g.op("Reshape", [total, rows]), rows])], name="y")
    return plan_with_rows(g, path)


def test_a_jax2tf_softmax_is_lpts_softmax(tmp_path):
    """jax.nn.softmax as jax2tf writes it after magika's last Dense: Max(−inf, ReduceMax(x)), Reshape and Expand
    to [M, 1] computed from another tensor's shape, Sub, Exp, ReduceSum, Reshape, Expand, Div: one step of lpt's
    softmax (its exp and sums lpt's own; the native instruction's test_a_softmax_checks_the_shapes_it_is_given),
    near onnxruntime's (whose float32 MatMul of the dequantized values adds in its own order, as its exp
    computes in its own way); another M at the run is refused in one line, as onnxruntime refuses it."""
    from lpt.errors import DataError

    fq_model, int8, plan, sessions = written_softmax_plan(tmp_path / "softmax.onnx", -np.inf)
    assert sessions == []  # the rows' shape is lpt.backend.shape_steps'
    assert [s.op_types for s in plan.steps if s.backend == "lpt shapes"] == [("Shape", "Slice", "Concat")]
    [softmax] = [s for s in plan.steps if "Exp" in s.op_types]
    assert len(softmax.op_types) == 10 and softmax.native[0] == "softmax"
    feeds = {"x": RNG.uniform(-3, 3, (4, 5)).astype(np.float32), "rows": np.zeros((4, 2), np.float32)}
    ours = plan.run(feeds)["y"]
    values = compile_model(int8, native=False).run(feeds, keep=True)
    np.testing.assert_array_equal(ours, values["y"])
    np.testing.assert_array_equal(values["y"], kernels.softmax(values[softmax.inputs[0]]))
    np.testing.assert_allclose(ours, run_onnxruntime(fq_model, feeds)["y"], rtol=1e-5, atol=0)
    feeds["rows"] = np.zeros((3, 2), np.float32)
    with pytest.raises(Exception):
        run_onnxruntime(fq_model, feeds)
    with pytest.raises(DataError, match=r"softmax's Reshape or Expand is given the shape \[\[3, 1\]\], not its input's \[4, 6\]"):
        plan.run(feeds)


def test_a_written_softmax_whose_max_has_a_floor_is_not_lpts_softmax(tmp_path):
    """Max(0, ReduceMax(x)) is not a softmax's maximum (a row below 0 would shift by 0): the ten ops stay
    onnxruntime's."""
    fq_model, _, plan, sessions = written_softmax_plan(tmp_path / "floored.onnx", 0.0)
    assert sessions == [("Shape", "Slice", "Concat", "ReduceMax", "Max", "Reshape", "Expand", "Sub", "Exp", "ReduceSum",
                         "Reshape", "Expand", "Div")]
    feeds = {"x": RNG.uniform(-3, 3, (4, 5)).astype(np.float32), "rows": np.zeros((4, 2), np.float32)}
    np.testing.assert_allclose(plan.run(feeds)["y"], run_onnxruntime(fq_model, feeds)["y"], rtol=1e-5)


def test_a_jax2tf_one_hot_before_a_dense_is_one_step_of_8_bit_levels(tmp_path):
    """jax.nn.one_hot as jax2tf writes it before a Dense (magika's bytes): Reshape to [N, L, 1], Expand to a
    shape computed from the input's, Equal to arange(K), Cast, then the Dense's quantize: one step of lpt's
    writing the 8-bit levels (no float32 [N, L, K] tensor), in the Dense's native program with the Reshape
    before it; values outside the table are rows of zeros. The NumPy plan's bits, and onnxruntime's values on
    the FQ model."""
    g = Graph()
    columns = g.op("Reshape", ["bytes", g.const(np.int64([-1, 16, 1]))])
    shape = g.op("Concat", [g.op("Slice", [g.op("Shape", ["bytes"]), g.const(np.int64([0])), g.const(np.int64([1]))]),
                            g.const(np.int64([16, 1]))], axis=0)
    equal = g.op("Equal", [g.op("Expand", [columns, shape]), g.const(np.arange(9, dtype=np.int32).reshape(1, 1, 9))])
    hot = g.fq(g.op("Cast", [equal], to=onnx.TensorProto.FLOAT), 1 / 255, np.uint8(0))
    g.op("MatMul", [hot, g.weight((9, 4), axis=1)], name="y")
    graph = helper.make_graph(g.nodes, "one_hot", [helper.make_tensor_value_info("bytes", onnx.TensorProto.INT32, ["N", 16])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 16, 4])],
                              [onnx.numpy_helper.from_array(np.asarray(a), n) for n, a in g.inits.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "hot.onnx")
    fq_model = lpt.load(tmp_path / "hot.onnx")
    int8 = lpt.clone(fq_model)
    lpt.transform(int8)
    plan = compile_model(int8)
    assert [s.op_types for s in plan.steps if s.backend == "onnxruntime"] == []
    assert [s.op_types for s in plan.steps if s.backend == "lpt shapes"] == [("Shape", "Slice", "Concat")]
    [hot_step] = [s for s in plan.steps if "Equal" in s.op_types]
    assert hot_step.op_types == ("Expand", "Equal", "Cast", "QuantizeLinear") and hot_step.native[0] == "one_hot"
    feeds = {"bytes": RNG.integers(-2, 12, (3, 16)).astype(np.int32)}  # 9, 10, 11 and the negatives: no 1 in their rows
    ours = plan.run(feeds)["y"]
    np.testing.assert_array_equal(ours, compile_model(int8, native=False).run(feeds)["y"])
    np.testing.assert_allclose(ours, run_onnxruntime(fq_model, feeds)["y"], rtol=1e-5, atol=1e-6)
    levels = compile_model(int8, native=False).run(feeds, keep=True)[hot_step.outputs[0]]
    np.testing.assert_array_equal(levels, np.where(feeds["bytes"][..., None] == np.arange(9), 255, 0))
    if lpt.native.available():
        [program] = [s for s in plan.run_steps if "Equal" in s.op_types]
        assert "MatMulInteger" in program.op_types and program.run.native, "the program gave way to its steps"


@pytest.mark.parametrize("op_type, allow_zero, given, holds", [
    ("Reshape", 0, [4, 1, 5], True), ("Reshape", 0, [0, 1, 5], True), ("Reshape", 0, [-1, 1, 5], True),
    ("Reshape", 0, [4, 1, -1], True), ("Reshape", 1, [0, 1, 5], False), ("Reshape", 0, [3, 1, 5], False),
    ("Reshape", 0, [4, 5], False), ("Reshape", 0, [-1, 1, -1], False),
    ("Expand", 0, [4, 1, 5], True), ("Expand", 0, [1, 1, 5], True), ("Expand", 0, [1], True),
    ("Expand", 0, [4, 2, 5], False), ("Expand", 0, [3, 1, 5], False), ("Expand", 0, [2, 4, 1, 5], False)])
def test_a_layer_norms_computed_shapes_are_judged_by_onnxs_rules(op_type, allow_zero, given, holds):
    """The shapes a jax2tf LayerNorm's Reshape (of a moment, [4, 5]) and Expand (of that, [4, 1, 5]) are given at
    a run, for x [4, 6, 5]: a Reshape's 0 copies a dimension (not with allowzero), its −1 takes the rest, an
    Expand broadcasts; each must leave [4, 1, 5]."""
    from lpt.backend.float_steps import reduced_shapes_hold

    assert reduced_shapes_hold((4, 6, 5), 1, [(op_type, allow_zero, 0)], [np.array(given, np.int64)]) is holds


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ([1], [-1], [2], None),  # the last axis, from its second value to before its last
    ([-100, 7], [100, -100], [1, -1], [2, -3]),  # past both ends, negative steps and axes
    ([2**63 - 1], [-2**63], [2], [-1]),  # the whole axis reversed, as INT64's bounds write it
    ([0, 0], [0, 2**31 - 1], [1, 2], [1, 1]),  # nothing of axis 1
])
def test_slices_of_float_and_8_bit_values_are_lpts_steps_with_onnxruntimes_values(starts, ends, axes, steps):
    """A Slice of a layer's float32 output and one of 8-bit values before a convolution (basic_pitch's
    harmonic stacking): ONNX's clamped ranges, lpt's steps in the native program, onnxruntime's values."""
    import lpt.native

    g = Graph()
    sliced = g.op("Slice", [g.fq("x", 0.02, np.uint8(128)), g.const(np.int64([1])), g.const(np.int64([2**62])),
                            g.const(np.int64([3])), g.const(np.int64([2]))])  # [N, 3, 8, 9] → every other column
    conv = g.op("Conv", [sliced, g.weight((6, 3, 1, 3)), g.const(np.ones(6, np.float32))])  # [N, 6, 8, 2]
    parameters = [g.const(np.int64(v)) for v in (starts, ends, axes)] + ([g.const(np.int64(steps))] if steps else [])
    g.op("Slice", [conv, *parameters], name="y")
    fq_model, int8, plan = plan_without_onnxruntime(g, {"x": [2, 3, 8, 9]})
    x = RNG.uniform(-2, 2, (2, 3, 8, 9)).astype(np.float32)
    run_against_numpy_and_onnxruntime(fq_model, int8, plan, x, rtol=1e-6, atol=1e-5)
    if lpt.native.available():
        [program] = plan.run_steps
        assert program.run.native, "the program gave way to its steps"


def test_a_gather_of_one_index_is_a_slice_of_lpts():
    """plcmos_v2 takes the two halves of its GRU's state by a Gather of one index each (axis 0), of 8-bit values
    before its dense layers; here of a layer's output, and of its float32 output along the last axis, with
    an index from the end: steps of lpt's in the native program, the NumPy plan's bits, onnxruntime's values."""
    g = Graph()
    conv = g.op("Conv", [g.fq("x", 0.02, np.uint8(128)), g.weight((6, 3, 1, 3)), g.const(np.ones(6, np.float32))])
    second = g.op("Gather", [g.fq(conv, 0.05, np.uint8(10)), g.const(np.int64(1))], axis=0)  # [6, 8, 7]
    column = g.op("Gather", [g.op("Gather", [conv, g.const(np.int64(-2))], axis=-1), g.const(np.int64(0))])  # [6, 8]
    joined = g.op("Add", [second, g.op("Unsqueeze", [column, g.const(np.int64([2]))])])
    g.op("MatMul", [g.fq(joined, 0.05, np.uint8(128)), g.weight((7, 4), axis=1)], name="y")
    fq_model, int8, plan = plan_without_onnxruntime(g, {"x": [2, 3, 8, 9]})
    assert sorted(s.native for s in plan.steps if s.op_types == ("Gather",)) == [
        ("slice", ([-2], [-1], [-1], [1], True)), ("slice", ([0], [1], [0], [1], True)), ("slice", ([1], [2], [0], [1], True))]
    run_against_numpy_and_onnxruntime(fq_model, int8, plan, RNG.uniform(-2, 2, (2, 3, 8, 9)).astype(np.float32),
                                      rtol=1e-5, atol=1e-4)
    programs = [s.run for s in plan.run_steps if s.engine == "native program"]
    assert all(program.native for program in programs), "a program gave way to its steps"


def test_a_reflect_pad_between_layers_is_lpts():
    """basic_pitch_nmp pads each octave's signal by reflection (TensorFlow's MirrorPad) before its CQT's
    convolutions: a step of lpt's in the native program, numpy's reflection; a pad as wide as the axis is a
    one-line error, not onnxruntime's."""
    g = Graph()
    conv = g.op("Conv", [g.fq("x", 0.02, np.uint8(128)), g.weight((4, 3, 1, 3)), g.const(np.ones(4, np.float32))])
    padded = g.op("Pad", [conv, g.const(np.int64([0, 0, 1, 2, 0, 0, 1, 3]))], mode="reflect")  # [N, 4, 6, 12]
    g.op("Conv", [g.fq(padded, 0.05, np.uint8(128)), g.weight((2, 4, 3, 3)), g.const(np.ones(2, np.float32))], name="y")
    fq_model, int8, plan = plan_without_onnxruntime(g, {"x": [2, 3, 4, 9]})
    assert [s.native for s in plan.steps if s.op_types == ("Pad",)] == [("pad", ((0, 0, 1, 2, 0, 0, 1, 3), 0.0, "reflect"))]
    run_against_numpy_and_onnxruntime(fq_model, int8, plan, RNG.uniform(-2, 2, (2, 3, 4, 9)).astype(np.float32),
                                      rtol=1e-5, atol=1e-4)
    with pytest.raises(DataError, match="reflect pads"):
        plan.run({"x": RNG.uniform(-2, 2, (2, 3, 1, 9)).astype(np.float32)})


def test_a_scalar_operand_is_the_engines_whatever_the_other_shape():
    """The engine's binary takes one value over any shape: a scalar (rank 0) constant over a tensor whose shape
    the graph does not say (plcmos_v2's score, Sigmoid(...) · 5 + 1); a one-value operand of rank 1 or more
    may raise the output's rank past an unknown one's, which only the run would show."""
    from lpt.backend.float_steps import _engine_broadcasts

    unknown = ir.Value(name="a", shape=None, type=ir.TensorType(ir.DataType.FLOAT))
    scalar = ir.Value(name="s", shape=ir.Shape([]), type=ir.TensorType(ir.DataType.FLOAT))
    one = ir.Value(name="o", shape=ir.Shape([1]), type=ir.TensorType(ir.DataType.FLOAT))
    assert _engine_broadcasts(unknown, scalar) and _engine_broadcasts(scalar, unknown)
    assert not _engine_broadcasts(unknown, one) and not _engine_broadcasts(unknown, unknown)


def test_a_jax2tf_layer_norm_over_the_channels_is_one_step_of_lpts():
    """magika's LayerNorm as jax2tf writes it, over axis 1 of [N, C, T] after a layer: the sums of x and x·x,
    the mean square less the squared mean, Max(0, ·), Reshapes and Expands to [N, 1, T], +ε, Sqrt, Reciprocal,
    ·γ, (x − mean)·that + β: one step of lpt's in the native program, whose values are those of the nineteen
    ops one at a time (the channels' sums in order), and onnxruntime's within an LSB at the next quantize."""
    g = Graph()
    x = g.op("MatMul", [g.fq("x", 0.03, np.uint8(128)), g.weight((5, 8), axis=1)])  # [N, 6, 8]
    square = g.op("Mul", [x, x])
    factor = g.const(np.float32(1 / 6))
    mean = g.op("Mul", [g.op("ReduceSum", [x, g.const(np.int64([1]))], keepdims=0), factor])
    second = g.op("Mul", [g.op("ReduceSum", [square, g.const(np.int64([1]))], keepdims=0), factor])
    positive = g.op("Max", [g.const(np.float32(0)), g.op("Sub", [second, g.op("Mul", [mean, mean])])])
    keep, across = g.const(np.int64([0, 1, 8])), g.const(np.int64([1, 1, 8]))  # Reshape's 0 keeps N
    variance = g.op("Expand", [g.op("Reshape", [positive, keep]), across])
    inverse = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [variance, g.const(np.float32(1e-6))])])])
    scale = g.op("Mul", [inverse, g.const(np.linspace(0.5, 2, 6).astype(np.float32).reshape(1, 6, 1))])
    centered = g.op("Sub", [x, g.op("Expand", [g.op("Reshape", [mean, keep]), across])])
    normed = g.op("Add", [g.op("Mul", [centered, scale]), g.const(np.linspace(-1, 1, 6).astype(np.float32).reshape(1, 6, 1))])
    g.op("MatMul", [g.fq(normed, 0.02, np.uint8(128)), g.weight((8, 3), axis=1)], name="y")
    fq_model, int8, plan = plan_without_onnxruntime(g, {"x": ["N", 6, 5]})
    [norm] = [s for s in plan.steps if "ReduceSum" in s.op_types]
    assert len(norm.op_types) == 19 and norm.native[0] == "moment_layer_norm"
    x_values = RNG.uniform(-3, 3, (2, 6, 5)).astype(np.float32)
    run_against_numpy_and_onnxruntime(fq_model, int8, plan, x_values, atol=0.05)
    values = compile_model(int8, native=False).run({"x": x_values}, keep=True)
    one_by_one = moments_one_by_one(values[norm.inputs[0]], np.float32(1 / 6), np.float32(1e-6),
                                    np.linspace(0.5, 2, 6).astype(np.float32), np.linspace(-1, 1, 6).astype(np.float32))
    np.testing.assert_array_equal(values[norm.outputs[0]], one_by_one)
    if lpt.native.available():
        [program] = [s for s in plan.run_steps if s.backend == "int8 kernel"]
        assert program.run.native, "the program gave way to its steps"


def spectrogram(pads=(0, 0), source_op: str | None = None, kernel: int = 11) -> onnx.ModelProto:
    """oww_melspectrogram: [N, samples] unsqueezed, two STFT convolutions (stride 3, 11-sample frames, 9
    frequencies; the second with a bias), frequencies last, re² + im², a constant mel MatMul into 4, then the
    log in decibels clipped below at its maximum less 5 (80 in the model). With `source_op`, that op of the input
    is the signal (a Pad: 5 samples reflected at each end, as silero_vad_16k_op15's). Frames of another `kernel`
    length: a DFT's weights (a Hann window times cosines and minus sines)."""
    rng = np.random.default_rng(5)
    reflection = [helper.make_node("Pad", ["x", "ends"], ["source"], mode="reflect")]
    nodes = (reflection if source_op == "Pad" else [helper.make_node(source_op, ["x"], ["source"])]) if source_op else []
    nodes += [helper.make_node("Unsqueeze", ["source" if source_op else "x", "axis"], ["signal"]),
             helper.make_node("Conv", ["signal", "cos"], ["re"], strides=[3], pads=list(pads), kernel_shape=[kernel]),
             helper.make_node("Conv", ["signal", "sin", "offset"], ["im"], strides=[3], pads=list(pads)),
             helper.make_node("Transpose", ["re"], ["re_t"], perm=[0, 2, 1]),
             helper.make_node("Transpose", ["im"], ["im_t"], perm=[0, 2, 1]),
             helper.make_node("Pow", ["re_t", "two"], ["re2"]), helper.make_node("Mul", ["im_t", "im_t"], ["im2"]),
             helper.make_node("Add", ["re2", "im2"], ["bins"]),
             helper.make_node("MatMul", ["bins", "mel"], ["mel_power"]),
             helper.make_node("Clip", ["mel_power", "floor", ""], ["floored"]), helper.make_node("Log", ["floored"], ["ln"]),
             helper.make_node("Mul", ["ln", "decibels"], ["db"]), helper.make_node("ReduceMax", ["db"], ["top"], keepdims=0),
             helper.make_node("Sub", ["top", "range"], ["lowest"]), helper.make_node("Cast", ["lowest"], ["low"], to=1),
             helper.make_node("Clip", ["db", "low", ""], ["y"])]
    weights = {"axis": np.array([1], np.int64), "two": np.float32(2.0),
               "cos": rng.normal(0, 1, (9, 1, 11)).astype(np.float32), "sin": rng.normal(0, 1, (9, 1, 11)).astype(np.float32),
               "offset": rng.normal(0, 1, 9).astype(np.float32), "mel": rng.uniform(0, 1, (9, 4)).astype(np.float32),
               "floor": np.float32(1e-10), "decibels": np.float32(10 / np.log(10)), "range": np.float32(5),
               "ends": np.array([0, 5, 0, 5], np.int64)}
    if kernel != 11:
        from tests.native.test_native_float_ops import dft_weights

        weights["cos"], weights["sin"] = dft_weights(kernel, 9)
    return model(nodes, {"x": ["N", "samples"]}, {"y": None}, weights)


@pytest.mark.parametrize("source_op, first_ops, frames", [(None, ("Unsqueeze", "Conv", "Conv"), 30),
                                                          ("Pad", ("Pad", "Unsqueeze", "Conv"), 34)],
                         ids=["signal", "reflection-padded signal"])
def test_an_stfts_convolutions_and_their_power_are_one_native_program_of_lpts(source_op, first_ops, frames):
    """An STFT kept in f32 (nothing in it quantized) is lpt's from the model's input on (or from its reflection
    Pad on): its Unsqueeze, both convolutions as products of frames, the MatMul by the mel filters and the
    decibels after them (lpt's log, a maximum of every value, a Clip by it), in one native program. The log
    makes its input's differences from onnxruntime's relative: a mel bin near 0 (its floor, 1e-10) moves by
    decibels."""
    fp32 = ir_model(spectrogram(source_op=source_op))
    plan = compile_model(fp32)
    assert {s.backend for s in plan.steps} == {"lpt float32"}
    if lpt.native.available():
        assert len(plan.run_steps) == 1 and plan.run_steps[0].op_types[:3] == first_ops
    x = RNG.normal(0, 1, (2, 100)).astype(np.float32)
    ours = plan.run({"x": x})["y"]
    assert ours.shape == (2, frames, 4)
    np.testing.assert_array_equal(ours, compile_model(fp32, native=False).run({"x": x})["y"])
    np.testing.assert_allclose(ours, run_onnxruntime(fp32, {"x": x})["y"], rtol=1e-5, atol=1e-4)
    assert ours.min() == ours.max() - np.float32(5)  # clipped by a bound made at run time: the quiet bins


def test_an_stfts_convolutions_by_a_dft_basis_fold_their_frames():
    """torchlibrosa's STFT (oww_melspectrogram's): a Hann window times each frequency's cosine, and times minus its
    sine, 64-sample frames. Each Conv's weights are even or odd about their middle, so its frames are folded and
    multiplied by half the weights (the dense instruction's sign, kernels.folded_convolution_1d); random weights,
    or a kernel shorter than FOLDED_KERNEL, are not. The plan gives the NumPy plan's bits, and onnxruntime's
    spectrogram as the other STFT tests do."""
    from lpt.backend.float_steps import FOLDED_KERNEL, _dft_parity
    from tests.native.test_native_float_ops import dft_weights

    fp32 = ir_model(spectrogram(kernel=64))
    plan = compile_model(fp32)
    assert [s.native[1][7] for s in plan.steps if s.op_types == ("Conv",)] == [1, -1]
    x = RNG.normal(0, 1, (2, 400)).astype(np.float32)
    ours = plan.run({"x": x})["y"]
    np.testing.assert_array_equal(ours, compile_model(fp32, native=False).run({"x": x})["y"])
    np.testing.assert_allclose(ours, run_onnxruntime(fp32, {"x": x})["y"], rtol=1e-5, atol=1e-4)
    cosines, sines = dft_weights(64, 33)
    assert _dft_parity(cosines) == 1 and _dft_parity(sines) == -1
    assert _dft_parity(RNG.normal(0, 1, cosines.shape).astype(np.float32)) == 0
    assert _dft_parity(dft_weights(FOLDED_KERNEL - 2, 5)[0]) == 0  # too short to pay
    tiny = cosines.copy()
    tiny[3, 0, 5], tiny[3, 0, 59] = 1e-13, -1e-13  # a DFT's zeros, rounded apart: still even
    assert _dft_parity(tiny) == 1
    tiny[3, 0, 5] = 1e-5
    assert _dft_parity(tiny) == 0


def test_a_convolution_of_an_stfts_magnitudes_is_lpts_too():
    """silero_vad_16k_op15: √(re² + im²) of an STFT, then a convolution over its frames (9 frequencies into 5
    channels, a kernel of 3, pads of 1), kept in float32 as a reader of the spectrum: one program of lpt's."""
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("Unsqueeze", ["x", "axis"], ["signal"]),
             helper.make_node("Conv", ["signal", "cos"], ["re"], strides=[3]),
             helper.make_node("Conv", ["signal", "sin"], ["im"], strides=[3]),
             helper.make_node("Pow", ["re", "two"], ["re2"]), helper.make_node("Mul", ["im", "im"], ["im2"]),
             helper.make_node("Add", ["re2", "im2"], ["power"]), helper.make_node("Sqrt", ["power"], ["magnitude"]),
             helper.make_node("Conv", ["magnitude", "w", "b"], ["y"], pads=[1, 1], kernel_shape=[3])]
    weights = {"axis": np.array([1], np.int64), "two": np.float32(2.0),
               "cos": rng.normal(0, 1, (9, 1, 11)).astype(np.float32), "sin": rng.normal(0, 1, (9, 1, 11)).astype(np.float32),
               "w": rng.normal(0, 1, (5, 9, 3)).astype(np.float32), "b": rng.normal(0, 1, 5).astype(np.float32)}
    fp32 = ir_model(model(nodes, {"x": ["N", "samples"]}, {"y": None}, weights))
    plan = compile_model(fp32)
    assert {s.backend for s in plan.steps} == {"lpt float32"}
    if lpt.native.available():
        assert len(plan.run_steps) == 1 and plan.run_steps[0].op_types[-1] == "Conv"
    x = RNG.normal(0, 1, (2, 100)).astype(np.float32)
    ours = plan.run({"x": x})["y"]
    assert ours.shape == (2, 5, 30)
    np.testing.assert_array_equal(ours, compile_model(fp32, native=False).run({"x": x})["y"])
    np.testing.assert_allclose(ours, run_onnxruntime(fp32, {"x": x})["y"], rtol=1e-4, atol=1e-4)


def test_a_signal_shorter_than_the_stfts_frame_is_refused_in_one_line():
    plan = compile_model(ir_model(spectrogram()))
    with pytest.raises(DataError, match=r"^node '.*' \(Conv\): 8 samples, fewer than its kernel's 11$"):
        plan.run({"x": np.ones((1, 8), np.float32)})


def test_a_padded_convolution_of_a_signal_stays_with_onnxruntime():
    plan = compile_model(ir_model(spectrogram(pads=(2, 2))))
    assert regions(plan) == [("Unsqueeze", "Conv", "Conv", "Transpose", "Transpose", "Pow", "Mul", "Add", "MatMul", "Clip", "Log", "Mul", "ReduceMax", "Sub", "Cast", "Clip")]


def test_an_stft_of_a_signal_onnxruntime_makes_stays_in_its_region():
    """Taken, it would cut the region of the ops before it in two (silero_vad_16k_op15's reflection Pad)."""
    plan = compile_model(ir_model(spectrogram(source_op="Abs")))
    assert regions(plan) == [("Abs", "Unsqueeze", "Conv", "Conv", "Transpose", "Transpose", "Pow", "Mul", "Add", "MatMul", "Clip", "Log", "Mul", "ReduceMax", "Sub", "Cast", "Clip")]


def test_a_clip_by_a_bound_made_at_run_time_takes_one_value():
    clipped = ir_model(model([helper.make_node("Clip", ["x", "low", "high"], ["y"])],
                             {"x": [2, 3], "low": [], "high": []}, {"y": [2, 3]}))
    [node] = list(clipped.graph)
    step, nodes = try_float_step(node)
    assert step.native == ("clip", (1.0, None, None)) and nodes == [node]
    x = np.float32([[-2, 0.5, 3], [np.nan, 1, -0.0]])
    low, high = np.array(0, np.float32), np.array(1, np.float32)
    [y] = step.run(x, low, high)
    np.testing.assert_array_equal(y, kernels.slope_and_clip(x, 1.0, 0.0, 1.0))
    np.testing.assert_array_equal(y, run_onnxruntime(clipped, {"x": x, "low": low, "high": high})["y"])
    with pytest.raises(DataError, match="a bound of 2 values, not one"):
        step.run(x, low, np.float32([0, 1]))
