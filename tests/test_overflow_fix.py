"""--overflow-fix: which weights go to 7 bits so that AVX2's int16 pair sums cannot saturate.

On digits_cnn, whose first convolution (one input channel: pairs span kernel positions) saturates
on about a fifth of its sums: none leaves 8 bits, first and all put one or every layer on [-63, 63],
auto narrows the channels whose output saturation moved on the calibration data, and only those.
Everything runs on lpt's emulation; where onnxruntime itself saturates, its own run is checked too.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner

import lpt
from cli.main import main
from lpt.calibration import CalibrationConfig, OverflowFix, calibrate
from lpt.calibration.insertion import fake_quantizes
from lpt.calibration.overflow_fix import NARROW_QMAX, _best_qmax, narrow
from lpt.calibration.placement import place
from lpt.errors import QuantizationError
from lpt.graph.fake_quantize_op import read_fake_quantize
from lpt.kernels.int8_gemm import exact_routes

MODEL, DATA, TEST = "models/digits_cnn.onnx", "models/digits_cnn.npz", "models/digits_cnn.test.npz"
WEIGHTS = ("conv1.weight", "conv2.weight", "fc1.weight", "fc2.weight")


@pytest.fixture(scope="module")
def fixed():
    return {mode: calibrate(MODEL, DATA, quiet=True, overflow_fix=mode) for mode in ("none", "first", "all", "auto")}


def weight_integers(model) -> dict[str, tuple[int, np.ndarray]]:
    """Weight name → (levels, the integers of its FQ) in a calibrated model."""
    found = {}
    for node in model.graph:
        fq = read_fake_quantize(node)
        if fq is not None and node.inputs[0].const_value is not None:
            found[node.inputs[0].name] = (fq.levels, fq.quantize(node.inputs[0].const_value.numpy()))
    return found


def per_channel_max(q: np.ndarray, axis: int = 0) -> np.ndarray:
    return np.abs(np.moveaxis(q.astype(np.int64), axis, 0).reshape(q.shape[axis], -1)).max(axis=1)


def test_none_keeps_every_weight_on_8_bits(fixed):
    result = fixed["none"]
    assert result.report.overflow_fix == "none" and result.report.narrowed == ()
    for name, (levels, q) in weight_integers(result.model).items():
        assert levels == 255 and (per_channel_max(q) == 127).all(), name


@pytest.mark.parametrize("mode, narrowed", [("first", WEIGHTS[:1]), ("all", WEIGHTS)])
def test_first_and_all_put_whole_weights_on_7_bits(fixed, mode, narrowed):
    result = fixed[mode]
    integers = weight_integers(result.model)
    for name, (levels, q) in integers.items():
        if name in narrowed:
            assert levels == 127 and (per_channel_max(q) == NARROW_QMAX).all(), name
        else:
            assert levels == 255 and (per_channel_max(q) == 127).all(), name
    report = {n.weight: n for n in result.report.narrowed}
    assert tuple(report) == narrowed
    assert all(n.narrowed == n.channels and n.smallest_qmax == NARROW_QMAX for n in report.values())
    assert all(n.narrowed_sqnr_db < n.weight_sqnr_db - 4 for n in report.values())  # 7 bits: about 6 dB less


def test_auto_narrows_the_channels_that_saturate_and_fewer_than_all(fixed):
    auto, every = fixed["auto"].report, fixed["all"].report
    assert auto.overflow_fix == "auto"
    assert 0 < sum(n.narrowed for n in auto.narrowed) < sum(n.narrowed for n in every.narrowed)
    conv1 = next(n for n in auto.narrowed if n.weight == "conv1.weight")
    assert conv1.narrowed >= 6 and NARROW_QMAX <= conv1.smallest_qmax < 127  # the layer that saturates
    integers = weight_integers(fixed["auto"].model)
    assert all(levels == 255 for levels, _ in integers.values())  # channels narrowed inside the 8-bit FQ
    assert (per_channel_max(integers["conv1.weight"][1]) < 127).sum() == conv1.narrowed


def test_auto_leaves_no_saturation_that_moves_an_output_on_the_data(fixed):
    """The emulated AVX2 run of each model on the calibration data: none moves conv1's outputs, auto nothing."""
    moved = {}
    for mode in ("none", "auto"):
        comparison = lpt.compare(MODEL, fixed[mode].model, DATA, emulate="avx2")
        moved[mode] = {s.name: s.changed_channels for s in comparison.saturation}
    assert moved["none"]["/conv1/Conv"] >= 6
    assert set(moved["auto"].values()) == {0}


def test_auto_keeps_the_accuracy_on_an_avx2_cpu_for_half_a_db_at_most(fixed):
    """Emulated on any CPU: none loses top-1 on AVX2, auto keeps fp32's; on lpt's exact backend auto costs < 0.5 dB."""
    scores = {}
    for mode in ("none", "auto"):
        for emulate in (None, "avx2"):
            c = lpt.compare(MODEL, fixed[mode].model, TEST, labels="labels", emulate=emulate).to_dict()
            scores[mode, emulate] = (c["accuracy"]["drop"], c["outputs"]["logits"]["sqnr_db"])
    assert scores["none", "avx2"][0] > 0.003 and scores["none", None][0] <= 0.003
    assert scores["auto", "avx2"][0] <= 0.003 and scores["auto", None][0] <= 0.003
    assert scores["auto", None][1] > scores["none", None][1] - 0.5
    assert scores["auto", "avx2"][1] > scores["none", "avx2"][1] + 20  # 18.7 dB → 44.8 dB


@pytest.mark.skipif("u8s8" in exact_routes(), reason="onnxruntime's u8×s8 kernels are exact on this CPU (VNNI)")
def test_onnxruntime_on_this_cpu_agrees_with_lpt_within_one_lsb_after_auto(fixed, tmp_path):
    """onnxruntime (its QDQ fusions: QLinearConv u8×s8) against lpt's exact backend, every quantized tensor."""
    x = {"input": np.load(TEST)["input"]}
    distance = {}
    for mode in ("none", "auto"):
        path = tmp_path / f"{mode}.onnx"
        lpt.save(fixed[mode].model, path)
        proto = onnx.load(path)
        quantized = {n.input[0]: n.output[0] for n in proto.graph.node if n.op_type == "QuantizeLinear"}
        proto.graph.output.extend(onnx.ValueInfoProto(name=name) for name in quantized.values())
        theirs = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            list(quantized.values()), x)
        theirs = dict(zip(quantized.values(), theirs))
        int8 = lpt.clone(fixed[mode].model)
        lpt.transform(int8)
        ours = lpt.compile_model(int8).run(x, keep=True)
        distance[mode] = max(int(np.abs(ours[n.outputs[0].name].astype(int) - theirs[quantized[n.inputs[0].name]]).max())
                             for n in int8.graph if n.op_type == "QuantizeLinear" and n.inputs[0].name in quantized
                             and n.outputs[0].name in ours)
    assert distance["none"] > 20 and distance["auto"] <= 1


def test_default_is_auto_and_a_bad_value_is_refused():
    assert CalibrationConfig().overflow_fix == OverflowFix.AUTO
    with pytest.raises(QuantizationError, match="unknown overflow fix 'some'"):
        CalibrationConfig(overflow_fix="some")


def test_narrow_gives_each_channel_the_least_error_grid_under_its_cap():
    working = lpt.read_model(MODEL)
    placement = place(working)
    from lpt.calibration.config import PRESETS, Preset

    ranges = {p.name: (0.0, 1.0) for p in placement.activations}
    fqs = fake_quantizes(placement, ranges, PRESETS[Preset.MIXED])
    point = next(p for p in fqs if p.name == "conv1.weight")
    w = point.value.const_value.numpy()
    caps = np.array([127, 63, 100, 127, 90, 127, 127, 70])
    narrowed = narrow(fqs, {"conv1.weight": caps})[point]
    qmax = per_channel_max(narrowed.quantize(w))
    chosen = _best_qmax(w, 0, caps)
    np.testing.assert_array_equal(qmax, chosen)
    assert (chosen == 127).sum() == 4 and ((chosen >= NARROW_QMAX) & (chosen <= caps)).all()
    for c in np.flatnonzero(caps < 127):  # no grid under the cap rounds that channel with less error
        row = w[c].ravel().astype(np.float64)
        errors = [((np.round(row / (np.abs(row).max() / q)) * np.abs(row).max() / q - row) ** 2).sum()
                  for q in range(NARROW_QMAX, caps[c] + 1)]
        assert np.isclose(min(errors), errors[chosen[c] - NARROW_QMAX])
    others = narrow(fqs, {"conv1.weight": caps})
    assert all(others[p] is fq for p, fq in fqs.items() if p is not point)  # nothing else changes


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_cli_calibrate_and_quantize_report_what_was_narrowed(tmp_path):
    result = invoke("calibrate", MODEL, "-o", tmp_path / "first.fq.onnx", "--overflow-fix", "first")
    assert result.exit_code == 0, result.output
    assert "overflow fix (first): 8 weight channels narrowed in 1 layers" in " ".join(result.output.split())
    result = invoke("quantize", MODEL, "-o", tmp_path / "q", "--overflow-fix", "all", "--json", tmp_path / "q.json",
                    "--quiet")
    assert result.exit_code == 0, result.output
    calibration = json.loads((tmp_path / "q.json").read_text())["calibration"]
    assert calibration["overflow_fix"] == "all"
    assert [n["weight"] for n in calibration["narrowed"]] == list(WEIGHTS)


def test_cli_compare_emulate(tmp_path):
    fq = tmp_path / "none.fq.onnx"
    assert invoke("calibrate", MODEL, "-o", fq, "--overflow-fix", "none", "--quiet").exit_code == 0
    result = invoke("compare", MODEL, fq, "--data", TEST, "--labels", "labels", "--emulate", "avx2",
                    "--json", tmp_path / "c.json")
    assert result.exit_code == 0, result.output
    assert "int16 pair saturation (avx2)" in result.output
    report = json.loads((tmp_path / "c.json").read_text().replace("Infinity", "1e999"))
    assert report["emulate"] == "avx2" and report["saturation"][0]["saturated_channels"] == 8
    refused = invoke("compare", MODEL, fq, "--data", TEST, "--emulate", "avx2", "--backend", "onnxruntime")
    assert refused.exit_code == 1 and refused.output.startswith("error: ") and "emulate" in refused.output


def test_auto_warns_and_keeps_8_bits_where_the_int8_graph_cannot_run(monkeypatch, caplog):
    import lpt.backend

    def refuse(*args, **kwargs):
        raise lpt.ModelError("no kernel for this")

    monkeypatch.setattr(lpt.backend, "compile_model", refuse)
    result = calibrate(MODEL, DATA, quiet=True, subset_size=20, overflow_fix="auto")
    assert result.report.narrowed == ()
    assert "overflow fix skipped: the int8 graph did not run on the data (no kernel for this)" in caplog.text
