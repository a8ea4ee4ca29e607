"""Throughput of `lpt compare` (samples/s) in one process and on 1 and 2 local Ray workers.

    python bench/ray_scaling.py                      # digits_cnn, its test samples repeated 8×
    python bench/ray_scaling.py --repeat 16 --workers 1,2,4

Each Ray figure is the second of two runs: the first starts the workers (a process importing lpt
each) and is reported apart as the start-up cost. Needs pip install 'lpt[ray]'.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

import lpt
from lpt.calibration import calibrate

MODELS = Path(__file__).resolve().parent.parent / "models"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="digits_cnn")
    parser.add_argument("--repeat", type=int, default=8, help="the test samples, this many times over")
    parser.add_argument("--workers", default="1,2")
    args = parser.parse_args()
    import ray

    model = MODELS / f"{args.model}.onnx"
    test = dict(np.load(MODELS / f"{args.model}.test.npz"))
    data = {k: np.concatenate([v] * args.repeat) for k, v in test.items()}
    samples = len(data["labels"])
    fq = calibrate(model, MODELS / f"{args.model}.npz", overflow_fix="none", quiet=True).model

    def timed(**options) -> tuple[float, float]:
        start = time.perf_counter()
        result = lpt.compare(model, fq, data, labels="labels", **options)
        return time.perf_counter() - start, result.top1.candidate_accuracy

    seconds, top1 = timed()
    print(f"{args.model}: {samples} samples, {os.cpu_count()} CPUs")
    print(f"  one process      {samples / seconds:8.0f} samples/s   top-1 {top1:.4f}")
    start = time.perf_counter()
    ray.init(num_cpus=max(int(w) for w in args.workers.split(",")), include_dashboard=False, log_to_driver=False)
    print(f"  ray.init          {time.perf_counter() - start:8.1f} s")
    for workers in (int(w) for w in args.workers.split(",")):
        first, _ = timed(ray="local", ray_workers=workers)
        seconds, top1 = timed(ray="local", ray_workers=workers)
        print(f"  Ray, {workers} worker{'s' if workers > 1 else ' '}   {samples / seconds:8.0f} samples/s   top-1 "
              f"{top1:.4f}   (first run {first:.1f} s: workers starting)")
    ray.shutdown()


if __name__ == "__main__":
    main()
