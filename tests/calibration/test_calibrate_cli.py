"""`lpt calibrate`: default data and output beside the model, refusals, the summary, --help."""

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from cli.main import main
from tests.calibration.nets import conv_inputs, conv_net


@pytest.fixture
def model_dir(tmp_path):
    onnx.save(conv_net(), tmp_path / "net.onnx")
    np.savez(tmp_path / "net.npz", **conv_inputs())
    return tmp_path


def invoke(*args):
    return CliRunner().invoke(main, ["calibrate"] + [str(a) for a in args])


def error_of(result) -> str:
    """The CLI's one-line error: exit code 1, no traceback."""
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    return lines[0][len("error: "):]


def test_help_has_an_example():
    result = invoke("--help")
    assert result.exit_code == 0 and "lpt calibrate models/digits_cnn.onnx" in result.output


def test_data_and_output_default_to_files_beside_the_model(model_dir):
    result = invoke(model_dir / "net.onnx")
    assert result.exit_code == 0, result.output
    out = model_dir / "net.fq.onnx"
    assert f"wrote {out}" in result.output
    assert "activation u8" in result.output and "weight i8 per-channel" in result.output
    assert "QuantizeLinear" in {n.op_type for n in onnx.load(out).graph.node}


def test_options_reach_the_library(model_dir):
    out = model_dir / "custom.onnx"
    result = invoke(model_dir / "net.onnx", "--data", model_dir / "net.npz", "--preset", "mixed",
                    "--estimator", "minmax", "--subset-size", 10, "--ignore", "Gemm", "--no-bias-correction",
                    "-o", out)
    assert result.exit_code == 0, result.output
    assert "ignored (Gemm)" in result.output and "10 samples" in result.output and "biases" not in result.output
    assert out.is_file()


def test_quiet_prints_only_where_it_wrote(model_dir):
    result = invoke(model_dir / "net.onnx", "--quiet")
    assert result.exit_code == 0 and result.output.strip() == f"wrote {model_dir / 'net.fq.onnx'}"


def test_missing_data_says_what_to_pass(model_dir):
    (model_dir / "net.npz").unlink()
    result = invoke(model_dir / "net.onnx")
    assert error_of(result) == (
        f"no --data given and no net.npz beside {model_dir / 'net.onnx'}: pass --data DATA "
        "(a .npz keyed by input name, a .npy for a single-input model, or a folder of them)")


def test_an_existing_output_needs_force_and_the_input_is_never_overwritten(model_dir):
    out = model_dir / "net.fq.onnx"
    out.write_bytes(b"old")
    result = invoke(model_dir / "net.onnx")
    assert "already exists" in error_of(result)
    assert out.read_bytes() == b"old"
    assert invoke(model_dir / "net.onnx", "--force", "--quiet").exit_code == 0
    assert out.read_bytes() != b"old"
    before = (model_dir / "net.onnx").read_bytes()
    result = invoke(model_dir / "net.onnx", "-o", model_dir / "net.onnx", "--force")
    assert "refusing to overwrite the input" in error_of(result)
    assert (model_dir / "net.onnx").read_bytes() == before


def test_bad_data_is_a_data_error(model_dir):
    np.savez(model_dir / "bad.npz", image=conv_inputs()["x"])
    result = invoke(model_dir / "net.onnx", "--data", model_dir / "bad.npz")
    assert "the model expects inputs: x" in error_of(result)


def test_estimator_auto_is_a_choice_and_the_summary_names_it(model_dir):
    result = invoke(model_dir / "net.onnx", "--estimator", "auto")
    assert result.exit_code == 0, result.output
    assert "(mixed preset, auto)" in result.output
