"""Dynamic quantization (lpt.calibration.dynamic, `lpt quantize --dynamic`) on small models built here."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from onnx import helper

import lpt
import lpt.native
from cli.main import main
from lpt.calibration.dynamic import integer_agreement, quantize_dynamic
from lpt.model_io import to_proto
from tests.graphs import ir_model, model, op_types, run_ort

RNG = np.random.default_rng(15)


def sqnr(reference: np.ndarray, candidate: np.ndarray) -> float:
    return float(10 * np.log10((reference.astype(np.float64) ** 2).sum()
                               / ((reference.astype(np.float64) - candidate) ** 2).sum()))


def linear_net(opset: int = 13) -> onnx.ModelProto:
    """x → MatMul → Relu → Gemm(transB, alpha, beta, bias) → Relu → Conv(1-D) → y; the weights' columns span
    three decades of magnitude, where one scale per tensor leaves the small ones a few levels."""
    spread = np.logspace(0, -3, 16).astype(np.float32)
    inits = {"w": RNG.normal(0, 0.3, (8, 16)).astype(np.float32) * spread,
             "g": RNG.normal(0, 0.3, (12, 16)).astype(np.float32) * spread * 100,
             "gb": RNG.normal(0, 0.1, 12).astype(np.float32),
             "k": RNG.normal(0, 0.3, (4, 1, 3)).astype(np.float32), "kb": RNG.normal(0, 0.1, 4).astype(np.float32),
             "axes": np.array([1], np.int64)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
             helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("Gemm", ["r", "g", "gb"], ["gm"], name="gemm", transB=1, alpha=0.5, beta=2.0),
             helper.make_node("Relu", ["gm"], ["r2"]),
             helper.make_node("Unsqueeze", ["r2", "axes"], ["u"]),
             helper.make_node("Conv", ["u", "k", "kb"], ["y"], name="conv", pads=[1, 1])]
    return model(nodes, {"x": ["N", 8]}, {"y": None}, inits, opset=opset)


def recurrent_net(op: str) -> onnx.ModelProto:
    """x [T, N, 8] → LSTM or GRU (bidirectional) → y."""
    gates, hidden = (4 if op == "LSTM" else 3), 6
    inits = {"W": RNG.normal(0, 0.4, (2, gates * hidden, 8)).astype(np.float32),
             "R": RNG.normal(0, 0.4, (2, gates * hidden, hidden)).astype(np.float32),
             "B": RNG.normal(0, 0.1, (2, 2 * gates * hidden)).astype(np.float32)}
    extra = {"linear_before_reset": 1} if op == "GRU" else {}
    nodes = [helper.make_node(op, ["x", "W", "R", "B"], ["y", "h"], name=op.lower(), hidden_size=hidden,
                              direction="bidirectional", **extra)]
    return model(nodes, {"x": [5, "N", 8]}, {"y": None}, inits)


def inputs(shape) -> dict[str, np.ndarray]:
    return {"x": RNG.normal(0, 1, shape).astype(np.float32)}


def test_matmul_gemm_conv_take_the_dynamic_form():
    result = quantize_dynamic(ir_model(linear_net()), conv=True)
    types = op_types(result.model)
    assert types.count("DynamicQuantizeLinear") == 3 and types.count("MatMulInteger") == 2
    assert "ConvInteger" in types and not {"MatMul", "Gemm", "Conv"} & set(types)
    assert [(op.node, op.op_type) for op in result.report.quantized] == [
        ("matmul", "MatMul"), ("gemm", "Gemm"), ("conv", "Conv")]
    initializers = result.model.graph.initializers
    assert initializers["matmul.weight_quantized"].const_value.numpy().dtype == np.uint8  # u8·u8: exact on AVX2 too
    assert initializers["matmul.weight_scale"].const_value.numpy().shape == (16,)  # one scale per column
    assert not {"w", "g", "gb", "k"} & set(initializers)  # the f32 weights are gone


def test_lpt_equals_onnxruntime_on_the_dynamic_model():
    dynamic = quantize_dynamic(ir_model(linear_net()), conv=True).model
    feeds = inputs((6, 8))
    plan = lpt.compile_model(lpt.clone(dynamic))
    agreement = integer_agreement(dynamic, plan, feeds)
    assert len(agreement) == 9  # 3 × (u8 tensor, zero point) + 3 int32 accumulators
    assert all(t.max_lsb == 0 for t in agreement)
    np.testing.assert_array_equal(plan.run(feeds)["y"], run_ort(to_proto(dynamic), feeds)[0])
    if lpt.native.available():  # constant weights: the engine, each layer's chain one step (lpt.backend.dynamic_layers)
        layers = [s for s in plan.steps if {"MatMulInteger", "ConvInteger"} & set(s.op_types)]
        assert len(layers) == 3 and all(s.native[0] == "dynamic_layer" for s in layers)
        assert all(lpt.native.is_native_engine(s.engine) for s in layers)


def spread_matmul() -> onnx.ModelProto:
    """y = x·W, W's columns spanning three decades of magnitude: one scale per tensor leaves the small ones
    a few levels, one per column keeps every column's relative precision."""
    weights = RNG.normal(0, 0.3, (32, 16)).astype(np.float32) * np.logspace(0, -3, 16).astype(np.float32)
    return model([helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")], {"x": ["N", 32]}, {"y": None},
                 {"w": weights})


def worst_column_sqnr(reference: np.ndarray, candidate: np.ndarray) -> float:
    return min(sqnr(reference[:, j], candidate[:, j]) for j in range(reference.shape[1]))


def test_per_column_scales_beat_one_scale_per_tensor(tmp_path):
    """lpt's worst column against fp32 far above onnxruntime's quantize_dynamic (one scale per weight tensor),
    both run on lpt's exact backend; a per-column scale off by 3% falls well below lpt's figure."""
    from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic

    proto = spread_matmul()
    feeds = inputs((64, 32))
    fp32 = run_ort(proto, feeds)[0]
    dynamic = quantize_dynamic(ir_model(proto)).model
    ours = worst_column_sqnr(fp32, lpt.compile_model(lpt.clone(dynamic)).run(feeds)["y"])
    onnx.save(proto, tmp_path / "fp32.onnx")
    ort_quantize_dynamic(tmp_path / "fp32.onnx", tmp_path / "ort.onnx")
    theirs = worst_column_sqnr(fp32, lpt.compile_model(lpt.read_model(tmp_path / "ort.onnx")).run(feeds)["y"])
    assert ours > 35 and ours > theirs + 20, (ours, theirs)
    wrong = lpt.clone(dynamic)
    scale = wrong.graph.initializers["matmul.weight_scale"].const_value.numpy().copy()
    scale[-1] *= np.float32(1.03)
    wrong.graph.initializers["matmul.weight_scale"].const_value = ir.Tensor(scale)
    assert worst_column_sqnr(fp32, lpt.compile_model(wrong).run(feeds)["y"]) < 32


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_recurrent_input_weights_go_int8_and_the_recurrence_stays_f32(op):
    proto = recurrent_net(op)
    result = quantize_dynamic(ir_model(proto))
    assert [(o.node, o.op_type) for o in result.report.weights_only] == [(op.lower(), op)]
    initializers = result.model.graph.initializers
    assert initializers[f"{op.lower()}.W_quantized"].const_value.numpy().dtype == np.int8
    assert initializers[f"{op.lower()}.W_scale"].const_value.numpy().shape == (2, (4 if op == "LSTM" else 3) * 6, 1)
    assert "W" not in initializers and "R" in initializers  # R stays f32: its error compounds over time steps
    feeds = inputs((5, 3, 8))
    fp32 = run_ort(proto, feeds)[0]
    theirs = run_ort(to_proto(result.model), feeds)[0]
    ours = lpt.compile_model(lpt.clone(result.model)).run(feeds)["y"]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert sqnr(fp32, ours) > 38
    # one scale for the whole tensor (what a broadcast along the wrong axis would amount to) loses
    wrong = lpt.clone(result.model)
    for name in (f"{op.lower()}.W_scale",):
        scale = wrong.graph.initializers[name].const_value.numpy()
        wrong.graph.initializers[name].const_value = ir.Tensor(np.roll(scale, 1, axis=1))
    assert sqnr(fp32, run_ort(to_proto(wrong), feeds)[0]) < 20


def test_quantize_dynamic_through_the_pipeline_and_ignore():
    proto = linear_net()
    result = lpt.quantize(ir_model(proto), inputs((8, 8)), dynamic=True, subset_size=8, ignore=("gemm",))
    report = result.report
    assert report.calibration is None and [o.node for o in report.dynamic.quantized] == ["matmul"]
    left = {o.node: o.how for o in report.dynamic.left_f32}
    assert left["gemm"] == "ignored (--ignore)" and left["conv"].startswith("Conv stays f32 by default")
    assert report.check.tensors and report.check.max_lsb == 0 and report.check.local and report.check.max_local_lsb == 0
    assert report.agreement.outputs["y"].sqnr_db > 30  # against fp32, not against the dynamic model itself
    assert report.agreement.outputs["y"].sqnr_db < 200
    # u8 x u8 products: no note that onnxruntime's u8 x s8 kernels saturate on AVX2 (a static model gets one there)
    assert all(o.note == "" for o in report.check.outputs)


def test_cli_dynamic_writes_the_model_and_says_what_it_did(tmp_path):
    onnx.save(linear_net(), tmp_path / "net.onnx")
    np.savez(tmp_path / "net.npz", **inputs((8, 8)))
    result = CliRunner().invoke(main, ["quantize", str(tmp_path / "net.onnx"), "--dynamic", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "quantized dynamically (no calibration): 2 ops" in result.output and "left f32: conv" in result.output
    assert "max 0 LSB" in result.output
    written = onnx.load(tmp_path / "net.fq.onnx")
    assert "MatMulInteger" in {n.op_type for n in written.graph.node}


@pytest.mark.parametrize("option", [["--max-drop", "0.5", "--labels", "y"], ["--preset", "mixed"],
                                    ["--overflow-fix", "all"]])
def test_cli_dynamic_refuses_static_options_in_one_line(tmp_path, option):
    onnx.save(linear_net(), tmp_path / "net.onnx")
    np.savez(tmp_path / "net.npz", **inputs((8, 8)))
    result = CliRunner().invoke(main, ["quantize", str(tmp_path / "net.onnx"), "--dynamic", *option])
    assert result.exit_code == 1
    assert result.output.strip().count("\n") == 0 and option[0] in result.output and "--dynamic" in result.output
    assert not (tmp_path / "net.fq.onnx").exists()
