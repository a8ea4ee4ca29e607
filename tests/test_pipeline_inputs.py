"""lpt.quantize on a model with the inputs of a streaming audio model (silero VAD's): a batch
x [B, 8], a state [2, B, 4] holding its samples on axis 1, and a scalar int64 sample rate `sr`."""

import numpy as np
import onnx
from click.testing import CliRunner
from onnx import helper

import lpt
from cli.main import main
from tests.graphs import model

SR = 16000


def vad_like(batch="batch", state=(2, "batch", 4)) -> onnx.ModelProto:
    """out = (x @ W + mean(state, axis 0)) * float(sr) / 16000."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("ReduceMean", ["state"], ["m"], axes=[0], keepdims=0),
        helper.make_node("Add", ["y", "m"], ["z"]),
        helper.make_node("Cast", ["sr"], ["rate"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Div", ["rate", "base"], ["gain"]),
        helper.make_node("Mul", ["z", "gain"], ["out"]),
    ]
    weights = {"w": np.random.default_rng(1).normal(0, 0.5, (8, 4)).astype(np.float32),
               "base": np.array(SR, np.float32)}
    return model(nodes, {"x": [batch, 8], "state": list(state)}, {"out": [batch, 4]}, weights, opset=17,
                 extra_inputs={"sr": onnx.TensorProto.INT64})


def samples(n=64):
    rng = np.random.default_rng(0)
    return {"x": rng.normal(0, 1, (n, 8)).astype(np.float32),
            "state": rng.normal(0, 1, (2, n, 4)).astype(np.float32),
            "sr": np.array(SR, np.int64)}


def expected(data):
    w = np.random.default_rng(1).normal(0, 0.5, (8, 4)).astype(np.float32)
    return (data["x"] @ w + data["state"].mean(axis=0)) * np.float32(data["sr"] / SR)


def test_quantize_feeds_a_state_on_axis_1_and_a_scalar_sample_rate(tmp_path):
    data = samples()
    np.savez(tmp_path / "vad.npz", **data)  # sr as a 0-d member, state streamed whole
    onnx.save(vad_like(), tmp_path / "vad.onnx")
    result = lpt.quantize(tmp_path / "vad.onnx", tmp_path / "vad.npz")
    report = result.report
    assert report.calibration.samples == 64 and report.int8_ops == 1  # the MatMul
    assert report.agreement.outputs["out"].sqnr_db > 25
    outputs = result.run(data, batch_size=16)["out"]
    assert outputs.shape == (64, 4)
    np.testing.assert_allclose(outputs, expected(data), atol=0.1)


def test_the_cli_takes_the_batch_axis_the_shapes_do_not_tell(tmp_path):
    onnx.save(vad_like(batch=None, state=(None, None, 4)), tmp_path / "vad.onnx")  # unknown dims: axis 0 guessed
    np.savez(tmp_path / "vad.npz", **samples())
    args = ["quantize", str(tmp_path / "vad.onnx"), "--quiet"]

    def error(*more):
        result = CliRunner().invoke(main, args + list(more))
        assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
        return result.output.strip()

    assert error() == (f"error: {tmp_path / 'vad.npz'}: input 'state' holds 2 samples (on its batch axis 0) but "
                       "input 'x' holds 64 (on axis 0); check the batch axes (--batch-axis NAME=AXIS, "
                       "batch_axes={NAME: AXIS})")
    assert error("--batch-axis", "state=x") == (
        "error: --batch-axis 'state=x': AXIS must be an integer, or none for a fixed input")
    result = CliRunner().invoke(main, args + ["--batch-axis", "state=1", "--batch-axis", "sr=none"])
    assert result.exit_code == 0, result.output
    assert "calibrated on 64 samples" in result.output
