"""Bad model files: a one-line ModelError (and, through the CLI, exit 1 without a traceback)."""

import os

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

import lpt
from cli.main import main
from tests.graphs import model


def relu_model():
    return model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": None})


def weight_model():
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    return model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [1, 4]}, {"y": None}, {"w": w})


def write_external(proto, folder, location):
    """Point the model's weight at `location` as external data."""
    tensor = proto.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    path = folder / "model.onnx"
    path.write_bytes(proto.SerializeToString())
    return path


@pytest.fixture
def bad_files(tmp_path):
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n" * 20)
    good = tmp_path / "good.onnx"
    good.write_bytes(relu_model().SerializeToString())
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(weight_model().SerializeToString()[:-37])
    invalid = relu_model()
    invalid.graph.node[0].op_type = "NoSuchOp"
    invalid_path = tmp_path / "invalid.onnx"
    invalid_path.write_bytes(invalid.SerializeToString())
    return {"missing": (tmp_path / "missing.onnx", "no such file"),
            "folder": (tmp_path, "not a file"),
            "text": (text, "not an ONNX model"),
            "truncated": (truncated, "ONNX model"),
            "checker": (invalid_path, "fails onnx.checker")}


@pytest.mark.parametrize("case", ["missing", "folder", "text", "truncated", "checker"])
def test_bad_model_file_is_a_one_line_error(bad_files, case):
    path, message = bad_files[case]
    with pytest.raises(lpt.ModelError, match=message) as err:
        lpt.load(path)
    assert "\n" not in str(err.value)
    result = CliRunner().invoke(main, ["inspect", str(path)])
    assert result.exit_code == 1
    assert result.output.startswith("error: ") and message in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin"])
def test_external_data_outside_the_model_folder_is_never_opened(tmp_path, location, monkeypatch):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(np.arange(16, dtype=np.float32).tobytes())
    path = write_external(weight_model(), folder, location)
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda f, *a, **k: opened.append(os.fspath(f)) or real_open(f, *a, **k))
    with pytest.raises(lpt.ModelError, match="outside the model's folder"):
        lpt.load(path)
    assert not any("secret" in f or "passwd" in f for f in opened)


def test_external_data_inside_the_folder_loads(tmp_path):
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    (tmp_path / "weights.bin").write_bytes(w.tobytes())
    path = write_external(weight_model(), tmp_path, "weights.bin")
    loaded = lpt.load(path)
    np.testing.assert_array_equal(loaded.graph.initializers["w"].const_value.numpy(), w)


def test_save_never_overwrites_without_asking_and_writes_atomically(tmp_path):
    target = tmp_path / "out.onnx"
    target.write_bytes(b"precious")
    m = lpt.load(_write(tmp_path / "in.onnx", relu_model()))
    with pytest.raises(lpt.ModelError, match="already exists"):
        lpt.save(m, target)
    assert target.read_bytes() == b"precious"
    lpt.save(m, target, overwrite=True)
    assert onnx.load(target).graph.node[0].op_type == "Relu"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.onnx", "out.onnx"]  # no temp file left


def test_saved_models_load_in_onnxruntime_despite_newer_onnx_defaults(tmp_path):
    proto = relu_model()
    proto.ir_version = onnx.IR_VERSION  # what a newer onnx writes; older onnxruntime refuses it
    m = lpt.load(_write(tmp_path / "in.onnx", proto))
    saved = onnx.load(lpt.save(m, tmp_path / "out.onnx"))
    assert saved.ir_version <= 8


def _write(path, proto):
    path.write_bytes(proto.SerializeToString())
    return path
