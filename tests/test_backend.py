"""The compiled plan: kernels where lpt has them, onnxruntime for the rest, same numbers as the graph."""

import numpy as np
import pytest

import lpt
from lpt.backend import compile_model
from lpt.crosscheck import run_onnxruntime
from tests.graphs import ONNXRUNTIME_INT8_IS_EXACT, run_ort
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
    assert (("Flatten",), "int8 kernel") in kinds  # a reshape of the integers
    assert not plan.fallback_ops()


def test_plan_matches_the_exact_reference_on_the_same_int8_graph_bit_for_bit(int8_net):
    """ONNX's reference evaluator computes ConvInteger/MatMulInteger in exact integers; so does
    onnxruntime where its u8·s8 kernels are exact on this CPU."""
    x = RNG.uniform(-3, 3, (2, 3, 8, 8)).astype(np.float32)
    ours = compile_model(int8_net).run({"x": x})["y"]
    np.testing.assert_array_equal(ours, lpt.run_reference(int8_net, {"x": x})["y"])
    if ONNXRUNTIME_INT8_IS_EXACT:
        np.testing.assert_array_equal(ours, run_ort(int8_net, {"x": x})[0])


def test_plan_keeps_intermediates_on_request(int8_net):
    x = RNG.uniform(-3, 3, (2, 3, 8, 8)).astype(np.float32)
    everything = compile_model(int8_net).run({"x": x}, keep=True)
    assert everything["maxpool14/quantized"].dtype == np.uint8


def test_missing_input_is_a_data_error(int8_net):
    with pytest.raises(lpt.DataError, match="expects"):
        compile_model(int8_net).run({})


def test_export_to_qlinear_ops_runs_in_onnxruntime_within_one_lsb(int8_net):
    from lpt.export.int8 import to_standard_int8

    exported, report = to_standard_int8(int8_net)
    ops = [n.op_type for n in exported.graph]
    assert "QLinearConv" in ops and report.fused == ["conv9/integer"]
    assert "MatMulInteger" in ops  # the Gemm has a bias: QLinearMatMul has none, so it stays
    x = RNG.uniform(-3, 3, (2, 3, 8, 8)).astype(np.float32)
    plan = compile_model(int8_net)
    ours = plan.run({"x": x}, keep=True)
    # The output is f32 after the last dequantization: compare in units of its last-layer scale.
    np.testing.assert_allclose(lpt.run_reference(exported, {"x": x})["y"], ours["y"], atol=0.1)
    if ONNXRUNTIME_INT8_IS_EXACT:
        np.testing.assert_allclose(run_ort(exported, {"x": x})[0], ours["y"], atol=0.1)


def test_int8_execution_is_within_one_lsb_of_the_fake_quantized_model():
    from lpt.crosscheck import quantized_tensor_agreement

    _, fq_model = conv_net()
    _, int8 = conv_net()
    lpt.transform(int8)
    x = RNG.uniform(-3, 3, (2, 3, 8, 8)).astype(np.float32)
    agreement = quantized_tensor_agreement(int8, compile_model(int8), fq_model, {"x": x})
    assert [a.tensor for a in agreement] == ["x", "relu10"]
    assert all(a.max_lsb <= 1 for a in agreement)
    assert agreement[0].share_exact == 1.0  # the input is quantized by the same QuantizeLinear
    assert agreement[1].share_exact > 0.95


@pytest.mark.parametrize("pool, attrs", [("GlobalAveragePool", {}),
                                         ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})])
def test_average_pool_between_quantized_tensors_runs_on_integers(pool, attrs):
    from tests.transformations.builders import Graph

    g = Graph()
    pooled = g.op(pool, [g.fq("x", 0.02, np.uint8(100))], **attrs)
    g.op("Relu", [g.fq(pooled, 0.01, np.uint8(90))], name="y")
    _, m = g.build({"x": [2, 3, 6, 6]}, ["y"])
    lpt.transform(m)
    plan = compile_model(m)
    assert any(step.op_types[:4] == ("Cast", "Sub", "Mul", pool) and step.backend == "int8 kernel" for step in plan.steps)
    x = RNG.uniform(-2, 3, (2, 3, 6, 6)).astype(np.float32)
    quantized = next(n.outputs[0].name for n in m.graph if n.op_type == "QuantizeLinear" and n.inputs[0].name != "x")
    ours = plan.run({"x": x}, keep=True)[quantized].astype(int)
    # onnxruntime averages in f32, then quantizes: one rounding more than the integer average.
    reference = run_onnxruntime(m, {"x": x}, [quantized])[quantized].astype(int)
    assert np.abs(ours - reference).max() <= 1 and (ours == reference).mean() > 0.9


@pytest.mark.parametrize("attrs", [{"auto_pad": "VALID"}, {"pads": [0, 1, 1, 0]}])
def test_max_pool_of_quantized_values_runs_on_integers(attrs):
    """auto_pad VALID (as TensorFlow exports write it) is no padding: an integer step like the explicit form."""
    from tests.transformations.builders import Graph

    g = Graph()
    pooled = g.op("MaxPool", [g.fq("x", 0.02, np.uint8(100))], kernel_shape=[2, 2], strides=[2, 2], **attrs)
    g.op("Relu", [pooled], name="y")
    _, m = g.build({"x": [2, 3, 7, 9]}, ["y"])
    lpt.transform(m)
    plan = compile_model(m)
    assert any("MaxPool" in s.op_types and s.backend == "int8 kernel" for s in plan.steps)
    x = RNG.uniform(-2, 3, (2, 3, 7, 9)).astype(np.float32)
    np.testing.assert_array_equal(plan.run({"x": x})["y"], run_ort(m, {"x": x})[0])


def test_dequantize_then_quantize_is_one_requantize_step():
    from tests.transformations.builders import Graph

    g = Graph()
    g.op("Relu", [g.fq(g.op("Identity", [g.fq("x", 0.02, np.uint8(100))]), 0.05, np.uint8(30))], name="y")
    _, m = g.build({"x": [4, 5]}, ["y"])
    lpt.transform(m)
    plan = compile_model(m)
    assert ("Cast", "Sub", "Mul", "QuantizeLinear") in [s.op_types for s in plan.steps]
    x = RNG.uniform(-2, 3, (4, 5)).astype(np.float32)
    np.testing.assert_array_equal(plan.run({"x": x})["y"], run_ort(m, {"x": x})[0])


@pytest.mark.parametrize("dtype, zero_point", [(np.uint8, 100), (np.int8, -3), (np.uint8, 0)])
def test_a_quantize_back_to_the_same_scale_and_zero_point_is_the_identity(dtype, zero_point):
    """onnxruntime's QDQ models dequantize and quantize again with the same parameters around a
    MaxPool: the integers pass through unchanged, for every value of the type and scales from tiny to
    large, as onnxruntime computes them."""
    from tests.transformations.builders import Graph

    q = np.arange(np.iinfo(dtype).min, np.iinfo(dtype).max + 1).astype(dtype).reshape(1, -1)
    for scale in (1e-8, 0.02, 0.1 + 1e-7, 3.0, 1e6):
        g = Graph()
        g.op("Relu", [g.fq(g.op("Identity", [g.fq("x", scale, dtype(zero_point))]), scale, dtype(zero_point))],
             name="y")
        _, m = g.build({"x": list(q.shape)}, ["y"])
        lpt.transform(m)
        plan = compile_model(m)
        [requantize] = [s for s in plan.steps if "Cast" in s.op_types and "QuantizeLinear" in s.op_types]
        assert requantize.native == ("identity", None)
        x = ((q.astype(np.float32) - zero_point) * np.float32(scale)).astype(np.float32)
        np.testing.assert_array_equal(plan.run({"x": x})["y"], run_ort(m, {"x": x})[0])


@pytest.mark.parametrize("op", ["Add", "Mul", "Concat"])
def test_join_of_two_quantized_branches_is_one_integer_step(op):
    from tests.transformations.builders import Graph

    g = Graph()
    attrs = {"axis": 1} if op == "Concat" else {}
    joined = g.op(op, [g.fq("a", 0.02, np.uint8(100)), g.fq("b", 0.05, np.uint8(7))], **attrs)
    g.op("Relu", [g.fq(joined, 0.03, np.uint8(50))], name="y")
    _, m = g.build({"a": [2, 3], "b": [2, 3]}, ["y"])
    lpt.transform(m)
    plan = compile_model(m)
    join = next(s for s in plan.steps if op in s.op_types)
    assert join.backend == "int8 kernel" and join.op_types[-1] == "QuantizeLinear"
    feeds = {"a": RNG.uniform(-2, 3, (2, 3)).astype(np.float32), "b": RNG.uniform(-1, 1, (2, 3)).astype(np.float32)}
    np.testing.assert_array_equal(plan.run(feeds)["y"], run_ort(m, feeds)[0])


def test_a_bias_added_from_either_side_joins_the_output_stage():
    """Exporters write a linear layer as MatMul then Add(bias, x) as often as Add(x, bias)."""
    from tests.transformations.builders import Graph

    g = Graph()
    product = g.op("MatMul", [g.fq("x", 0.02, np.uint8(100)), g.weight((6, 4), axis=1)])
    g.op("Relu", [g.fq(g.op("Add", [g.const(g.rng.normal(size=4).astype(np.float32)), product]), 0.03, np.uint8(50))],
         name="y")
    _, m = g.build({"x": [3, 6]}, ["y"])
    lpt.transform(m)
    plan = compile_model(m)
    assert ("MatMulInteger", "Cast", "Mul", "Add", "QuantizeLinear") in [s.op_types for s in plan.steps]
    x = RNG.uniform(-2, 3, (3, 6)).astype(np.float32)
    # the exact reference: onnxruntime's u8·s8 MatMulInteger saturates pairs of products on a CPU without VNNI
    np.testing.assert_array_equal(plan.run({"x": x})["y"], lpt.run_reference(m, {"x": x})["y"])


def test_conv_transpose_runs_on_integers_and_exports_to_standard_onnx():
    from lpt.crosscheck import quantized_tensor_agreement
    from lpt.export.int8 import to_standard_int8
    from tests.transformations.builders import Graph

    def build():
        g = Graph()
        up = g.op("ConvTranspose", [g.fq("x", 0.02, np.uint8(100)), g.weight((3, 4, 3, 3), axis=1),
                                    g.const(g.rng.normal(size=4).astype(np.float32))], strides=[2, 2], pads=[1, 1, 1, 1])
        g.op("Relu", [g.fq(g.op("Relu", [up]), 0.05, np.uint8(0))], name="y")
        return g.build({"x": [2, 3, 5, 5]}, ["y"])[1]

    fq_model, int8 = build(), build()
    lpt.transform(int8)
    plan = compile_model(int8)
    chain = next(s for s in plan.steps if "ConvTransposeInteger" in s.op_types)
    assert chain.backend == "int8 kernel" and chain.op_types[-1] == "QuantizeLinear"
    x = RNG.uniform(-2, 3, (2, 3, 5, 5)).astype(np.float32)
    agreement = quantized_tensor_agreement(int8, plan, fq_model, {"x": x}, local=True)
    assert max(a.max_lsb for a in agreement) <= 1
    exported, report = to_standard_int8(int8)
    assert "ConvTranspose" in [n.op_type for n in exported.graph] and report.approximated
    np.testing.assert_allclose(run_ort(exported, {"x": x})[0], plan.run({"x": x})["y"], atol=0.05 + 1e-6)


def test_a_step_that_reads_one_tensor_twice():
    """x·x of one dequantized tensor (a power spectrum's Square) is a join of a branch with itself."""
    from tests.transformations.builders import Graph

    g = Graph()
    x = g.fq("x", 0.02, np.uint8(100))
    g.op("Relu", [g.fq(g.op("Mul", [x, x]), 0.03, np.uint8(0))], name="y")
    _, m = g.build({"x": [2, 3]}, ["y"])
    lpt.transform(m)
    plan = compile_model(m)
    x = RNG.uniform(-2, 3, (2, 3)).astype(np.float32)
    np.testing.assert_array_equal(plan.run({"x": x})["y"], run_ort(m, {"x": x})[0])


def test_an_exported_conv_transpose_keeps_the_accumulator_type_for_what_reads_it():
    """PaddleOCR's detector: ConvTranspose → Identity, so the Identity reads the int32 accumulator."""
    from lpt.export.int8 import to_standard_int8
    from tests.transformations.builders import Graph

    g = Graph()
    up = g.op("ConvTranspose", [g.fq("x", 0.02, np.uint8(100)), g.weight((3, 4, 2, 2), axis=1)], strides=[2, 2])
    g.op("Sigmoid", [g.op("Identity", [up])], name="y")
    _, m = g.build({"x": [1, 3, 4, 4]}, ["y"])
    lpt.transform(m)
    exported, _ = to_standard_int8(m)
    x = RNG.uniform(-2, 3, (1, 3, 4, 4)).astype(np.float32)
    # the Identity is inside the layer's chain, so the Sigmoid is lpt's (lpt.numerics.exp), the
    # export's onnxruntime's: a few float32 steps apart
    np.testing.assert_allclose(run_ort(exported, {"x": x})[0], compile_model(m).run({"x": x})["y"], rtol=1e-6,
                               atol=1e-6)


@pytest.mark.parametrize("floor_first", [False, True])
def test_leaky_relu_and_a_max_with_a_constant_join_the_output_stage(floor_first):
    """TensorFlow exports write LeakyRelu then Max(x, c) after each convolution (openWakeWord's
    embedding model): both are output-stage post-ops, so the layer stays on integers end to end."""
    import lpt.native
    from lpt.backend.native_program import ENGINE
    from tests.transformations.builders import Graph

    g = Graph()
    conv = g.op("Conv", [g.fq("x", 0.02, np.uint8(100)), g.weight((6, 3, 3, 3))], pads=[1, 1, 1, 1])
    leaky = lambda v: g.op("LeakyRelu", [v], alpha=0.2)  # noqa: E731
    floor = lambda v: g.op("Max", [g.const(np.float32(-0.3)), v])  # noqa: E731 - the constant first: Max commutes
    tail = leaky(floor(conv)) if floor_first else floor(leaky(conv))
    g.op("Relu", [g.fq(tail, 0.01, np.uint8(40))], name="y")
    _, m = g.build({"x": [2, 3, 8, 8]}, ["y"])
    lpt.transform(m)
    plan = compile_model(m)
    chain = ("ConvInteger", "Cast", "Mul", "LeakyRelu", "Max", "QuantizeLinear") if not floor_first else \
        ("ConvInteger", "Cast", "Mul", "Max", "LeakyRelu", "QuantizeLinear")
    assert chain in [s.op_types for s in plan.steps]
    assert not plan.fallback_ops()
    x = RNG.uniform(-2, 3, (2, 3, 8, 8)).astype(np.float32)
    ours = plan.run({"x": x})["y"]
    np.testing.assert_array_equal(ours, lpt.run_reference(m, {"x": x})["y"])
    if lpt.native.available():
        assert any(s.engine == ENGINE for s in plan.run_steps)


def test_a_bias_past_int32_levels_stays_out_of_qlinear_conv():
    """A channel of near-zero weights (pruned, or dead in a real detector) has a tiny weight scale, so
    its bias in units of the multiplier is past int32: the export keeps the integer chain rather than
    writing a garbage QLinearConv bias."""
    import warnings

    import onnx
    import onnx_ir as ir
    from onnx import helper, numpy_helper

    from lpt.export.int8 import to_standard_int8

    weights = RNG.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    weights[2] *= 1e-12
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Conv", ["r", "w2"], ["y"])],  # reads the first one's output quantized
        "dead_channel", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2, 6, 6])],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.full(4, 0.5, np.float32), "b"),
         numpy_helper.from_array(RNG.normal(0, 0.3, (2, 4, 1, 1)).astype(np.float32), "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = {"x": RNG.uniform(-1, 1, (16, 1, 3, 6, 6)).astype(np.float32)}
    fq = lpt.calibrate(ir.serde.deserialize_model(model), {"x": data["x"].reshape(16, 3, 6, 6)}, quiet=True).model
    lpt.transform(int8 := fq)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        exported, report = to_standard_int8(int8)
    assert report.fused == []  # the first keeps its chain; the second has no quantize after it
    x = data["x"][0]
    np.testing.assert_allclose(lpt.run_reference(exported, {"x": x})["y"], compile_model(int8).run({"x": x})["y"],
                               atol=1e-6)


@pytest.mark.parametrize("head, channels", [("quantized", 5), ("sigmoid", 5), ("sigmoid", 1)])
def test_a_decoders_2x2_upsampling_runs_on_the_native_engine_as_a_matmul(head, channels):
    """ConvTranspose with stride = kernel (each output pixel reads one input pixel) is a matmul of the
    pixels' channels and its outputs laid out again: on the native engine, the same bits as lpt's kernels.
    One channel: a text detector's probability map, laid out as runs of two floats."""
    import lpt.native
    from tests.transformations.builders import Graph

    g = Graph()
    up = g.op("ConvTranspose", [g.fq("x", 0.02, np.uint8(100)), g.weight((24, channels, 2, 2), axis=1),
                                g.const(g.rng.normal(size=channels).astype(np.float32))], strides=[2, 2])
    if head == "quantized":
        g.op("Relu", [g.fq(g.op("Relu", [up]), 0.05, np.uint8(0))], name="y")
    else:  # a text detector's probability map: Sigmoid, in f32
        g.op("Sigmoid", [up], name="y")
    _, m = g.build({"x": [2, 24, 5, 7]}, ["y"])
    lpt.transform(m)
    plan = compile_model(m)
    step = next(s for s in plan.steps if "ConvTransposeInteger" in s.op_types)
    x = RNG.uniform(-2, 3, (2, 24, 5, 7)).astype(np.float32)
    ours = plan.run({"x": x})["y"]
    assert ours.shape == (2, channels, 10, 14)
    np.testing.assert_array_equal(ours, compile_model(m, native=False).run({"x": x})["y"])
    if lpt.native.available() and lpt.native.route() is not None:
        assert step.engine == lpt.native.engine_name(lpt.native.route())


@pytest.mark.parametrize("source", ["convolution", "input"])
def test_an_upsampling_between_layers_is_an_instruction_of_their_native_program(source):
    """Between two convolutions (whose outputs lie channels-last in a program), or reading the
    quantized input (channels-first), the upsampling joins the program, with the same bits as lpt's
    kernels and one output pixel per input pixel and tap."""
    import lpt.native
    from tests.transformations.builders import Graph

    g = Graph()
    x = g.fq("x", 0.02, np.uint8(100))
    if source == "convolution":
        x = g.fq(g.op("Relu", [g.op("Conv", [x, g.weight((16, 3, 3, 3)), g.const(np.zeros(16, np.float32))],
                                   pads=[1, 1, 1, 1])]), 0.04, np.uint8(0))
    channels = 16 if source == "convolution" else 3
    up = g.op("ConvTranspose", [x, g.weight((channels, 6, 2, 2), axis=1),
                                g.const(g.rng.normal(size=6).astype(np.float32))], strides=[2, 2])
    y = g.fq(g.op("Relu", [up]), 0.05, np.uint8(0))
    g.op("Conv", [y, g.weight((4, 6, 3, 3)), g.const(np.zeros(4, np.float32))], pads=[1, 1, 1, 1], name="y")
    _, m = g.build({"x": [2, 3, 5, 7]}, ["y"])
    lpt.transform(m)
    plan = compile_model(m)
    x = RNG.uniform(-2, 3, (2, 3, 5, 7)).astype(np.float32)
    ours = plan.run({"x": x})["y"]
    assert ours.shape == (2, 4, 10, 14)
    np.testing.assert_array_equal(ours, compile_model(m, native=False).run({"x": x})["y"])
    if lpt.native.available():
        [program] = [s for s in plan.run_steps if "ConvTransposeInteger" in s.op_types]
        assert program.engine == "native program" and "ConvInteger" in program.op_types


@pytest.mark.parametrize("auto_pad, stride, native", [("SAME_UPPER", 1, True), ("SAME_LOWER", 1, True), ("VALID", 1, True),
                                                      ("SAME_UPPER", 2, False)])
def test_auto_pad_with_pads_the_input_size_does_not_decide_runs_on_the_native_engine(auto_pad, stride, native):
    """PaddleOCR's 2×2 convolutions write auto_pad SAME_UPPER: with stride 1 the pads are fixed (0 before, 1
    after), so the engine takes the layer; with a stride they follow the input's size, and lpt's kernels do."""
    import lpt.native
    from tests.transformations.builders import Graph

    g = Graph()
    g.op("Conv", [g.fq("x", 0.02, np.uint8(100)), g.weight((6, 4, 2, 2))], name="y", auto_pad=auto_pad,
         strides=[stride, stride])
    fq_model, m = g.build({"x": [2, 4, 7, 9]}, ["y"])
    lpt.transform(m)
    plan = compile_model(m)
    x = RNG.uniform(-2, 3, (2, 4, 7, 9)).astype(np.float32)
    ours = plan.run({"x": x})["y"]
    np.testing.assert_array_equal(ours, compile_model(m, native=False).run({"x": x})["y"])
    np.testing.assert_allclose(ours, run_ort(fq_model, {"x": x})[0], rtol=1e-5, atol=1e-5)  # the QDQ model, in f32
    if lpt.native.available() and lpt.native.route() is not None:
        step = next(s for s in plan.steps if s.layer is not None)
        assert lpt.native.is_native_engine(step.engine) == native


def test_a_max_pool_with_auto_pad_same_and_stride_1_and_a_concat_of_integers_join_the_native_program():
    """PaddleOCR's detector: Conv → Relu → quantize → MaxPool(2×2, stride 1, SAME_UPPER) and a Concat of the
    pooled and unpooled integers. The pool's pads are fixed (0 before, 1 after), so both run on integers in
    the layers' native program, with the bits of lpt's kernels."""
    import lpt.native
    from lpt.backend.native_program import ENGINE
    from tests.transformations.builders import Graph

    g = Graph()
    relu = g.fq(g.op("Relu", [g.op("Conv", [g.fq("x", 0.02, np.uint8(100)), g.weight((6, 3, 3, 3))], pads=[1] * 4)]),
                0.05, np.uint8(0))
    pooled = g.op("MaxPool", [relu], kernel_shape=[2, 2], strides=[1, 1], auto_pad="SAME_UPPER")
    joined = g.op("Concat", [pooled, relu], axis=1)
    g.op("Conv", [joined, g.weight((4, 12, 1, 1))], name="y")
    fq_model, m = g.build({"x": [2, 3, 7, 9]}, ["y"])
    lpt.transform(m)
    plan = compile_model(m)
    assert not [s for s in plan.steps if s.backend == "onnxruntime"]
    x = RNG.uniform(-2, 3, (2, 3, 7, 9)).astype(np.float32)
    ours = plan.run({"x": x})["y"]
    np.testing.assert_array_equal(ours, compile_model(m, native=False).run({"x": x})["y"])
    np.testing.assert_allclose(ours, run_ort(fq_model, {"x": x})[0], rtol=1e-4, atol=1e-4)
    if lpt.native.available():
        assert [s.engine for s in plan.run_steps] == [ENGINE]
