"""lpt calibrate vs onnxruntime quantize_static on the bundled models: accuracy, time, memory.

Usage: python bench/calibration_sqnr.py [--models DIR] [--repeat N] [--sweep] [--no-memory]

For each fp32 model NAME.onnx in DIR (default models/) with NAME.npz (calibration inputs) and
NAME.test.npz (test inputs + labels):

  lpt   lpt.calibration.calibrate with the default preset and estimator, then lpt.save
  ORT   onnxruntime.quantization.quantize_static: QuantFormat.QDQ, per_channel=True, QUInt8
        activations, QInt8 weights, MinMax calibration, the same samples in batches of 32
  NNCF  nncf.quantize with its defaults on the same samples (when nncf is installed: pip install nncf)

Both FQ models run in onnxruntime with graph optimizations off (its QDQ fusions would swap the
f32 simulation for its own int8 kernels). Columns: output SQNR (dB) vs the fp32 model on the test
inputs, top-1, and median times as a ratio lpt/ORT: lpt's calibrate() (calibration + FQ
insertion, in memory) vs the whole quantize_static call, then with lpt.save (to_portable +
atomic write) added. Both tools get the calibration arrays in memory; runs are interleaved.

--sweep adds lpt's SQNR and top-1 for every preset × estimator (how the default was chosen).

Memory: peak of one calibrate() call on 1,000 samples vs 100 (the calibration inputs tiled,
with a little noise on float inputs), each in a fresh subprocess, measured two ways:
tracemalloc (Python and NumPy allocations; onnxruntime's own arena is not traced) and the
process's peak RSS during the call (Linux /proc/self/status VmHWM, reset just before the call
through /proc/self/clear_refs; everything: the imports, onnxruntime, the model).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnxruntime import quantization as ortq
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lpt  # noqa: E402
from lpt.calibration import DEFAULT_ESTIMATOR, DEFAULT_PRESET, Estimator, Preset, calibrate  # noqa: E402

MODELS = ["digits_cnn", "digits_zoo", "digits_transformer", "tabular_mlp"]
BATCH = 32
console = Console(width=160)


def load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as d:
        return {k: d[k] for k in d.files}


def run(model_path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def sqnr(reference: np.ndarray, approx: np.ndarray) -> float:
    noise = np.sum((reference.astype(np.float64) - approx) ** 2)
    return float("inf") if noise == 0 else float(10 * np.log10(np.sum(reference.astype(np.float64) ** 2) / noise))


def top1(logits: np.ndarray, labels: np.ndarray | None) -> float | None:
    return None if labels is None else float((logits.argmax(axis=-1) == labels).mean())


class Reader(ortq.CalibrationDataReader):
    def __init__(self, data: dict[str, np.ndarray]):
        n = len(next(iter(data.values())))
        self.batches = iter([{k: v[i:i + BATCH] for k, v in data.items()} for i in range(0, n, BATCH)])

    def get_next(self):
        return next(self.batches, None)


def quantize_ort(fp32: Path, calib: dict[str, np.ndarray], out: Path) -> float:
    start = time.perf_counter()
    ortq.quantize_static(str(fp32), str(out), Reader(calib), quant_format=ortq.QuantFormat.QDQ, per_channel=True,
                         activation_type=ortq.QuantType.QUInt8, weight_type=ortq.QuantType.QInt8,
                         calibrate_method=ortq.CalibrationMethod.MinMax)
    return time.perf_counter() - start


def quantize_lpt(fp32: Path, calib: dict[str, np.ndarray], out: Path, **options) -> tuple[float, float]:
    """(seconds in calibrate(): calibration + insertion, seconds in lpt.save)."""
    start = time.perf_counter()
    result = calibrate(fp32, calib, quiet=True, **options)
    middle = time.perf_counter()
    lpt.save(result.model, out, overwrite=True)
    return middle - start, time.perf_counter() - middle


def quantize_nncf(fp32: Path, calib: dict[str, np.ndarray], out: Path) -> bool:
    """NNCF's defaults on the calibration samples, one at a time; False when nncf is not installed."""
    try:
        import nncf
    except ImportError:
        return False
    import onnx

    n = len(next(iter(calib.values())))
    samples = [{k: v[i:i + 1] for k, v in calib.items()} for i in range(n)]
    onnx.save(nncf.quantize(onnx.load(str(fp32)), nncf.Dataset(samples), subset_size=n), str(out))
    return True


def evaluate(path: Path, test: dict[str, np.ndarray], labels, reference) -> tuple[float, float | None]:
    logits = run(path, test)
    return sqnr(reference, logits), top1(logits, labels)


def compare(models_dir: Path, repeat: int, sweep: bool) -> list[dict]:
    rows = []
    for name in MODELS:
        fp32 = models_dir / f"{name}.onnx"
        if not fp32.is_file():
            console.print(f"[yellow]{fp32} not found: skipped")
            continue
        calib_path = models_dir / f"{name}.npz"
        calib = load_npz(calib_path)
        test = load_npz(models_dir / f"{name}.test.npz")
        labels = test.pop("labels", None)
        reference = run(fp32, test)
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            times = {"lpt": [], "save": [], "ort": []}
            for _ in range(repeat):  # interleaved, so that load on the machine hits both alike
                calibrate_s, save_s = quantize_lpt(fp32, calib, tmp / "lpt.onnx")
                times["lpt"].append(calibrate_s)
                times["save"].append(save_s)
                times["ort"].append(quantize_ort(fp32, calib, tmp / "ort.onnx"))
            row = {"model": name, "fp32_top1": top1(reference, labels),
                   "lpt": evaluate(tmp / "lpt.onnx", test, labels, reference),
                   "ort": evaluate(tmp / "ort.onnx", test, labels, reference),
                   "nncf": evaluate(tmp / "nncf.onnx", test, labels, reference)
                   if quantize_nncf(fp32, calib, tmp / "nncf.onnx") else None,
                   **{f"{k}_s": statistics.median(v) for k, v in times.items()}}
            if sweep:
                row["sweep"] = {}
                for preset in Preset:
                    for estimator in Estimator:
                        for bc in (True, False):
                            out = tmp / f"{preset.value}-{estimator.value}-{bc}.onnx"
                            quantize_lpt(fp32, calib, out, preset=preset, estimator=estimator,
                                         bias_correction=bc)
                            row["sweep"][(preset.value, estimator.value, bc)] = evaluate(out, test, labels, reference)
        rows.append(row)
    return rows


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def print_comparison(rows: list[dict]) -> None:
    table = Table(title=f"lpt ({DEFAULT_PRESET.value}, {DEFAULT_ESTIMATOR.value}) vs onnxruntime quantize_static "
                        "(QDQ, per-channel, u8/s8, MinMax)", title_justify="left")
    for column in ("model", "SQNR lpt", "SQNR ORT", "SQNR NNCF", "top-1 fp32", "top-1 lpt", "top-1 ORT",
                   "top-1 NNCF", "time lpt/ORT", "with save"):
        table.add_column(column, justify="right")
    for r in rows:
        (s_lpt, t_lpt), (s_ort, t_ort) = r["lpt"], r["ort"]
        s_nncf, t_nncf = r["nncf"] or (None, None)
        table.add_row(r["model"], f"{s_lpt:.2f} dB", f"{s_ort:.2f} dB", "-" if s_nncf is None else f"{s_nncf:.2f} dB",
                      pct(r["fp32_top1"]), pct(t_lpt), pct(t_ort), pct(t_nncf),
                      f"{r['lpt_s'] / r['ort_s']:.2f} ({1000 * r['lpt_s']:.0f}/{1000 * r['ort_s']:.0f} ms)",
                      f"{(r['lpt_s'] + r['save_s']) / r['ort_s']:.2f}")
    console.print(table)
    if any("sweep" in r for r in rows):
        sweep = Table(title="lpt SQNR dB / top-1 by preset, estimator (bias correction on | off)", title_justify="left")
        sweep.add_column("preset / estimator")
        for r in rows:
            sweep.add_column(r["model"], justify="right")
        for preset in Preset:
            for estimator in Estimator:
                cells = []
                for r in rows:
                    on = r["sweep"][(preset.value, estimator.value, True)]
                    off = r["sweep"][(preset.value, estimator.value, False)]
                    cells.append(f"{on[0]:.2f} {pct(on[1])} | {off[0]:.2f} {pct(off[1])}")
                sweep.add_row(f"{preset.value} / {estimator.value}", *cells)
        console.print(sweep)


# -- memory: one calibrate() per subprocess

_CHILD = """
import json, sys, tracemalloc
sys.path.insert(0, {root!r})
from lpt.calibration import calibrate
import lpt.calibration.statistics  # imports (onnxruntime, rich) before measuring

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets the peak RSS (VmHWM) to the current RSS
rss0 = status("VmRSS")
tracemalloc.start()
calibrate({model!r}, {data!r}, subset_size={n}, quiet=True)
peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({{"traced": peak, "rss_kb": status("VmHWM"), "rss_growth_kb": status("VmHWM") - rss0}}))
"""


def tiled(calib: dict[str, np.ndarray], n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """`n` samples from the calibration set, repeated; float inputs get 1% noise so no two are equal."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, v in calib.items():
        idx = np.arange(n) % len(v)
        x = v[idx]
        if x.dtype.kind == "f":
            x = (x + 0.01 * x.std() * rng.standard_normal(x.shape)).astype(v.dtype)
        out[k] = x
    return out


def measure_memory(models_dir: Path) -> list[dict]:
    rows = []
    for name in MODELS:
        fp32 = models_dir / f"{name}.onnx"
        if not fp32.is_file():
            continue
        calib = load_npz(models_dir / f"{name}.npz")
        row = {"model": name}
        with tempfile.TemporaryDirectory() as tmp:
            for n in (100, 1000):
                data = Path(tmp) / f"{n}.npz"
                np.savez_compressed(data, **tiled(calib, n))
                code = _CHILD.format(root=str(ROOT), model=str(fp32), data=str(data), n=n)
                out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
                row[n] = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
    return rows


def print_memory(rows: list[dict]) -> None:
    table = Table(title="peak memory of calibrate(): 1,000 samples vs 100", title_justify="left")
    for column in ("model", "tracemalloc 100", "tracemalloc 1000", "ratio", "peak RSS 100", "peak RSS 1000", "ratio",
                   "RSS growth 100 / 1000"):
        table.add_column(column, justify="right")
    for r in rows:
        a, b = r[100], r[1000]
        table.add_row(r["model"], f"{a['traced'] / 2**20:.2f} MiB", f"{b['traced'] / 2**20:.2f} MiB",
                      f"{b['traced'] / a['traced']:.2f}",
                      f"{a['rss_kb'] / 1024:.0f} MiB", f"{b['rss_kb'] / 1024:.0f} MiB",
                      f"{b['rss_kb'] / a['rss_kb']:.2f}",
                      f"{a['rss_growth_kb'] / 1024:.1f} / {b['rss_growth_kb'] / 1024:.1f} MiB")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=ROOT / "models")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per tool (median)")
    parser.add_argument("--sweep", action="store_true", help="also every preset × estimator for lpt")
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.ERROR)  # quantize_static's advice to pre-process, once per call
    ort.set_default_logger_severity(3)
    print_comparison(compare(args.models, args.repeat, args.sweep))
    if not args.no_memory:
        print_memory(measure_memory(args.models))


if __name__ == "__main__":
    main()
