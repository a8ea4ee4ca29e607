"""The dataset layer: every source form, streaming, and each bad input as a one-line DataError."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

import lpt
from lpt.calibration import calibrate
from lpt.calibration.data import CalibrationData, InputSpec, input_specs, parse_batch_axes
from tests.calibration.nets import as_ir, conv_inputs, conv_net

IMAGE = InputSpec("x", np.dtype(np.float32), (None, 1, 8, 8))
TOKENS = InputSpec("tokens", np.dtype(np.int64), (None, 64))


def rows(data: CalibrationData) -> np.ndarray:
    return np.concatenate([b["x"] for b in data.batches()])


def images(n, seed=0):
    return np.random.default_rng(seed).uniform(0, 1, (n, 1, 8, 8)).astype(np.float32)


def test_npz_npy_and_folder_give_the_same_samples_in_order(tmp_path):
    x = images(70)
    np.savez_compressed(tmp_path / "one.npz", x=x)
    np.save(tmp_path / "one.npy", x)
    folder = tmp_path / "parts"
    folder.mkdir()
    np.savez(folder / "b.npz", x=x[30:])  # sorted by name: a.npy first
    np.save(folder / "a.npy", x[:30])
    for source in (tmp_path / "one.npz", tmp_path / "one.npy", folder, str(folder)):
        data = CalibrationData(source, [IMAGE], batch_size=16)
        assert data.total == 70
        np.testing.assert_array_equal(rows(data), x)
        assert data.count == 70


def test_dicts_iterables_callables_and_single_samples():
    x = images(10)
    as_dicts = [{"x": x[:4]}, {"x": x[4:]}]
    sources = [{"x": x}, x, as_dicts, lambda: iter(as_dicts), [{"x": s} for s in x]]  # last: no batch axis
    for source in sources:
        np.testing.assert_array_equal(rows(CalibrationData(source, [IMAGE], batch_size=3)), x)


def test_subset_size_limits_the_samples_and_batches_stream():
    data = CalibrationData(images(100), [IMAGE], subset_size=25, batch_size=10)
    sizes = [len(b["x"]) for b in data.batches()]
    assert sizes == [10, 10, 5] and data.count == 25 and data.total == 25


def test_a_model_with_a_fixed_batch_size_gets_batches_of_that_size():
    fixed = InputSpec("x", np.dtype(np.float32), (4, 1, 8, 8))
    sizes = [len(b["x"]) for b in CalibrationData(images(10), [fixed]).batches()]
    assert sizes == [4, 4]


def test_int_tokens_stay_int_and_narrower_ints_are_widened():
    tokens = np.random.default_rng(0).integers(0, 17, (5, 64)).astype(np.int32)
    batch = next(CalibrationData({"tokens": tokens}, [TOKENS]).batches())
    assert batch["tokens"].dtype == np.int64 and (batch["tokens"] == tokens).all()


def test_float64_images_are_cast_to_float32():
    batch = next(CalibrationData({"x": images(3).astype(np.float64)}, [IMAGE]).batches())
    assert batch["x"].dtype == np.float32


def error(source, specs=(IMAGE,), **kwargs) -> str:
    with pytest.raises(lpt.DataError) as info:
        list(CalibrationData(source, list(specs), **kwargs).batches())
    message = str(info.value)
    assert "\n" not in message
    return message


def test_keys_that_do_not_match_name_the_expected_inputs():
    assert error({"image": images(2)}) == (
        "the data: key(s) image match no model input; the model expects inputs: x")
    assert error({"x": images(2)}, [IMAGE, TOKENS]) == (
        "the data: no data for input(s) tokens; the model expects inputs: x, tokens")


def test_a_npy_for_a_two_input_model_is_refused(tmp_path):
    np.save(tmp_path / "x.npy", images(2))
    assert "has one array but the model has inputs x, tokens" in error(tmp_path / "x.npy", [IMAGE, TOKENS])


@pytest.mark.parametrize("source, spec, message", [
    ({"x": np.zeros((2, 1, 4, 4), np.float32)}, IMAGE,
     "input 'x': data of shape [2, 1, 4, 4] does not fit the model's float32 [N,1,8,8] (batch dim first)"),
    ({"tokens": np.zeros((2, 64), np.float32)}, TOKENS,
     "input 'tokens': float32 data cannot be cast safely to the model's int64 (pass int64 values)"),
    ({"x": np.array([["a"]])}, IMAGE, "input 'x': data of dtype <U1 cannot feed a float32 input"),
])
def test_wrong_shapes_and_dtypes(source, spec, message):
    assert error(source, [spec]) == message


def test_an_empty_dataset_is_refused(tmp_path):
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 1, 8, 8), np.float32))
    assert error(tmp_path / "empty.npz") == f"empty dataset: {tmp_path / 'empty.npz'} holds no samples"
    (tmp_path / "nothing").mkdir()
    assert error(tmp_path / "nothing") == f"{tmp_path / 'nothing'}: no .npz or .npy files, images or audio files in this folder"
    assert error([]) == "empty dataset: the data holds no samples"


def test_missing_and_pickled_files_are_refused(tmp_path):
    assert error(tmp_path / "absent.npz") == f"{tmp_path / 'absent.npz'}: no such file or folder"
    np.savez(tmp_path / "objects.npz", x=np.array([{"a": 1}], dtype=object))
    assert "holds Python objects" in error(tmp_path / "objects.npz")


def test_nan_is_refused_naming_the_sample():
    x = images(20)
    x[13, 0, 2, 2] = np.nan
    assert error({"x": x}) == ("input 'x': sample 13 holds NaN or Inf; clean the data or skip such samples "
                               "(--skip-nonfinite, skip_nonfinite=True)")


def test_nan_and_inf_samples_are_skipped_with_a_warning_when_asked(caplog):
    x = images(20)
    x[3, 0, 0, 0], x[17, 0, 1, 1] = np.inf, np.nan
    data = CalibrationData({"x": x}, [IMAGE], skip_nonfinite=True, batch_size=8)
    np.testing.assert_array_equal(rows(data), np.delete(x, [3, 17], axis=0))
    assert (data.count, data.skipped) == (18, 2)
    assert "skipped 2 samples holding NaN or Inf" in caplog.text
    x[:] = np.nan
    assert error({"x": x}, skip_nonfinite=True) == (
        "empty dataset: the data holds no samples (20 samples skipped for NaN/Inf)")


def test_large_files_are_read_a_batch_at_a_time(tmp_path):
    """The .npz reader never materializes the whole array: peak traced memory stays near one batch."""
    import tracemalloc

    x = np.random.default_rng(0).uniform(0, 1, (4000, 1, 8, 8)).astype(np.float32)  # 1 MB
    np.savez_compressed(tmp_path / "big.npz", x=x)
    del x
    tracemalloc.start()
    total = sum(len(b["x"]) for b in CalibrationData(tmp_path / "big.npz", [IMAGE], batch_size=32).batches())
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert total == 4000
    assert peak < 200_000  # far below the 1 MB the array would take


def test_calibrate_raises_the_data_error_before_touching_anything():
    with pytest.raises(lpt.DataError, match="the model expects inputs: x"):
        calibrate(as_ir(conv_net()), {"y": conv_inputs()["x"]}, quiet=True)


# -- batch axes: each input's samples on its own axis, or a fixed input's one value

X8 = InputSpec("x", np.dtype(np.float32), (None, 8))
STATE = InputSpec("state", np.dtype(np.float32), (2, None, 128))  # batch axis guessed: 1
SR = InputSpec("sr", np.dtype(np.int64), ())  # rank 0: a fixed input


def specs_of(inputs: dict, types: dict | None = None) -> dict[str, InputSpec]:
    """input_specs of a real ONNX model whose inputs have these shapes (each through an Identity)."""
    types = {n: (types or {}).get(n, onnx.TensorProto.FLOAT) for n in inputs}
    graph = helper.make_graph(
        [helper.make_node("Identity", [n], [f"{n}_out"]) for n in inputs], "inputs",
        [helper.make_tensor_value_info(n, types[n], shape) for n, shape in inputs.items()],
        [helper.make_tensor_value_info(f"{n}_out", types[n], shape) for n, shape in inputs.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(proto)
    return {s.name: s for s in input_specs(ir.serde.deserialize_model(proto))}


def vad_samples(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(0, 1, (n, 8)).astype(np.float32), rng.normal(0, 1, (2, n, 128)).astype(np.float32)


@pytest.mark.parametrize("batch", [-1, 0, None, "N"], ids=["minus-one", "zero", "unknown", "symbolic"])
def test_a_batch_dim_declared_minus_one_zero_or_unknown_takes_any_count(tmp_path, batch):
    spec = specs_of({"x": [batch, 8]})["x"]
    assert (spec.shape, spec.batch_axis, spec.batch_size) == ((None, 8), 0, None)
    np.savez(tmp_path / "x.npz", x=np.ones((32, 8), np.float32))
    data = CalibrationData(tmp_path / "x.npz", [spec], batch_size=10)
    assert [len(b["x"]) for b in data.batches()] == [10, 10, 10, 2]
    assert data.count == data.total == 32


@pytest.mark.parametrize("inputs, axes", [
    pytest.param({"input": ["batch", "T"], "state": [2, "batch", 128], "sr": []},
                 {"input": 0, "state": 1, "sr": None}, id="silero-named"),
    pytest.param({"input": [None, None], "state": [2, None, 128], "sr": []},
                 {"input": 0, "state": 1, "sr": None}, id="silero-unnamed"),
    pytest.param({"image": [1, 1, 64, "image_width"]}, {"image": 0}, id="batch-of-one-not-the-width"),
    pytest.param({"x": [4, 1, 8, 8]}, {"x": 0}, id="fixed-batch"),
    pytest.param({"input": ["batch", 16], "state": ["layers", "batch", 4]}, {"input": 0, "state": 1},
                 id="shared-name-beats-symbolic-dim-0"),
    pytest.param({"input": ["batch", 16], "h": [1, "batch", 4]}, {"input": 0, "h": 1},
                 id="shared-name-beats-dim-0-of-1"),
    pytest.param({"input": ["n", 16], "state": ["layers", "batch", 4]}, {"input": 0, "state": 0},
                 id="no-shared-name"),
])
def test_default_batch_axes(inputs, axes):
    types = {"sr": onnx.TensorProto.INT64}
    assert {n: s.batch_axis for n, s in specs_of(inputs, types).items()} == axes


def test_a_batch_of_one_takes_samples_one_at_a_time():
    spec = specs_of({"image": [1, 1, 64, "image_width"]})["image"]
    assert spec.batch_size == 1
    images = np.random.default_rng(0).uniform(0, 1, (3, 1, 64, 20)).astype(np.float32)
    batches = list(CalibrationData({"image": images}, [spec]).batches())
    assert [b["image"].shape for b in batches] == [(1, 1, 64, 20)] * 3
    np.testing.assert_array_equal(batches[2]["image"], images[2:])


def test_a_scalar_input_is_fed_whole_with_every_batch(tmp_path):
    x, _ = vad_samples(70)
    np.savez(tmp_path / "d.npz", x=x, sr=np.int64(16000))
    halves = [{"x": x[:40], "sr": 16000}, {"x": x[40:], "sr": 16000}]
    for source in ({"x": x, "sr": np.int64(16000)}, tmp_path / "d.npz", halves):
        data = CalibrationData(source, [X8, SR], batch_size=32)
        batches = list(data.batches())
        assert [len(b["x"]) for b in batches] == [32, 32, 6] and data.count == 70
        assert [data.samples_in(b) for b in batches] == [32, 32, 6]
        assert all(b["sr"].shape == () and b["sr"].dtype == np.int64 and b["sr"] == 16000 for b in batches)
        np.testing.assert_array_equal(np.concatenate([b["x"] for b in batches]), x)


def test_a_state_holds_its_samples_on_axis_1(tmp_path):
    x, state = vad_samples(40)
    np.savez(tmp_path / "d.npz", x=x, state=state)
    per_sample = [{"x": x[i], "state": state[:, i]} for i in range(40)]  # no batch axis: [8] and [2, 128]
    for source in ({"x": x, "state": state}, tmp_path / "d.npz", per_sample):
        data = CalibrationData(source, [X8, STATE], batch_size=16)
        batches = list(data.batches())
        assert [b["state"].shape for b in batches] == [(2, 16, 128), (2, 16, 128), (2, 8, 128)]
        np.testing.assert_array_equal(batches[1]["state"], state[:, 16:32])
        np.testing.assert_array_equal(batches[1]["x"], x[16:32])
        assert batches[1]["state"].flags.c_contiguous and data.count == 40
    assert CalibrationData(state, [STATE], batch_size=16).samples_in(batches[2]) == 8
    assert CalibrationData(tmp_path / "d.npz", [X8, STATE]).total == 40
    np.save(tmp_path / "state.npy", state)  # one input: streamed along axis 1 from the memory map
    batches = list(CalibrationData(tmp_path / "state.npy", [STATE], batch_size=16).batches())
    np.testing.assert_array_equal(batches[2]["state"], state[:, 32:])


def test_subset_size_and_nan_skipping_work_along_the_state_axis():
    x, state = vad_samples(40)
    state[1, 3, 7] = np.nan
    data = CalibrationData({"x": x, "state": state}, [X8, STATE], batch_size=16, subset_size=20, skip_nonfinite=True)
    collected = data.collect()
    kept = np.delete(np.arange(40), 3)[:20]
    np.testing.assert_array_equal(collected["state"], state[:, kept])
    np.testing.assert_array_equal(collected["x"], x[kept])
    assert (data.count, data.skipped) == (20, 1)
    assert error({"x": x, "state": state}, [X8, STATE]).startswith("input 'state': sample 3 holds NaN or Inf")


def test_the_caller_overrides_the_batch_axes():
    hidden = np.arange(3 * 10 * 4, dtype=np.float32).reshape(3, 10, 4)
    x, _ = vad_samples(10)
    h = InputSpec("h", np.dtype(np.float32), (None, None, 4))
    assert h.batch_axis == 0 and InputSpec("h", h.dtype, h.shape, batch_axis=-2).batch_axis == 1
    batches = list(CalibrationData({"x": x, "h": hidden}, [X8, h], batch_size=4, batch_axes={"h": 1}).batches())
    assert [b["h"].shape for b in batches] == [(3, 4, 4), (3, 4, 4), (3, 2, 4)]
    np.testing.assert_array_equal(batches[1]["h"], hidden[:, 4:8])
    fixed = CalibrationData({"x": x, "h": hidden}, [X8, h], batch_size=4, batch_axes={"h": None})
    assert all(np.array_equal(b["h"], hidden) for b in fixed.batches()) and fixed.count == 10


def test_batch_axes_from_the_command_line():
    assert parse_batch_axes(["state=1", "sr=None", "x = -1"]) == {"state": 1, "sr": None, "x": -1}
    for items, message in [
        (["state"], "--batch-axis 'state': expected NAME=AXIS (AXIS an integer, or none for a fixed input)"),
        (["state=one"], "--batch-axis 'state=one': AXIS must be an integer, or none for a fixed input"),
        (["state=1", "state=2"], "--batch-axis: input 'state' is given twice"),
    ]:
        with pytest.raises(lpt.DataError) as info:
            parse_batch_axes(items)
        assert str(info.value) == message


def test_sample_counts_that_disagree_name_the_input_and_both_numbers(tmp_path):
    x, state = vad_samples(32)
    message = ("input 'state' holds 31 samples (on its batch axis 1) but input 'x' holds 32 (on axis 0); check "
               "the batch axes (--batch-axis NAME=AXIS, batch_axes={NAME: AXIS})")
    assert error({"x": x, "state": state[:, :31]}, [X8, STATE]) == f"the data: {message}"
    np.savez(tmp_path / "d.npz", x=x, state=state[:, :31])  # the file's numbers, not one batch's
    assert error(tmp_path / "d.npz", [X8, STATE], batch_size=8) == f"{tmp_path / 'd.npz'}: {message}"


@pytest.mark.parametrize("source, specs, kwargs, message", [
    pytest.param({"x": np.zeros((32, 8), np.float32), "sr": np.full(32, 16000)}, [X8, SR], {},
                 "input 'sr' is fixed (no batch axis): it takes one int64 [] value, but the data has shape [32] "
                 "(1 axis more); give one value, or its batch axis (--batch-axis sr=AXIS, batch_axes={'sr': AXIS})",
                 id="fixed-with-a-samples-axis"),
    pytest.param([{"x": np.zeros((4, 8), np.float32), "sr": 16000}, {"x": np.zeros((4, 8), np.float32), "sr": 8000}],
                 [X8, SR], {}, "input 'sr': a fixed input takes one value for all the data, but chunk 2 of the data "
                 "gives another", id="fixed-value-changes"),
    pytest.param({"x": np.zeros((4, 8), np.float32), "t": np.float32(np.inf)},
                 [X8, InputSpec("t", np.dtype(np.float32), ())], {"skip_nonfinite": True},
                 "input 't': its fixed value holds NaN or Inf", id="fixed-value-not-finite"),
    pytest.param({"x": np.zeros((4, 8), np.float32), "state": np.zeros((2, 4, 64), np.float32)}, [X8, STATE], {},
                 "input 'state': data of shape [2, 4, 64] does not fit the model's float32 [2,N,128] (batch on axis 1)",
                 id="state-shape"),
    pytest.param({"x": np.zeros((4, 8), np.float32)}, [X8], {"batch_axes": {"stat": 1}},
                 "a batch axis is given for stat, not an input of the model; the model expects inputs: x",
                 id="override-unknown-input"),
    pytest.param({"x": np.zeros((4, 8), np.float32)}, [X8, SR], {"batch_axes": {"sr": 0}},
                 "input 'sr': its int64 [] has no axis 0 to hold samples (None: a fixed input)",
                 id="override-axis-out-of-range"),
])
def test_batch_axis_errors(source, specs, kwargs, message):
    assert error(source, specs, **kwargs) == message
