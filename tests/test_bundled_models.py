"""The bundled models through every stage: load, inspect, calibrate, transform, run, compare."""

from pathlib import Path

import numpy as np
import onnx
import pytest

import lpt
from lpt.backend import compile_model
from lpt.crosscheck import quantized_tensor_agreement, run_onnxruntime
from lpt.graph.ops import QUANTIZABLE_OPS
from tests.graphs import ONNXRUNTIME_INT8_IS_EXACT

MODELS = Path(__file__).parent.parent / "models"
FP32 = ["digits_cnn", "digits_zoo", "digits_transformer", "tabular_mlp"]
# fp32 test top-1 the models were trained to (models/README.md); digits_cnn's bar is the 97%.
FP32_TOP1 = {"digits_cnn": 0.97, "digits_zoo": 0.95, "digits_transformer": 0.93, "tabular_mlp": 0.93}


def held_out(name):
    with np.load(MODELS / f"{name}.test.npz") as archive:
        return {k: archive[k] for k in archive.files}


@pytest.fixture(scope="module")
def calibrated():
    """Each fp32 model, calibrated by lpt with the defaults on its own calibration samples."""
    return {name: lpt.calibrate(MODELS / f"{name}.onnx", MODELS / f"{name}.npz", quiet=True).model for name in FP32}


@pytest.mark.parametrize("name", FP32)
def test_fp32_models_load_and_reach_their_accuracy(name):
    model = lpt.load(MODELS / f"{name}.onnx")
    assert model.opset_imports[""] >= 13 and (MODELS / f"{name}.onnx").stat().st_size < 2**21
    data = held_out(name)
    labels = data.pop("labels")
    logits = run_onnxruntime(model, data)["logits"]
    assert (logits.argmax(1) == labels).mean() >= FP32_TOP1[name]


def test_onnxruntime_qdq_model_saves_back_bit_exactly(tmp_path):
    source = MODELS / "digits_cnn.ort_qdq.onnx"
    model = lpt.load(source)
    summary = lpt.summarize(model)
    kinds = sorted(t.kind for t in summary.fake_quantized)  # 8 QDQ pairs (logits too) + 4 dequantized weights
    assert kinds == ["activation"] * 8 + ["weight"] * 4 and summary.unquantized == []
    saved = lpt.save(model, tmp_path / "saved.onnx")
    data = held_out("digits_cnn")
    data.pop("labels")
    original = run_onnxruntime(onnx.load(source), data)["logits"]
    np.testing.assert_array_equal(run_onnxruntime(onnx.load(saved), data)["logits"], original)


def test_openvino_fake_quantize_model_is_normalized_with_its_semantics():
    model = lpt.load(MODELS / "digits_cnn.ov_fq.onnx")
    summary = lpt.summarize(model)
    assert summary.op_counts["lpt::FakeQuantize"] == 8 and summary.unquantized == []
    weights = [t for t in summary.fake_quantized if t.kind == "weight"]
    assert {(t.levels, t.semantics, t.granularity) for t in weights} == {(255, "openvino", "per-channel (axis 0)")}
    data = held_out("digits_cnn")
    labels = data.pop("labels")
    logits = lpt.run_reference(model, {"input": data["input"][:100]})["logits"]
    assert (logits.argmax(1) == labels[:100]).mean() >= 0.97  # OpenVINO measured 98.89% on all 540


def fake_quantized_models(calibrated):
    yield "digits_cnn.ort_qdq", lpt.load(MODELS / "digits_cnn.ort_qdq.onnx"), "digits_cnn"
    yield "digits_cnn.ov_fq", lpt.load(MODELS / "digits_cnn.ov_fq.onnx"), "digits_cnn"
    for name in FP32:
        yield f"{name} (lpt calibrated)", calibrated[name], name


def test_every_fake_quantized_heavy_op_runs_on_integers_within_one_lsb(calibrated):
    """Issue bars: no quantizable op with fake-quantized inputs left in f32, and lpt's int8
    execution within 1 LSB of the FQ model on every quantized tensor: each layer fed the same
    integers as the reference (end to end, a 1-LSB tie can grow through the layers after it:
    digits_zoo shows 4 LSB on 0.0007% of one tensor's values over the whole test split)."""
    for label, fq_model, data_name in fake_quantized_models(calibrated):
        int8 = lpt.clone(fq_model)
        lpt.transform(int8)
        left = [n for n in int8.graph if n.op_type in QUANTIZABLE_OPS]
        assert left == [], f"{label}: {[(n.name, n.doc_string) for n in left]}"
        data = held_out(data_name)
        data.pop("labels")
        batch = {k: v[:128] for k, v in data.items()}
        plan = compile_model(int8)
        per_layer = quantized_tensor_agreement(int8, plan, fq_model, batch, local=True)
        assert per_layer, label
        assert max(a.max_lsb for a in per_layer) <= 1, (label, per_layer)
        end_to_end = quantized_tensor_agreement(int8, plan, fq_model, batch)
        share = sum(a.share_exact * a.size for a in end_to_end) / sum(a.size for a in end_to_end)
        assert share > 0.9999, (label, share)


def test_digits_cnn_int8_top1_within_0_3_points_of_fp32(calibrated):
    comparison = lpt.compare(MODELS / "digits_cnn.onnx", calibrated["digits_cnn"], MODELS / "digits_cnn.test.npz",
                             labels="labels")
    accuracy = comparison.to_dict()["accuracy"]
    assert accuracy["reference"] >= 0.97
    assert accuracy["drop"] <= 0.003


def test_per_layer_compare_puts_a_crushed_layer_first(calibrated):
    """Break one FakeQuantize on purpose (its range crushed to a tenth): compare --per-layer finds it."""
    broken = lpt.clone(calibrated["digits_cnn"])
    target = "/Relu_1_output_0"
    fq_node = next(n for n in broken.graph if n.op_type == "FakeQuantize" and n.inputs[0].name == target)
    for index in (1, 2, 3, 4):
        value = fq_node.inputs[index]
        value.const_value = lpt.model_io.ir.tensor(value.const_value.numpy() / 10, name=value.name)
    scale = fq_node.inputs[5]
    scale.const_value = lpt.model_io.ir.tensor(scale.const_value.numpy() / 10, name=scale.name)
    comparison = lpt.compare(MODELS / "digits_cnn.onnx", broken, MODELS / "digits_cnn.test.npz", per_layer=True)
    assert comparison.layers[0].name == target
    assert comparison.layers[0].sqnr_db < comparison.layers[1].sqnr_db - 10


def test_onnxruntime_qdq_model_on_both_backends():
    """The same third-party QDQ model, run by onnxruntime's own int8 kernels and by lpt's."""
    results = {backend: lpt.compare(MODELS / "digits_cnn.onnx", MODELS / "digits_cnn.ort_qdq.onnx",
                                    MODELS / "digits_cnn.test.npz", labels="labels", backend=backend).to_dict()
               for backend in ("onnxruntime", "lpt")}
    assert results["lpt"]["accuracy"]["drop"] <= 0.01
    sqnr = {b: r["outputs"]["logits"]["sqnr_db"] for b, r in results.items()}
    assert sqnr["lpt"] > 35, sqnr  # 39.8 dB on every CPU: lpt's integers do not depend on it
    if ONNXRUNTIME_INT8_IS_EXACT:  # without VNNI onnxruntime's u8·s8 kernels saturate (18.7 dB measured on a Zen 3)
        assert results["onnxruntime"]["accuracy"]["drop"] <= 0.01
        assert abs(sqnr["lpt"] - sqnr["onnxruntime"]) < 3, sqnr
