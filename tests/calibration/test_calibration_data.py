"""The dataset layer: every source form, streaming, and each bad input as a one-line DataError."""

import numpy as np
import pytest

import lpt
from lpt.calibration import calibrate
from lpt.calibration.data import CalibrationData, InputSpec
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
    assert error(tmp_path / "nothing") == f"{tmp_path / 'nothing'}: no .npz or .npy files in this folder"
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
