"""Folders of audio as data: 44.1 kHz WAVs feed a 16 kHz model through soxr, windows and hops, mono
mixing, int16 inputs, bad files, and the error naming the extra when the libraries are missing."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper, numpy_helper

import lpt
from cli.main import main
from lpt.calibration.data import CalibrationData, input_specs
from lpt.data import AudioOptions, open_data
from lpt.errors import DataError

soundfile = pytest.importorskip("soundfile")
soxr = pytest.importorskip("soxr")


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def audio_model(tmp_path: Path, shape=("N", 1, 16000), dtype=onnx.TensorProto.FLOAT) -> Path:
    """x [N, 1, T] → Conv1d(1→4, k 9, stride 4) → Relu → GlobalAveragePool → Flatten → Gemm → logits [N, 3]."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=onnx.TensorProto.FLOAT)]
    source = "xf"
    if len(shape) == 2:
        nodes.append(helper.make_node("Unsqueeze", ["xf", "one"], ["x3"]))
        source = "x3"
    nodes += [helper.make_node("Conv", [source, "w", "b"], ["c"], strides=[4]), helper.make_node("Relu", ["c"], ["r"]),
              helper.make_node("GlobalAveragePool", ["r"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
              helper.make_node("Gemm", ["f", "fc"], ["logits"], transB=1)]
    initializers = [numpy_helper.from_array(rng.normal(size=(4, 1, 9)).astype(np.float32), "w"),
                    numpy_helper.from_array(rng.normal(size=4).astype(np.float32) * 0.01, "b"),
                    numpy_helper.from_array(rng.normal(size=(3, 4)).astype(np.float32), "fc"),
                    numpy_helper.from_array(np.array([1], np.int64), "one")]
    graph = helper.make_graph(nodes, "audio", [helper.make_tensor_value_info("x", dtype, list(shape))],
                              [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["N", 3])],
                              initializers)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx.checker.check_model(proto, full_check=True)
    path = tmp_path / "audio.onnx"
    onnx.save(proto, path)
    return path


def tone(frequency: float, rate: int, seconds: float, channels: int = 1) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    wave = 0.5 * np.sin(2 * np.pi * frequency * t)
    return np.repeat(wave[:, None], channels, axis=1) if channels > 1 else wave


def clips(folder: Path, rate=44100, seconds=1.5, classes=("low", "high"), per_class=2) -> Path:
    """Int16 WAVs of tones (class low: 300-400 Hz, high: 2-3 kHz) in class subfolders."""
    for c, name in enumerate(classes):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            frequency = (300 + 100 * i) if c == 0 else (2000 + 1000 * i)
            soundfile.write(folder / name / f"{i}.wav", tone(frequency, rate, seconds), rate, subtype="PCM_16")
    return folder


def windows(source, model) -> np.ndarray:
    return CalibrationData(source, input_specs(lpt.read_model(model)), batch_size=4).collect()["x"]


def test_wavs_at_44k1_feed_a_16k_model_resampled_by_soxr(tmp_path):
    """The bar: `lpt quantize MODEL --data DIR --sample-rate 16000` on 44.1 kHz files."""
    model = audio_model(tmp_path)
    folder = clips(tmp_path / "clips")
    report = tmp_path / "report.json"
    result = invoke("quantize", model, "--data", folder, "--sample-rate", 16000, "-o", tmp_path / "q", "--quiet",
                    "--json", report)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "4 audio files, 2 classes from class subfolders" in text and "16000 Hz (soxr)" in text
    data = json.loads(report.read_text())
    assert data["data"]["preprocess"]["sample_rate"] == 16000 and data["data"]["preprocess"]["window"] == 16000
    assert data["calibration"]["samples"] == 4  # 1.5 s at 16 kHz: one whole window of 16000 per file
    assert "accuracy" in data["agreement"]  # labels from the class subfolders
    reused = invoke("run", tmp_path / "q.fq.onnx", "--data", folder)  # no options: the recorded 16 kHz
    assert reused.exit_code == 0, reused.output
    assert "as recorded in q.fq.onnx: 16000 Hz (soxr)" in " ".join(reused.output.split())
    assert "4 samples in" in reused.output  # at 44.1 kHz there would be 16 windows

    source = open_data(folder, model, audio=AudioOptions(sample_rate=16000))
    x = windows(source, model)
    assert x.shape == (4, 1, 16000) and source.labels == [0, 0, 1, 1]  # classes in sorted order: high, low
    low = [p.name for p in source.listing.files].index("0.wav", 2)  # low/0.wav: 300 Hz
    spectrum = np.abs(np.fft.rfft(x[low, 0]))  # one second: bin k is k Hz
    assert np.argmax(spectrum) == pytest.approx(300, abs=1)  # 300 Hz stays 300 Hz at 16 kHz
    wav, rate = soundfile.read(folder / "low" / "0.wav", dtype="float32")
    np.testing.assert_allclose(x[low, 0], soxr.resample(wav, rate, 16000)[:16000], atol=2e-3)
    # without --sample-rate, the first file's rate: 16000 samples of 44.1 kHz audio, a tone 2.76x lower
    native = open_data(folder, model)
    assert "sample rate 44100 Hz (the first file's" in native.describe()
    slow = windows(native, model)
    assert slow.shape == (16, 1, 16000)  # 66150 samples: 4 windows per file
    assert np.argmax(np.abs(np.fft.rfft(slow[8, 0]))) == pytest.approx(300 * 16000 / 44100, abs=1)  # low/0.wav


def test_windows_hops_padding_and_mono(tmp_path):
    model = audio_model(tmp_path, shape=("N", 4000))
    folder = tmp_path / "clips"
    folder.mkdir()
    ramp = (np.arange(10000) % 3000 - 1500) / 2048
    soundfile.write(folder / "a.wav", np.stack([ramp, -ramp], axis=1), 16000, subtype="FLOAT")  # stereo
    soundfile.write(folder / "b.flac", ramp[:1000], 16000, subtype="PCM_24")  # shorter than a window
    source = open_data(folder, model, audio=AudioOptions(hop=2000))
    assert source.preprocess.mono and source.preprocess.window == 4000
    x = windows(source, model)
    # a.wav: windows at 0, 2000, 4000, 6000 (6000 + 4000 = 10000); stereo (r, -r) averages to 0; b.flac padded
    assert x.shape == (5, 4000) and not x[:4].any()
    np.testing.assert_allclose(x[4, :1000], ramp[:1000], atol=2 ** -22)
    assert not x[4, 1000:].any()
    with pytest.raises(DataError, match=r"a\.wav: 2 channel\(s\), but the model takes 1"):
        windows(open_data(folder, model, audio=AudioOptions(mono=False)), model)


def test_int16_inputs_take_the_int16_range_exactly(tmp_path):
    model = audio_model(tmp_path, shape=("N", 1, 800), dtype=onnx.TensorProto.INT16)
    folder = tmp_path / "clips"
    folder.mkdir()
    pcm = np.random.default_rng(3).integers(-32768, 32768, 1600).astype(np.int16)
    soundfile.write(folder / "a.wav", pcm, 8000, subtype="PCM_16")
    x = windows(open_data(folder, model), model)
    assert x.dtype == np.int16 and np.array_equal(x[:, 0].reshape(-1), pcm)


def test_a_corrupt_file_is_named_or_skipped_and_missing_libraries_name_the_extra(tmp_path, monkeypatch):
    model = audio_model(tmp_path)
    folder = clips(tmp_path / "clips", rate=16000, seconds=1.0, per_class=1)
    (folder / "low" / "broken.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEfmt garbage")
    refused = invoke("calibrate", model, "--data", folder, "-o", tmp_path / "a.fq.onnx", "--quiet")
    assert refused.exit_code == 1
    line = refused.output.strip().splitlines()[-1]
    assert line.startswith("error: ") and "broken.wav: not readable audio" in line
    skipped = invoke("calibrate", model, "--data", folder, "-o", tmp_path / "a.fq.onnx", "--skip-bad")
    assert skipped.exit_code == 0, skipped.output
    assert "skipped 1 unreadable file" in " ".join(skipped.output.split())
    monkeypatch.setitem(__import__("sys").modules, "soxr", None)  # import soxr now fails
    with pytest.raises(DataError, match=r"needs soxr: pip install 'lpt\[audio\]'"):
        open_data(folder, model)
