"""The command line: help that teaches, version, inspect and transform on a real file."""

import json
import sys

import onnx
import pytest
from click.testing import CliRunner

import lpt
from cli.main import main
from tests.transformations.test_pipeline import conv_net

COMMANDS = ["inspect", "normalize", "transform", "run", "export", "quantize", "compare", "bench"]


@pytest.fixture
def fq_model(tmp_path):
    proto, _ = conv_net()
    path = tmp_path / "net.qdq.onnx"
    path.write_bytes(proto.SerializeToString())
    return path


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and lpt.__version__ in result.output


@pytest.mark.parametrize("command", [None] + COMMANDS)
def test_every_help_has_an_example(command):
    result = invoke(*([command] if command else []), "--help")
    assert result.exit_code == 0
    assert "Example" in result.output and "lpt " in result.output.split("Example")[1]


def test_inspect_lists_fake_quantized_tensors_as_json(fq_model):
    result = invoke("inspect", fq_model, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    kinds = sorted(t["kind"] for t in summary["fake_quantized"])
    assert kinds == ["activation", "activation", "weight", "weight"]
    assert summary["op_counts"]["lpt::FakeQuantize"] == 4
    assert summary["unquantized"] == []


def test_inspect_names_the_heavy_op_left_unquantized(tmp_path):
    proto, _ = conv_net()
    gemm = next(n for n in proto.graph.node if n.op_type == "Gemm")
    gemm.input[1] = next(i.name for i in proto.graph.initializer if i.name.startswith("w"))  # bypass weight DQ
    path = tmp_path / "m.onnx"
    proto.graph.ClearField("value_info")
    onnx.save(proto, path)
    summary = json.loads(invoke("inspect", path, "--json").output)
    assert [(u["node"], u["reason"]) for u in summary["unquantized"]] == [("y", "weight is not fake-quantized")]


def test_transform_writes_an_int8_graph_and_reports_precisions(fq_model, tmp_path):
    out = tmp_path / "net.int8.onnx"
    result = invoke("transform", fq_model, "-o", out)
    assert result.exit_code == 0, result.output
    assert "ConvInteger" in result.output and "int8" in result.output
    ops = [n.op_type for n in onnx.load(out).graph.node]
    assert "ConvInteger" in ops and "MatMulInteger" in ops and "DequantizeLinear" not in ops
    again = invoke("transform", fq_model, "-o", out)
    assert again.exit_code == 1 and "already exists" in again.output
    assert invoke("transform", fq_model, "-o", fq_model).exit_code == 1
    assert onnx.load(fq_model).graph.node[0].op_type == "QuantizeLinear"  # the input is untouched


def test_run_writes_outputs_and_cross_checks(fq_model, tmp_path):
    import numpy as np

    data = tmp_path / "data.npz"
    np.savez(data, x=np.random.default_rng(0).uniform(-2, 2, (6, 3, 8, 8)).astype(np.float32))
    out = tmp_path / "out.npz"
    result = invoke("run", fq_model, "--data", data, "-o", out, "--check")
    assert result.exit_code == 0, result.output
    assert "6 samples" in result.output and "on int8 kernel" in result.output
    assert "max 0 LSB" in result.output or "max 1 LSB" in result.output
    assert np.load(out)["y"].shape == (6, 5)


def test_run_checks_a_dynamically_quantized_model_by_its_outputs(tmp_path):
    """quantize_dynamic's model has no fixed levels: no empty per-tensor table, the outputs equal onnxruntime's."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import quantize_dynamic

    rng = np.random.default_rng(1)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "f32",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6, 8, 8])],
                              [numpy_helper.from_array(rng.normal(0, 0.3, (6, 3, 3, 3)).astype(np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "f32.onnx")
    quantize_dynamic(tmp_path / "f32.onnx", tmp_path / "dynamic.onnx", op_types_to_quantize=["Conv"])
    np.savez(tmp_path / "data.npz", x=rng.normal(0, 1, (4, 3, 8, 8)).astype(np.float32))
    result = invoke("run", tmp_path / "dynamic.onnx", "--data", tmp_path / "data.npz", "--check")
    assert result.exit_code == 0, result.output
    assert "no fake-quantized tensor to compare" in result.output
    assert "100%" in result.output.split("outputs (f32)")[1]


def test_run_without_data_says_what_to_pass(fq_model):
    result = invoke("run", fq_model)
    assert result.exit_code == 1 and "pass --data" in result.output


def test_export_writes_a_model_onnxruntime_runs(fq_model, tmp_path):
    out = tmp_path / "exported.onnx"
    result = invoke("export", fq_model, "-o", out)
    assert result.exit_code == 0, result.output
    ops = [n.op_type for n in onnx.load(out).graph.node]
    assert "QLinearConv" in ops


def test_compare_plots_per_layer_sqnr_or_says_what_is_missing(fq_model, tmp_path, monkeypatch):
    from pathlib import Path

    models = Path(__file__).parent.parent / "models"
    args = ["compare", models / "digits_cnn.onnx", models / "digits_cnn.ort_qdq.onnx", "--data",
            models / "digits_cnn.test.npz", "--labels", "labels"]
    plot = tmp_path / "layers.png"
    result = invoke(*args, "--plot", plot)
    assert result.exit_code == 0, result.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    missing = invoke(*args, "--plot", tmp_path / "again.png")
    assert missing.exit_code == 1 and "needs matplotlib" in missing.output


def test_run_reads_a_test_file_whose_labels_are_not_inputs(tmp_path):
    from pathlib import Path

    models = Path(__file__).parent.parent / "models"
    result = invoke("run", models / "digits_cnn.ort_qdq.onnx", "--data", models / "digits_cnn.test.npz")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("540 samples")


def test_bench_of_a_model_that_is_not_quantized_says_so():
    """An fp32 model has no int8 plan to time: one line, exit 1 (it ran in float32 under "lpt int8" before)."""
    from pathlib import Path

    models = Path(__file__).parent.parent / "models"
    result = invoke("bench", models / "digits_cnn.onnx", "--data", models / "digits_cnn.npz", "--repeats", 1)
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "error: the model is not quantized (no fake-quantization, no int8 layers): lpt's plan would run it in "
        "float32; quantize it first (lpt quantize writes NAME.fq.onnx)"]


def test_bench_reports_medians_and_ratios_as_json():
    from pathlib import Path

    models = Path(__file__).parent.parent / "models"
    result = invoke("bench", models / "digits_cnn.ort_qdq.onnx", "--data", models / "digits_cnn.npz",
                    "--fp32", models / "digits_cnn.onnx", "--repeats", 3, "--threads", 1, "--json")
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    # OpenVINO joins where it is installed (the bench extra); otherwise the report says why not
    peers = {"lpt int8", "onnxruntime QDQ", "onnxruntime fp32"}
    assert set(figures["median_ms"]) - {"openvino int8"} == peers
    assert ("openvino int8" in figures["median_ms"]) != ("openvino int8" in figures.get("unavailable", {}))
    assert figures["ratio_to_onnxruntime_fp32"]["onnxruntime fp32"] == 1.0
    assert figures["profile_ms"]  # where lpt's time goes, step by step


def test_quantize_refuses_non_finite_samples_unless_told_to_skip_them(tmp_path):
    import numpy as np
    from pathlib import Path

    model = Path(__file__).parent.parent / "models" / "digits_cnn.onnx"
    samples = np.load(model.with_suffix(".npz"))["input"][:16].copy()
    samples[3, 0, 0, 0] = np.nan
    data = tmp_path / "nan.npz"
    np.savez(data, input=samples)
    refused = invoke("quantize", model, "--data", data, "-o", tmp_path / "q", "--quiet")
    assert refused.exit_code == 1 and "sample 3 holds NaN" in refused.output
    assert not (tmp_path / "q.fq.onnx").exists()
    skipped = invoke("quantize", model, "--data", data, "-o", tmp_path / "q", "--quiet", "--skip-nonfinite")
    assert skipped.exit_code == 0, skipped.output
    assert "calibrated on 15 samples" in skipped.output
    assert (tmp_path / "q.fq.onnx").exists() and (tmp_path / "q.int8.onnx").exists()


def test_quantize_takes_an_openvino_form_model_straight_to_int8(tmp_path):
    import shutil
    from pathlib import Path

    models = Path(__file__).parent.parent / "models"
    shutil.copy(models / "digits_cnn.ov_fq.onnx", tmp_path / "ov.onnx")
    shutil.copy(models / "digits_cnn.npz", tmp_path / "ov.npz")
    result = invoke("quantize", tmp_path / "ov.onnx")
    assert result.exit_code == 0, result.output
    assert "calibration skipped" in result.output and "the FQ model vs int8" in result.output
    assert "onnx reference evaluator" in result.output  # onnxruntime cannot run OpenVINO's op
    assert (tmp_path / "ov.int8.onnx").exists()
