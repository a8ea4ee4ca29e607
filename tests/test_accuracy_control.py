"""Accuracy control: reverting the worst layers to f32 until a target holds, without calibrating again."""

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import lpt
from cli.main import main
from lpt.calibration import calibrate
from lpt.calibration.accuracy_control import control_accuracy, layers, revert
from lpt.graph.constants import const_array
from lpt.graph.fake_quantize_op import is_fake_quantize
from tests.calibration.nets import Net, as_ir
from tests.graphs import run_ort

MODELS = Path(__file__).parent.parent / "models"
MLP, MLP_DATA, MLP_TEST = MODELS / "tabular_mlp.onnx", MODELS / "tabular_mlp.npz", MODELS / "tabular_mlp.test.npz"


@pytest.fixture(scope="module")
def mlp():
    """tabular_mlp (3 Gemms) calibrated on its 300 samples: 37.7 dB logits SQNR on its 171 test samples."""
    fp32 = lpt.read_model(MLP)
    return fp32, calibrate(fp32, MLP_DATA, quiet=True)


def fq_readers(model) -> set[str]:
    """Names of the nodes reading a FakeQuantize's output."""
    return {use.node.name for n in model.graph if is_fake_quantize(n) for use in n.outputs[0].uses()}


def test_reverting_every_layer_gives_the_fp32_model_back(mlp):
    """No FQ left, and every bias (shifted by bias correction) back to fp32's: the same outputs, bit for bit."""
    fp32, calibration = mlp
    every = frozenset().union(*(layer.uses for layer in layers(fp32, calibration, calibration.config)))
    model = revert(calibration.model, fp32, every)
    assert not any(is_fake_quantize(n) for n in model.graph)
    x = {"input": np.load(MLP_TEST)["input"][:50]}
    np.testing.assert_array_equal(run_ort(model, x)[0], run_ort(fp32, x)[0])
    assert not np.array_equal(run_ort(lpt.to_portable(calibration.model), x)[0], run_ort(fp32, x)[0])


def test_a_reverted_layer_loses_its_fqs_and_its_bias_correction(mlp):
    fp32, calibration = mlp
    first = next(layer for layer in layers(fp32, calibration, calibration.config) if layer.nodes == ("/0/Gemm",))
    assert {(t, i) for t, _, i in first.uses} == {("input", 0), ("0.weight", 1)}
    model = revert(calibration.model, fp32, first.uses)
    assert fq_readers(model) == fq_readers(calibration.model) - {"/0/Gemm"} == {"/2/Gemm", "/4/Gemm"}
    assert sum(map(is_fake_quantize, model.graph)) == sum(map(is_fake_quantize, calibration.model.graph)) - 2

    def bias(m, node):
        return const_array(next(n for n in m.graph if n.name == node).inputs[2])

    np.testing.assert_array_equal(bias(model, "/0/Gemm"), bias(fp32, "/0/Gemm"))  # f32 again: no shift
    assert not np.array_equal(bias(calibration.model, "/0/Gemm"), bias(fp32, "/0/Gemm"))
    np.testing.assert_array_equal(bias(model, "/2/Gemm"), bias(calibration.model, "/2/Gemm"))  # kept as calibrated


def fan_out_net():
    """x → Conv c → Relu → MaxPool → (Conv a, Conv b) → Add → y: one FQ, moved above the MaxPool, serves a and b."""
    n = Net()
    r = n.op("Relu", [n.conv("x", "c", 1, 2)], "r")
    p = n.op("MaxPool", [r], "p", kernel_shape=[2, 2], strides=[2, 2])
    n.op("Add", [n.conv(p, "a", 2, 2), n.conv(p, "b", 2, 2)], "y")
    return as_ir(n.build({"x": ["N", 1, 8, 8]}, ["y"]))


def test_layers_sharing_one_fq_revert_together():
    fp32 = fan_out_net()
    data = {"x": np.random.default_rng(0).uniform(-1, 1, (16, 1, 8, 8)).astype(np.float32)}
    calibration = calibrate(fp32, data, quiet=True)
    found = {layer.nodes: {(t, node) for t, node, _ in layer.uses} for layer in layers(fp32, calibration,
                                                                                       calibration.config)}
    assert found == {
        ("c",): {("x", "c"), ("c.w", "c")},
        ("a", "b"): {("r", "p"), ("a.w", "a"), ("b.w", "b")},  # the FQ on r is read by the MaxPool
        ("y",): {("a", "y"), ("b", "y")},
    }


def test_min_sqnr_reverts_the_fewest_layers_that_reach_it(mlp):
    fp32, calibration = mlp
    result = control_accuracy(fp32, calibration, MLP_TEST, min_sqnr=45)
    report = result.report
    assert report.met and report.stopped is None
    assert report.before.sqnr_db < 40 <= 45 <= report.after.sqnr_db
    assert [layer.name for layer in report.ranking][0] == "/0/Gemm"  # 26 dB: its input's quantization costs most
    assert report.ranking == sorted(report.ranking, key=lambda layer: layer.sqnr_db)
    reverted = [layer.name for layer in report.reverted]
    assert reverted == ["/0/Gemm"]
    assert "/0/Gemm" not in fq_readers(result.model)
    # What the report says is what the model does (lpt compare on the same samples).
    assert lpt.compare(fp32, result.model, MLP_TEST).outputs["logits"].sqnr_db == pytest.approx(report.after.sqnr_db)
    # None fewer: the model with no revert misses; the report's trials say so too.
    assert report.trials[0].reverted == () and not report.trials[0].holds
    assert set(report.latency_ms) == {"before", "after"} and all(v > 0 for v in report.latency_ms.values())


def test_search_gives_back_layers_the_target_does_not_need(mlp):
    fp32, calibration = mlp
    report = control_accuracy(fp32, calibration, MLP_TEST, min_sqnr=54).report
    assert report.met and report.after.sqnr_db >= 54
    assert [layer.name for layer in report.ranking] == ["/0/Gemm", "/2/Gemm", "/4/Gemm"]
    # The two worst miss (52 dB), all three hold; /2/Gemm is then given back: the worst and the last do it.
    assert [layer.name for layer in report.reverted] == ["/0/Gemm", "/4/Gemm"]
    assert not next(t for t in report.trials if t.reverted == ("/0/Gemm", "/2/Gemm")).holds
    for layer in report.reverted:  # each revert is needed: without it the target is missed
        rest = frozenset().union(*(other.uses for other in report.reverted if other is not layer))
        model = revert(calibration.model, fp32, rest)
        assert lpt.compare(fp32, model, MLP_TEST).outputs["logits"].sqnr_db < 54, layer.name


def test_an_unreachable_target_returns_the_best_model_and_says_it_missed(mlp):
    fp32, calibration = mlp
    report = control_accuracy(fp32, calibration, MLP_TEST, max_drop=-50, labels="labels").report
    assert not report.met and report.stopped is None
    assert len(report.trials) >= 3  # it tried reverting 1, 2, then all 3 layers
    best = max(t.measure.top1 for t in report.trials)
    assert report.after.top1 == best and report.after.drop_pt > -50


def test_the_time_limit_stops_the_search_and_keeps_the_default_model(mlp):
    fp32, calibration = mlp
    result = control_accuracy(fp32, calibration, MLP_TEST, min_sqnr=45, max_time=1e-6)
    assert result.report.stopped.startswith("time limit") and not result.report.met
    assert len(result.report.trials) == 1 and result.report.reverted == []
    assert result.model is calibration.model


@pytest.mark.parametrize("kwargs, message", [
    pytest.param({"max_drop": 0.5, "min_sqnr": 40, "labels": "labels"}, "one target", id="two-targets"),
    pytest.param({"max_drop": 0.5}, "needs labels", id="no-labels"),
    pytest.param({"min_sqnr": float("nan")}, "finite", id="nan"),
    pytest.param({"min_sqnr": 40, "max_time": 0}, "positive", id="no-time"),
])
def test_bad_options_are_refused_before_calibrating(kwargs, message, monkeypatch):
    monkeypatch.setattr("lpt.pipeline.calibrate", lambda *a, **k: pytest.fail("calibrated"))
    with pytest.raises(lpt.QuantizationError, match=message):
        lpt.quantize(MLP, **kwargs)


def test_control_accuracy_needs_a_target(mlp):
    with pytest.raises(lpt.QuantizationError, match="one target"):
        lpt.control_accuracy(*mlp, MLP_TEST)


def test_a_model_already_fake_quantized_needs_recalibrate():
    with pytest.raises(lpt.QuantizationError, match="recalibrate"):
        lpt.quantize(MODELS / "digits_cnn.ort_qdq.onnx", MODELS / "digits_cnn.npz", min_sqnr=50)


def test_quantize_defaults_to_the_calibration_data_and_warns(caplog):
    with caplog.at_level(logging.WARNING):
        result = lpt.quantize(MLP, min_sqnr=45)
    control = result.report.accuracy_control
    assert control.samples == 300 and control.met and control.reverted
    assert "calibration data" in caplog.text
    assert result.report.to_dict()["accuracy_control"]["after"]["sqnr_db"] >= 45
    assert "/0/Gemm" not in fq_readers(result.fq_model)


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_cli_writes_the_reverted_model_and_reports_it(tmp_path):
    result = invoke("quantize", MLP, "--min-sqnr", 45, "--eval-data", MLP_TEST, "-o", tmp_path / "m",
                    "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert "output SQNR ≥ 45 dB on 171 samples: met" in result.output
    report = json.loads((tmp_path / "r.json").read_text())["accuracy_control"]
    assert report["met"] and [r["node"] for r in report["reverted"]] == ["/0/Gemm"]
    assert report["after"]["sqnr_db"] >= 45 > report["before"]["sqnr_db"]
    written = lpt.compare(MLP, tmp_path / "m.fq.onnx", MLP_TEST)
    assert written.outputs["logits"].sqnr_db == pytest.approx(report["after"]["sqnr_db"])


def test_cli_missed_target_still_writes_the_model_and_exits_2(tmp_path):
    result = invoke("quantize", MLP, "--max-drop", -50, "--labels", "labels", "--eval-data", MLP_TEST,
                    "-o", tmp_path / "m", "--json", tmp_path / "r.json")
    assert result.exit_code == 2, result.output
    assert "MISSED" in result.output and "accuracy target missed" in result.output
    assert (tmp_path / "m.fq.onnx").is_file() and (tmp_path / "m.int8.onnx").is_file()
    assert json.loads((tmp_path / "r.json").read_text())["accuracy_control"]["met"] is False
