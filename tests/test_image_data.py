"""Folders of images as data: preprocessing, labels, bad files, the recorded preprocessing, lpt.Dataset
and onnxruntime readers; the bar: digits_cnn's test split as PNGs gives the .npz route's top-1."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper, numpy_helper
from PIL import Image

import lpt
from cli.main import main
from lpt.calibration.data import CalibrationData, InputSpec, input_specs
from lpt.data import Dataset, ImageOptions, open_data
from lpt.data.images import load_image
from lpt.data.preprocess import from_json, resolve_image
from lpt.errors import DataError

MODELS = Path(__file__).parent.parent / "models"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def digits():
    test = np.load(MODELS / "digits_cnn.test.npz")
    return test["input"], test["labels"]


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory, digits):
    """The test split as 16-bit PNGs in class subfolders: pixel k/256 stored as k (0..256 needs 16 bits)."""
    images, labels = digits
    assert np.array_equal(np.unique(images * 256), np.arange(257))  # what the .npz holds: k/256
    folder = tmp_path_factory.mktemp("digits")
    for i, (image, label) in enumerate(zip(images, labels)):
        (folder / str(label)).mkdir(exist_ok=True)
        Image.fromarray(np.rint(image[0] * 256).astype(np.uint16)).save(folder / str(label) / f"{i:04d}.png")
    return folder


def spec(shape, dtype=np.float32, name="x"):
    return InputSpec(name, np.dtype(dtype), shape)


def test_the_pngs_round_trip_to_the_npz_arrays_and_labels(digits, digits_folder):
    images, labels = digits
    source = open_data(digits_folder, MODELS / "digits_cnn.onnx", image=ImageOptions(scale=1 / 256))
    assert "10 classes from class subfolders" in source.describe() and "x*1/256" in source.describe()
    collected = CalibrationData(source, input_specs(lpt.read_model(MODELS / "digits_cnn.onnx"))).collect()["input"]
    order = np.argsort(labels, kind="stable")  # class subfolders, files sorted in each
    assert collected.dtype == np.float32 and np.array_equal(collected, images[order])
    assert source.labels == labels[order].tolist()


def test_quantize_on_the_png_folder_reports_the_npz_routes_top1(digits_folder, tmp_path):
    """The bar: `lpt quantize models/digits_cnn.onnx --data DIR` end to end, fp32 and int8 top-1 side by side."""
    folder_json, npz_json = tmp_path / "folder.json", tmp_path / "npz.json"
    result = invoke("quantize", MODELS / "digits_cnn.onnx", "--data", digits_folder, "--scale", "1/256",
                    "--subset-size", 540, "-o", tmp_path / "folder", "--json", folder_json, "--quiet")
    assert result.exit_code == 0, result.output
    assert "top-1 on 540 labelled samples: fp32 98.89%, int8 98.89%" in " ".join(result.output.split())
    npz = invoke("quantize", MODELS / "digits_cnn.onnx", "--data", MODELS / "digits_cnn.test.npz", "--labels", "labels",
                 "--subset-size", 540, "-o", tmp_path / "npz", "--json", npz_json, "--quiet")
    assert npz.exit_code == 0, npz.output
    from_folder = json.loads(folder_json.read_text())
    from_npz = json.loads(npz_json.read_text())
    assert from_folder["agreement"]["accuracy"] == from_npz["agreement"]["accuracy"]
    assert from_folder["agreement"]["accuracy"]["reference"] == pytest.approx(534 / 540)
    assert from_folder["agreement"]["accuracy"]["top5"]["reference"] == 1.0
    assert from_folder["data"]["files"] == 540 and from_folder["data"]["skipped_files"] == 0

    # the FQ model records the preprocessing; compare and run reuse it when given the folder alone
    fq = tmp_path / "folder.fq.onnx"
    recorded = {p.key: p.value for p in onnx.load(fq).metadata_props}["lpt.preprocess"]
    assert from_json(recorded, "fq").scale == 1 / 256
    compared = invoke("compare", MODELS / "digits_cnn.onnx", fq, "--data", digits_folder)
    output = " ".join(compared.output.split())
    assert compared.exit_code == 0 and "preprocessing as recorded in folder.fq.onnx" in output
    assert "top-1: reference 98.89%, candidate 98.89%" in output
    # options given win over the record: x/255 is not what the model saw, and its accuracy says so
    other = invoke("compare", MODELS / "digits_cnn.onnx", fq, "--data", digits_folder, "--scale", "1/65535")
    assert other.exit_code == 0 and "as given" in other.output and "top-1: reference 98.89%" not in other.output


def image(tmp_path, array, name="a.png"):
    path = tmp_path / name
    Image.fromarray(np.asarray(array, np.uint8)).save(path)
    return path


def test_pixels_are_scaled_normalized_and_laid_out_as_asked(tmp_path):
    rgb = np.arange(4 * 6 * 3).reshape(4, 6, 3) * 3
    path = image(tmp_path, rgb)
    nchw = resolve_image(ImageOptions(mean=(0.5,), std=(0.25,)), spec((None, 3, 4, 6)))
    assert nchw.notes == ("layout NCHW", "color RGB", "size 4x6")
    expected = ((rgb.astype(np.float32) / np.float32(255) - np.float32(0.5)) / np.float32(0.25)).transpose(2, 0, 1)
    np.testing.assert_array_equal(load_image(path, nchw), expected)
    nhwc_bgr = resolve_image(ImageOptions(color="BGR", scale=1.0), spec((None, 4, 6, 3)))
    assert nhwc_bgr.layout == "NHWC"
    np.testing.assert_array_equal(load_image(path, nhwc_bgr), rgb[..., ::-1].astype(np.float32))
    grey = resolve_image(ImageOptions(scale=1.0), spec((None, 1, 4, 6)))
    expected_grey = np.asarray(Image.open(path).convert("L"), np.float32)[None]
    np.testing.assert_array_equal(load_image(path, grey), expected_grey)


def test_resize_center_crop_and_letterbox(tmp_path):
    rng = np.random.default_rng(0)
    wide = rng.integers(0, 256, (10, 20, 3))
    path = image(tmp_path, wide)
    # shorter side to 8 (20 → 16, torchvision's Resize(8)), then the center 8x8
    crop = resolve_image(ImageOptions(resize=8, scale=1.0), spec((None, 3, 8, 8)))
    assert crop.crop == "center"
    resized = np.asarray(Image.open(path).resize((16, 8), Image.Resampling.BILINEAR), np.float32)
    np.testing.assert_array_equal(load_image(path, crop), resized[:, 4:12].transpose(2, 0, 1))
    # letterbox: 10x20 fits 8x8 as 4x8, grey 114 above and below
    box = resolve_image(ImageOptions(letterbox=True, scale=1.0), spec((None, 3, 8, 8)))
    out = load_image(path, box)
    assert (out[:, :2] == 114).all() and (out[:, 6:] == 114).all()
    small = np.asarray(Image.open(path).resize((8, 4), Image.Resampling.BILINEAR), np.float32)
    np.testing.assert_array_equal(out[:, 2:6], small.transpose(2, 0, 1))
    # the imagenet preset: 256/224 of the crop, center crop, ImageNet's mean and std
    imagenet = resolve_image(ImageOptions(preset="imagenet"), spec((None, 3, 224, 224)))
    assert (imagenet.resize, imagenet.crop, imagenet.color) == (256, "center", "RGB")
    assert imagenet.mean == (0.485, 0.456, 0.406) and imagenet.std == (0.229, 0.224, 0.225)


@pytest.mark.parametrize("options, shape, message", [
    pytest.param(ImageOptions(), (None, 3, None, None), "does not fix the image size: give it with --resize HxW",
                 id="dynamic-size"),
    pytest.param(ImageOptions(color="RGB"), (None, 1, 8, 8), "--color RGB gives 3 channel(s)", id="color-vs-channels"),
    pytest.param(ImageOptions(resize=4), (None, 3, 8, 8), "--resize 4: smaller than the 8x8 crop", id="small-resize"),
    pytest.param(ImageOptions(letterbox=True, resize=8), (None, 3, 8, 8), "exclude each other", id="letterbox-resize"),
    pytest.param(ImageOptions(mean=(0.1, 0.2, 0.3)), (None, 1, 8, 8), "3 values for L's 1 channel", id="mean-count"),
    pytest.param(ImageOptions(), (None, 30), "is not an image input", id="tabular"),
])
def test_options_that_contradict_the_input_are_one_line_errors(options, shape, message):
    with pytest.raises(DataError, match="^[^\n]*$") as err:
        resolve_image(options, spec(shape))
    assert message in str(err.value)


def small_model(tmp_path, channels=3, size=8, dtype=onnx.TensorProto.FLOAT):
    """x [N, C, size, size] → GlobalAveragePool → Flatten → Gemm → logits [N, 6]."""
    rng = np.random.default_rng(1)
    weight = rng.normal(size=(6, channels)).astype(np.float32)
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=onnx.TensorProto.FLOAT),
             helper.make_node("GlobalAveragePool", ["xf"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "w"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", dtype, ["N", channels, size, size])],
                              [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["N", 6])],
                              [numpy_helper.from_array(weight, "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    path = tmp_path / "small.onnx"
    onnx.save(proto, path)
    return path


def photos(folder: Path, count=6, size=(12, 10), classes=("cat", "dog")):
    rng = np.random.default_rng(2)
    for i in range(count):
        cls = folder / classes[i % len(classes)] if classes else folder
        cls.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(cls / f"{i}.jpg", quality=90)
    return folder


def test_a_corrupt_jpeg_is_named_in_one_line_or_skipped_and_counted(tmp_path):
    model = small_model(tmp_path)
    folder = photos(tmp_path / "photos")
    good = (folder / "cat" / "0.jpg").read_bytes()
    (folder / "cat" / "bad.jpg").write_bytes(good[: len(good) // 2])  # truncated
    overwrite = invoke("quantize", model, "--data", folder, "-o", tmp_path / "q", "--json", folder / "dog" / "1.jpg",
                       "--force")
    assert overwrite.exit_code == 1 and "which this command reads" in overwrite.output  # a data file: never replaced
    refused = invoke("quantize", model, "--data", folder, "-o", tmp_path / "q", "--quiet")
    assert refused.exit_code == 1
    line = refused.output.strip().splitlines()[-1]
    assert line.startswith("error: ") and "bad.jpg" in line and "--skip-bad" in line
    report = tmp_path / "report.json"
    skipped = invoke("quantize", model, "--data", folder, "-o", tmp_path / "q", "--quiet", "--skip-bad",
                     "--json", report)
    assert skipped.exit_code == 0, skipped.output
    assert "skipped 1 unreadable file (first: " in " ".join(skipped.output.split())
    data = json.loads(report.read_text())["data"]
    assert data["skipped_files"] == 1 and data["skipped"][0]["file"].endswith("bad.jpg")
    assert json.loads(report.read_text())["calibration"]["samples"] == 6  # the 6 good photos, the bad one's label gone


def test_csv_labels_for_a_flat_folder(tmp_path):
    model = small_model(tmp_path)
    folder = photos(tmp_path / "flat", classes=())
    rows = ["file,label"] + [f"{i}.jpg,{'dog' if i % 3 else 'cat'}" for i in range(6)]
    (folder / "labels.csv").write_text("\n".join(rows) + "\n")
    source = open_data(folder, model)
    CalibrationData(source, list(_specs(model).values())).collect()
    assert source.labels == [0, 1, 1, 0, 1, 1] and source.listing.classes == ("cat", "dog")
    (folder / "labels.csv").write_text("\n".join(rows[:-1]) + "\n")
    with pytest.raises(DataError, match="labels.csv: no label for 5.jpg"):
        open_data(folder, model)


def _specs(model):
    return {s.name: s for s in input_specs(lpt.read_model(model))}


def test_integer_inputs_take_rounded_pixels_and_inspect_suggests_options(tmp_path):
    model = small_model(tmp_path, dtype=onnx.TensorProto.UINT8)
    folder = photos(tmp_path / "photos", classes=())
    source = open_data(folder, model, image=ImageOptions(preset="raw"))
    batch = CalibrationData(source, list(_specs(model).values())).collect()["x"]
    first = np.asarray(Image.open(folder / "0.jpg").resize((8, 8), Image.Resampling.BILINEAR)).transpose(2, 0, 1)
    assert batch.dtype == np.uint8 and np.array_equal(batch[0], first)
    lines = invoke("inspect", small_model(tmp_path), "--json").output
    assert "looks like an image" in json.loads(lines)["data"][0]


def test_dataset_and_an_onnxruntime_reader_calibrate_like_the_arrays(digits):
    images = digits[0][:64]
    expected = lpt.calibrate(MODELS / "digits_cnn.onnx", {"input": images}, quiet=True).ranges

    generator = (image for image in images)  # one-shot: replayed from what it gave
    dataset = Dataset(generator, lambda image: {"input": image[None]})
    assert lpt.calibrate(MODELS / "digits_cnn.onnx", dataset, quiet=True, estimator="auto").report.samples == 64
    assert lpt.calibrate(MODELS / "digits_cnn.onnx", Dataset(list(images)), quiet=True).ranges == expected

    class Reader:  # onnxruntime's CalibrationDataReader protocol, without rewind
        def __init__(self):
            self.items = iter([{"input": images[i:i + 8]} for i in range(0, 64, 8)])

        def get_next(self):
            return next(self.items, None)

    result = lpt.quantize(MODELS / "digits_cnn.onnx", Reader())  # calibrate, cross-check, compare: 3 passes
    assert result.report.calibration.samples == 64 and result.report.agreement.top1.count == 64
    assert lpt.calibrate(MODELS / "digits_cnn.onnx", Reader(), quiet=True).ranges == expected

    class Rewinding(Reader):  # one that can start again is asked to, once per pass after the first
        rewinds = 0

        def rewind(self):
            self.rewinds += 1
            self.__init__()

    reader = Rewinding()  # two passes: statistics, then the auto estimator's (no overflow-fix passes)
    assert lpt.calibrate(MODELS / "digits_cnn.onnx", reader, quiet=True, estimator="auto",
                         overflow_fix="none").report.samples == 64
    assert reader.rewinds == 1

    labels = digits[1][:64]
    labelled = Dataset(list(zip(images, labels)), lambda item: {"input": item[0][None]}, label=lambda item: item[1])
    accuracy = result.compare(labelled).to_dict()["accuracy"]
    fp32 = lpt.run_reference(lpt.read_model(MODELS / "digits_cnn.onnx"), {"input": images})["logits"]
    assert accuracy["reference"] == np.mean(fp32.argmax(axis=1) == labels)


def test_top5_counts_labels_among_the_five_highest_scores():
    from lpt.metrics import TopOne

    scores = np.array([[0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0], [0, 9, 1, 2, 3, 4]], np.float32)
    top = TopOne()
    top.add(scores, scores[:, ::-1], labels=np.array([0, 0, 2]))
    # reference: label 0 is the lowest of row 0 (out), the highest of row 1, fourth of row 2 (in)
    assert (top.reference_correct, top.reference_top5_correct) == (1, 2)
    # candidate (reversed rows): row 0's label 0 scores highest, row 1's lowest, row 2's label 2 fourth
    assert (top.candidate_correct, top.candidate_top5_correct, top.top5) == (1, 2, True)


def test_an_image_too_large_to_decode_is_refused_by_its_header(tmp_path, monkeypatch):
    import lpt.data.images

    model = small_model(tmp_path)
    folder = photos(tmp_path / "photos", count=2, classes=())
    monkeypatch.setattr(lpt.data.images, "MAX_PIXELS", 100)  # the photos are 12x10 = 120 pixels
    with pytest.raises(DataError, match=r"0\.jpg: 10x12 pixels, more than the 100 lpt decodes from one image"):
        CalibrationData(open_data(folder, model), list(_specs(model).values())).collect()
