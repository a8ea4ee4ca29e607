"""Peak RSS of calibration and of evaluation over a folder of N and 10×N JPEGs: streaming keeps it flat.

    python bench/data_rss.py                 # N = 500: 500 and 5,000 JPEGs, digits_cnn (--color L)
    python bench/data_rss.py --n 200

The JPEGs (digits_cnn's test images, 16×16 grey, upscaled to 64×64 with a little noise so that
each file differs) go in class subfolders of a temporary folder. Each measurement is its own
process (`lpt calibrate` / `lpt compare` through lpt's Python API) reporting its peak RSS
(resource.getrusage ru_maxrss); the bar is RSS(10×N) ≤ 1.1 × RSS(N).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "digits_cnn.onnx"
# digits_cnn's pixels are k/256 (models/README.md): grey JPEGs, x/256 after decoding, resized to 16×16
OPTIONS = dict(color="L", scale=1 / 256)

CHILD = r"""
import json, resource, sys, time
import lpt
from lpt.calibration import calibrate
what, folder, fq = sys.argv[1], sys.argv[2], sys.argv[3]
options = lpt.ImageOptions(**json.loads(sys.argv[4]))
start = time.perf_counter()
data = lpt.open_data(folder, lpt.read_model(sys.argv[5]), image=options)
if what == "calibrate":
    n = calibrate(sys.argv[5], data, subset_size=10**9, overflow_fix="none", quiet=True).report.samples
else:
    n = lpt.compare(sys.argv[5], fq, data).outputs["logits"].count // 10
print(json.dumps({"samples": n, "seconds": time.perf_counter() - start,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def write_jpegs(folder: Path, count: int) -> None:
    from PIL import Image

    test = np.load(ROOT / "models" / "digits_cnn.test.npz")
    images, labels = test["input"][:, 0], test["labels"]
    rng = np.random.default_rng(0)
    for i in range(count):
        k = i % len(images)
        pixels = np.kron(images[k] * 256, np.ones((4, 4))) + rng.normal(0, 2, (64, 64))
        (folder / str(labels[k])).mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "L").save(folder / str(labels[k]) / f"{i:05d}.jpg")


def measure(what: str, folder: Path, fq: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, what, str(folder), str(fq), json.dumps(OPTIONS), str(MODEL)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500)
    args = parser.parse_args()
    import lpt
    from lpt.calibration import calibrate

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        fq = tmp / "digits_cnn.fq.onnx"
        lpt.save(calibrate(MODEL, ROOT / "models" / "digits_cnn.npz", overflow_fix="none", quiet=True).model, fq)
        rows = {}
        for count in (args.n, 10 * args.n):
            folder = tmp / f"jpegs_{count}"
            start = time.perf_counter()
            write_jpegs(folder, count)
            print(f"{count} JPEGs written in {time.perf_counter() - start:.1f} s", flush=True)
            for what in ("calibrate", "compare"):
                rows[what, count] = measure(what, folder, fq)
                r = rows[what, count]
                print(f"  {what:9s} {r['samples']:6d} samples  {r['rss_mb']:6.0f} MB peak RSS  {r['seconds']:6.1f} s",
                      flush=True)
        for what in ("calibrate", "compare"):
            ratio = rows[what, 10 * args.n]["rss_mb"] / rows[what, args.n]["rss_mb"]
            print(f"{what}: RSS ×{ratio:.3f} for 10× the images ({'within' if ratio <= 1.1 else 'ABOVE'} 1.1×)")


if __name__ == "__main__":
    main()
