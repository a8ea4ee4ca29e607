"""The bars on the bundled digits_cnn: top-1 within 0.3 pt of fp32 with the default preset, and an
output SQNR at least that of onnxruntime's quantize_static (QDQ, per-channel, same calibration data).
Both FQ models run in onnxruntime with graph optimizations off."""

from pathlib import Path

import numpy as np
import pytest

import lpt
from lpt.calibration import calibrate

MODELS = Path(__file__).resolve().parents[2] / "models"
FP32, CALIB, TEST = (MODELS / f"digits_cnn{s}" for s in (".onnx", ".npz", ".test.npz"))


def run(path, feeds):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def sqnr(reference, approx):
    reference = reference.astype(np.float64)
    return 10 * np.log10(np.sum(reference**2) / np.sum((reference - approx) ** 2))


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    from onnxruntime import quantization as ortq

    tmp = tmp_path_factory.mktemp("digits_cnn")
    with np.load(TEST) as d:
        labels, test = d["labels"], {"input": d["input"]}
    with np.load(CALIB) as d:
        calib = d["input"]

    lpt.save(calibrate(FP32, CALIB, quiet=True).model, tmp / "lpt.onnx")

    class Reader(ortq.CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"input": calib[i:i + 32]} for i in range(0, len(calib), 32)])

        def get_next(self):
            return next(self.batches, None)

    ortq.quantize_static(str(FP32), str(tmp / "ort.onnx"), Reader(), quant_format=ortq.QuantFormat.QDQ,
                         per_channel=True, activation_type=ortq.QuantType.QUInt8, weight_type=ortq.QuantType.QInt8)
    return labels, {name: run(path, test) for name, path in
                    (("fp32", FP32), ("lpt", tmp / "lpt.onnx"), ("ort", tmp / "ort.onnx"))}


def test_top1_within_0_3_pt_of_fp32(outputs):
    labels, logits = outputs
    fp32, quantized = ((logits[k].argmax(axis=1) == labels).mean() for k in ("fp32", "lpt"))
    assert 100 * (fp32 - quantized) <= 0.3


def test_output_sqnr_at_least_onnxruntime_quantize_static(outputs):
    _, logits = outputs
    assert sqnr(logits["fp32"], logits["lpt"]) >= sqnr(logits["fp32"], logits["ort"])
