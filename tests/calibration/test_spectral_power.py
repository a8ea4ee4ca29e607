"""Placement: the layers around a power spectrum stay f32 (placement.spectral_power), and why it matters.

An STFT written as Conv layers, squared and summed into a power spectrum, then a log (a mel front end,
oww_melspectrogram) or a layer reading its magnitude (silero_vad): on an 8-bit grid sized by the loudest
bin the quiet bins round to 0. The end-to-end tests run lpt's backend with the rule and without it
(spectral_power patched out) on tones of different loudness over a faint noise floor.
"""

from contextlib import nullcontext
from unittest import mock

import numpy as np
import pytest

import lpt
from lpt.calibration.placement import place
from tests.calibration.nets import Net, as_ir
from tests.graphs import run_ort

N_FFT, HOP, SAMPLES = 64, 16, 512
BINS = N_FFT // 2 + 1


def int_const(n, name, values):
    n.inits[name] = np.array(values, np.int64)
    return name


def stft(n, x, together=False):
    """Windowed DFT as strided Conv1d: (real, imaginary), each [N, BINS, frames]; one Conv sliced in two
    when `together` (silero's forward_basis)."""
    k, t = np.arange(BINS)[:, None], np.arange(N_FFT)[None, :]
    window = np.hanning(N_FFT)
    re, im = np.cos(2 * np.pi * k * t / N_FFT) * window, -np.sin(2 * np.pi * k * t / N_FFT) * window
    if not together:
        return (n.op("Conv", [x, n.const("re.w", re[:, None])], "re", strides=[HOP]),
                n.op("Conv", [x, n.const("im.w", im[:, None])], "im", strides=[HOP]))
    both = n.op("Conv", [x, n.const("stft.w", np.concatenate([re, im])[:, None])], "stft", strides=[HOP])
    axis = int_const(n, "axis", [1])
    return (n.op("Slice", [both, int_const(n, "s0", [0]), int_const(n, "e0", [BINS]), axis], "re"),
            n.op("Slice", [both, int_const(n, "s1", [BINS]), int_const(n, "e1", [2 * BINS]), axis], "im"))


def power(n, re, im, square="Pow"):
    if square == "Pow":
        two = n.const("two", np.float32(2))
        return n.op("Add", [n.op("Pow", [re, two], "re2"), n.op("Pow", [im, two], "im2")], "power")
    return n.op("Add", [n.op("Mul", [re, re], "re2"), n.op("Mul", [im, im], "im2")], "power")


def mel_net(square="Pow"):
    """audio → STFT → re² + im² → mel MatMul (triangles of 5 bins) → Clip(1e-10) → Log (oww_melspectrogram)."""
    n = Net()
    p = power(n, *stft(n, "audio"), square)
    mel = np.zeros((BINS, 8), np.float32)
    for j in range(8):
        mel[4 * j: 4 * j + 5, j] = np.hanning(7)[1:-1]
    m = n.op("MatMul", [n.op("Transpose", [p], "power_t", perm=[0, 2, 1]), n.const("mel.w", mel)], "mel")
    n.op("Log", [n.op("Clip", [m, n.const("floor", np.float32(1e-10))], "clip")], "y")
    return n.build({"audio": ["N", 1, SAMPLES]}, ["y"])


def magnitude_net():
    """audio → one STFT Conv, sliced → √(re² + im²) → Conv → Relu → Conv (silero_vad's encoder)."""
    n = Net()
    m = n.op("Sqrt", [power(n, *stft(n, "audio", together=True))], "magnitude")
    e = n.op("Conv", [m, n.weight("enc0.w", (16, BINS, 3)), n.const("enc0.b", np.zeros(16))], "enc0", pads=[1, 1])
    r = n.op("Relu", [e], "relu")
    n.op("Conv", [r, n.weight("enc1.w", (4, 16, 3)), n.const("enc1.b", np.zeros(4))], "y", pads=[1, 1])
    return n.build({"audio": ["N", 1, SAMPLES]}, ["y"])


def tones(n, seed):
    """One tone per sample, 0.05 to 1 in amplitude, over a noise floor 60 dB or more below it."""
    rng = np.random.default_rng(seed)
    t = np.arange(SAMPLES) / 16000
    frequency, amplitude = rng.uniform(200, 3000, (n, 1)), rng.uniform(0.05, 1, (n, 1))
    x = amplitude * np.sin(2 * np.pi * frequency * t) + rng.normal(0, 1e-3, (n, SAMPLES))
    return {"audio": x[:, None, :].astype(np.float32)}


def skipped(proto):
    """{node: reason} of the nodes left f32 as part of a power spectrum."""
    return {s.node: s.reason for s in place(as_ir(proto)).skipped if s.reason.startswith("spectral power")}


def sqnr(reference, approx):
    noise = np.sum((reference - approx) ** 2)
    return np.inf if noise == 0 else 10 * np.log10(np.sum(reference ** 2) / noise)


def sqnr_on_lpt(proto, tmp_path, rule=True):
    path = tmp_path / "model.onnx"
    path.write_bytes(proto.SerializeToString())
    evaluation = tones(16, seed=2)
    with mock.patch("lpt.calibration.placement.spectral_power", lambda graph: {}) if not rule else nullcontext():
        quantized = lpt.quantize(path, tones(32, seed=1), quiet=True)
    return sqnr(run_ort(proto, evaluation)[0], quantized.run(evaluation)["y"]), quantized.report.int8_ops


@pytest.mark.parametrize("square", ["Pow", "Mul"])
def test_the_stft_and_the_mel_matmul_before_a_log_stay_f32_with_a_reason(square):
    reasons = skipped(mel_net(square))
    assert set(reasons) == {"re", "im", "mel"}
    assert reasons["re"].startswith("spectral power: the transform whose output is squared stays f32")
    assert reasons["mel"].startswith("spectral power: a layer reading a power or magnitude spectrum stays f32")
    assert place(as_ir(mel_net(square))).points == ()


def test_the_stft_and_the_first_layer_reading_the_magnitude_stay_f32_the_next_is_quantized():
    placement = place(as_ir(magnitude_net()))
    assert set(skipped(magnitude_net())) == {"stft", "enc0"}
    assert [n.name for n in placement.layers] == ["y"]
    assert {p.name for p in placement.activations} == {"relu"}


def test_an_l2_norm_squares_a_layer_output_but_is_left_alone():
    n = Net()
    g = n.gemm("x", "embedding", 6, 4)
    total = n.op("ReduceSum", [n.op("Pow", [g, n.const("two", np.float32(2))], "g2"), int_const(n, "axes", [1])],
                 "sum", keepdims=1)
    normed = n.op("Div", [g, n.op("Sqrt", [total], "norm")], "normed")
    n.gemm(normed, "y", 4, 3)
    proto = n.build({"x": ["N", 6]}, ["y"])
    placement = place(as_ir(proto))
    assert skipped(proto) == {} and [n.name for n in placement.layers] == ["embedding", "y"]


def test_a_squared_activation_without_a_sum_is_not_a_spectrum():
    n = Net()
    c = n.conv("x", "c1", 3, 4)
    sq = n.op("Mul", [n.op("Relu", [c], "relu"), "relu"], "squared")  # squared ReLU
    n.conv(sq, "y", 4, 4)
    assert skipped(n.build({"x": ["N", 3, 8, 8]}, ["y"])) == {}


def test_a_mel_front_end_keeps_its_log_spectrum_on_lpt_only_in_f32(tmp_path):
    with_rule, int8_ops = sqnr_on_lpt(mel_net(), tmp_path)
    without, int8_ops_without = sqnr_on_lpt(mel_net(), tmp_path, rule=False)
    # nothing left to quantize: float32 throughout (lpt's STFT adds its products in its own order: 118.6 dB)
    assert with_rule > 100 and int8_ops == 0
    assert without < 0 and int8_ops_without > 0  # the quiet mel bins' log is lost: worse than no signal


def test_a_magnitude_read_by_a_conv_gains_over_10_db_in_f32(tmp_path):
    with_rule, int8_ops = sqnr_on_lpt(magnitude_net(), tmp_path)
    without, _ = sqnr_on_lpt(magnitude_net(), tmp_path, rule=False)
    assert int8_ops >= 1  # the second encoder Conv still runs int8
    assert with_rule > 35 and without < 30, (with_rule, without)
