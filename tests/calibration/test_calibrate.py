"""calibrate() end to end on small nets: presets, zero ranges, Concat ranges, bias correction, files untouched."""

import hashlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import lpt
from lpt.calibration import ActivationScheme, calibrate
from lpt.graph.fake_quantize_op import read_fake_quantize
from tests.calibration.nets import Net, as_ir, conv_inputs, conv_net
from tests.graphs import run_ort


def fq_nodes(model):
    return {n.inputs[0].name: read_fake_quantize(n) for n in model.graph if n.op_type == "FakeQuantize"}


def saved(result, tmp_path, name="out.onnx"):
    return onnx.load(lpt.save(result.model, tmp_path / name))


def sqnr(reference, approx):
    return 10 * np.log10(np.sum(reference**2) / np.sum((reference - approx) ** 2))


def test_conv_net_becomes_standard_qdq_that_onnxruntime_runs_close_to_fp32(tmp_path):
    proto = conv_net()
    result = calibrate(as_ir(proto), conv_inputs(200), quiet=True)
    qdq = saved(result, tmp_path)
    assert [n.op_type for n in qdq.graph.node] == [
        "QuantizeLinear", "DequantizeLinear", "DequantizeLinear", "Conv", "Relu", "QuantizeLinear",
        "DequantizeLinear", "MaxPool", "Flatten", "DequantizeLinear", "Gemm"]
    x = conv_inputs(100, seed=7)
    assert sqnr(run_ort(proto, x)[0], run_ort(qdq, x)[0]) > 30
    report = result.report
    assert report.fake_quantizes == {"activation u8": 2, "weight i8 per-channel": 2}
    assert report.left_f32 == () and report.samples == 200 and report.seconds > 0
    assert set(report.bias_corrected) == {"conv", "y"}


def test_weights_are_symmetric_int8_narrow_range_per_output_channel():
    proto = conv_net()
    fqs = fq_nodes(calibrate(as_ir(proto), conv_inputs(), quiet=True, overflow_fix="none").model)
    w = onnx.numpy_helper.to_array(next(i for i in proto.graph.initializer if i.name == "conv.w"))
    fq = fqs["conv.w"]
    assert fq.levels == 255 and fq.zero_point.dtype == np.int8 and not fq.zero_point.any()
    np.testing.assert_allclose(fq.scale, np.abs(w).reshape(4, -1).max(axis=1) / 127, rtol=1e-6)
    gemm_w = onnx.numpy_helper.to_array(next(i for i in proto.graph.initializer if i.name == "y.w"))
    np.testing.assert_allclose(fqs["y.w"].scale, np.abs(gemm_w).max(axis=1) / 127, rtol=1e-6)  # transB: axis 0


def signed_net():
    n = Net()
    n.conv("x", "y", 1, 3)
    return n.build({"x": ["N", 1, 8, 8]}, ["y"])


def signed_inputs(n=50):
    return {"x": np.random.default_rng(0).uniform(-0.5, 1.5, (n, 1, 8, 8)).astype(np.float32)}


@pytest.mark.parametrize("preset, dtype, zero_point", [
    ("performance", np.int8, 0),  # symmetric: i8 for a signed tensor, scale = max|x|/127
    ("mixed", np.uint8, 64),  # asymmetric u8: [-0.5, 1.5] → zero point 255·0.5/2 ≈ 64
])
def test_presets_quantize_a_signed_activation(preset, dtype, zero_point):
    fq = fq_nodes(calibrate(as_ir(signed_net()), signed_inputs(), preset=preset, estimator="minmax",
                            quiet=True).model)["x"]
    assert fq.zero_point.dtype == dtype and int(fq.zero_point) == zero_point
    x = signed_inputs()["x"]
    if preset == "performance":
        assert np.isclose(fq.scale, np.abs(x).max() / 127)
    else:  # nudged: 0.0 is exactly representable
        assert fq.apply(np.zeros(1, np.float32))[0] == 0.0
        assert np.isclose(fq.scale, (x.max() - x.min()) / 255, rtol=1e-2)


def test_a_constant_activation_gets_a_tiny_safe_range(caplog):
    n = Net()
    r = n.op("Relu", ["x"], "r")  # all inputs negative: r is constant 0
    n.conv(r, "y", 1, 2)
    proto = n.build({"x": ["N", 1, 8, 8]}, ["y"])
    x = {"x": -np.ones((8, 1, 8, 8), np.float32)}
    result = calibrate(as_ir(proto), x, estimator="minmax", quiet=True)
    fq = fq_nodes(result.model)["r"]
    assert 0 < float(fq.scale) < 1e-8 and np.isfinite(fq.output_high).all()
    assert "nearly) constant" in caplog.text
    np.testing.assert_allclose(run_ort(lpt.to_portable(result.model), x)[0],
                               run_ort(proto, x)[0], atol=1e-5)


def test_concat_inputs_share_one_range():
    n = Net()
    a = n.op("Relu", [n.conv("x", "a", 1, 2)], "ra")
    b = n.op("Relu", [n.op("Mul", ["x", n.const("ten", 10.0)], "b")], "rb")  # a 10x wider branch
    c = n.op("Concat", [a, b], "cat", axis=1)
    n.conv(c, "y", 3, 2)
    proto = n.build({"x": ["N", 1, 8, 8]}, ["y"])
    fqs = fq_nodes(calibrate(as_ir(proto), conv_inputs(), quiet=True).model)
    assert "cat" not in fqs
    assert float(fqs["ra"].scale) == float(fqs["rb"].scale)
    assert np.isclose(float(fqs["rb"].output_high), 10 * conv_inputs()["x"].max(), rtol=0.05)


def test_bias_correction_removes_the_mean_output_error_and_can_be_turned_off():
    proto = conv_net()
    x, test = conv_inputs(200), conv_inputs(200, seed=9)
    fp32 = run_ort(proto, test)[0]
    errors = {}
    for on in (True, False):
        result = calibrate(as_ir(proto), x, bias_correction=on, estimator="minmax", quiet=True)
        out = run_ort(lpt.to_portable(result.model), test)[0]
        errors[on] = np.abs((out - fp32).mean(axis=0)).mean()
        assert bool(result.report.bias_corrected) is on
    assert errors[True] < errors[False]


def test_the_input_model_object_and_file_are_never_modified(tmp_path):
    proto = conv_net()
    path = tmp_path / "net.onnx"
    onnx.save(proto, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    m = as_ir(proto)
    before = ir.serde.serialize_model(m).SerializeToString()
    calibrate(path, conv_inputs(), quiet=True)
    result = calibrate(m, conv_inputs(), quiet=True)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert ir.serde.serialize_model(m).SerializeToString() == before
    assert result.model is not m


def test_output_is_written_atomically_and_never_over_an_existing_file(tmp_path, monkeypatch):
    result = calibrate(as_ir(conv_net()), conv_inputs(), quiet=True)
    out = tmp_path / "m.fq.onnx"
    out.write_bytes(b"keep me")
    with pytest.raises(lpt.ModelError, match="already exists"):
        lpt.save(result.model, out)
    assert out.read_bytes() == b"keep me"

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", crash)
    with pytest.raises(OSError):
        lpt.save(result.model, out, overwrite=True)
    assert out.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.fq.onnx"]  # no temp file left behind


def test_an_already_quantized_model_is_refused(tmp_path):
    result = calibrate(as_ir(conv_net()), conv_inputs(), quiet=True)
    path = lpt.save(result.model, tmp_path / "q.onnx")
    with pytest.raises(lpt.ModelError, match="already quantized"):
        calibrate(path, conv_inputs(), quiet=True)


def test_ignored_layers_are_reported_and_stay_f32():
    result = calibrate(as_ir(conv_net()), conv_inputs(), ignore=["Gemm"], quiet=True)
    assert [(s.node, s.op_type, s.reason) for s in result.report.left_f32] == [("y", "Gemm", "ignored (Gemm)")]
    assert set(fq_nodes(result.model)) == {"x", "conv.w"}


@pytest.mark.parametrize("estimator", ["minmax", "mean_minmax", "percentile", "mse", "kl", "auto"])
def test_every_estimator_gives_a_model_close_to_fp32(estimator):
    proto = conv_net()
    result = calibrate(as_ir(proto), conv_inputs(100), estimator=estimator, quiet=True)
    x = conv_inputs(50, seed=3)
    assert sqnr(run_ort(proto, x)[0], run_ort(lpt.to_portable(result.model), x)[0]) > 25


def test_bad_preset_and_estimator_names_are_one_line_errors():
    with pytest.raises(lpt.QuantizationError, match="unknown preset 'fast': choose one of performance, mixed"):
        calibrate(as_ir(conv_net()), conv_inputs(), preset="fast")
    with pytest.raises(lpt.QuantizationError, match="unknown estimator"):
        calibrate(as_ir(conv_net()), conv_inputs(), estimator="max")


def test_attention_block_with_int_tokens_and_matmul_biases(tmp_path):
    from tests.calibration.nets import attention_net, token_inputs

    proto = attention_net()
    result = calibrate(as_ir(proto), token_inputs(200), quiet=True)
    fqs = fq_nodes(result.model)
    assert "table" not in fqs and "emb" not in fqs  # the embedding stays f32
    assert {"ln", "q", "k", "att", "v", "ctx", "wq", "wk", "wv", "wo"} <= set(fqs)  # k: through its Transpose
    assert set(result.report.bias_corrected) == {"q_mm", "k_mm", "v_mm", "y_mm"}  # MatMul + Add biases
    x = token_inputs(100, seed=5)
    assert sqnr(run_ort(proto, x)[0], run_ort(saved(result, tmp_path), x)[0]) > 25


def test_progress_bar_on_a_terminal_only_and_never_when_quiet(monkeypatch, capsys):
    from lpt.calibration import progress

    calibrate(as_ir(conv_net()), conv_inputs(), bias_correction=False)  # pytest's stdout is not a TTY
    assert capsys.readouterr().err == ""
    from rich.console import Console

    monkeypatch.setattr(progress, "interactive", lambda: True)
    monkeypatch.setattr(progress, "_console", lambda: Console(stderr=True, force_terminal=True, width=100))
    calibrate(as_ir(conv_net()), conv_inputs(), bias_correction=False, quiet=True)
    assert capsys.readouterr().err == ""
    calibrate(as_ir(conv_net()), conv_inputs(), bias_correction=False)
    err = capsys.readouterr().err
    assert "calibrating" in err and "40/40" in err


def test_openvino_runs_the_saved_qdq_model(tmp_path):
    ov = pytest.importorskip("openvino")
    proto = conv_net()
    path = lpt.save(calibrate(as_ir(proto), conv_inputs(100), quiet=True).model, tmp_path / "m.onnx")
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    x = conv_inputs(20, seed=4)
    out = compiled(x["x"])[compiled.output(0)]
    assert sqnr(run_ort(proto, x)[0], out) > 25


def test_statistics_and_ranges_apply_again_to_a_fresh_copy_without_calibrating(monkeypatch):
    """The steps after the data pass, run by hand: the same model; with the Gemm left out, its FQs go."""
    from lpt.calibration import insertion, place, statistics
    from lpt.calibration.bias_correction import apply_shifts, bias_shifts, bias_targets
    from lpt.calibration.overflow_fix import narrow

    proto = conv_net()
    result = calibrate(as_ir(proto), conv_inputs(), quiet=True)
    monkeypatch.setattr(statistics, "session", None)  # no second look at the data

    def apply(ignore=()):
        model = as_ir(proto)
        placement = place(model, ignore)
        fqs = insertion.fake_quantizes(placement, result.ranges, ActivationScheme(symmetric=False))
        fqs = narrow(fqs, result.narrowed)  # the overflow fix's 7-bit channels, kept by name too
        targets = bias_targets(placement.layers)
        shifts = bias_shifts(targets, result.statistics.input_means, fqs, result.statistics.activations)
        insertion.insert(model, fqs)
        return model, apply_shifts(model, targets, shifts)

    again, corrected = apply()
    assert portable_bytes(again) == portable_bytes(result.model) and corrected == list(result.report.bias_corrected)
    without_gemm, corrected = apply(ignore=["Gemm"])
    assert set(fq_nodes(without_gemm)) == {"x", "conv.w"} and corrected == ["conv"]


def portable_bytes(model):
    from lpt.model_io import to_proto

    return to_proto(lpt.to_portable(model)).SerializeToString()


def test_depthwise_conv_weights_get_one_scale_per_channel():
    n = Net()
    n.op("Conv", ["x", n.weight("dw.w", (4, 1, 3, 3))], "dw", group=4, pads=[1] * 4)
    proto = n.build({"x": ["N", 4, 8, 8]}, ["dw"])
    x = {"x": np.random.default_rng(0).uniform(0, 1, (20, 4, 8, 8)).astype(np.float32)}
    fq = fq_nodes(calibrate(as_ir(proto), x, quiet=True).model)["dw.w"]
    w = onnx.numpy_helper.to_array(next(i for i in proto.graph.initializer if i.name == "dw.w"))
    np.testing.assert_allclose(fq.scale, np.abs(w).reshape(4, -1).max(axis=1) / 127, rtol=1e-6)
