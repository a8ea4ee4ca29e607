"""Dynamic quantization on the corpus's recurrent models: `lpt quantize --dynamic` vs onnxruntime's quantize_dynamic.

    python bench/dynamic.py                                    # plcmos_v2, silero_vad_16k_op15
    python bench/dynamic.py --models plcmos_v2,ddddocr_common --repeats 20 --json dynamic.json

Per model (fetched and fed as bench/real_models.py does: 32 calibration samples, which here only
feed lpt's report, and 16 evaluation samples from bench/corpus_inputs.py):

- SQNR vs fp32 (worst output, over the evaluation samples, onnxruntime fp32 as the reference) of
  `lpt --dynamic` run on lpt's backend; of the same with the recurrent weights kept f32; of
  onnxruntime's `quantize_dynamic` (its defaults) run by onnxruntime, and run on lpt's exact backend
  (the two differ where onnxruntime's u8·s8 kernels saturate int16 pair sums: CPUs without VNNI);
- LSB: lpt's backend vs onnxruntime on lpt's dynamic model, over every integer tensor
  (DynamicQuantizeLinear outputs, MatMulInteger/ConvInteger accumulators) of the first samples, end
  to end and with each quantized op fed onnxruntime's inputs (what the op itself adds);
- static int8 beside it: `lpt quantize` (calibrated on the 32 samples) with the LSTM/GRU left f32 ops
  (the default) and with `--int8-recurrent` (their recurrent MatMuls on int8 too), SQNR and latency;
- latency: median of `--repeats` runs on one evaluation sample, in turns, `--threads` threads: onnxruntime fp32,
  lpt's plan of lpt's model (dynamic, then both static forms), onnxruntime on lpt's model, onnxruntime on
  quantize_dynamic's model.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus_inputs import make_samples, stack
from real_models import (
    CALIBRATION,
    EVALUATION,
    fetch,
    ort_outputs,
    ort_session,
    read_corpus,
    recipe_for,
    sqnr,
)

DEFAULT_MODELS = "plcmos_v2,silero_vad_16k_op15"


def worst(references, candidates) -> float:
    return round(min(sqnr(references, candidates).values()), 2)


def measure(name: str, corpus, args, work: Path) -> dict:
    import onnx
    from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic

    import lpt
    from lpt.benchmark import median_ms_in_turns
    from lpt.calibration.dynamic import quantize_dynamic

    by_name = {e.name: e for e in corpus}
    entry = by_name[name]
    model = fetch(entry, args.cache)
    recipe = recipe_for(entry, corpus)
    upstream = lambda other: str(fetch(by_name[other], args.cache))
    calibration = make_samples(recipe, CALIBRATION, upstream)
    evaluation = make_samples(recipe, EVALUATION, upstream)
    fp32 = ort_session(model, args.threads)
    shapes = {i.name: i.shape for i in fp32.get_inputs()}
    here = work / name
    here.mkdir(parents=True, exist_ok=True)
    np.savez(here / "calibration.npz", **stack(calibration, shapes))
    reference = ort_outputs(fp32, evaluation)
    row: dict = {"model": name}

    result = lpt.quantize(model, here / "calibration.npz", dynamic=True, subset_size=len(CALIBRATION))
    dynamic = result.report.dynamic
    row["lpt ops"] = {"dynamic": len(dynamic.quantized), "weights only": len(dynamic.weights_only),
                      "f32": len(dynamic.left_f32)}
    row["lpt report"] = dynamic.to_dict()
    check = result.report.check
    row["lsb"] = {"max end to end": check.max_lsb, "max, each op fed onnxruntime's inputs": check.max_local_lsb,
                  "integer tensors": len(check.tensors)}
    lpt_path, _ = result.save(here / name, overwrite=True)
    plan = lpt.compile_model(lpt.clone(result.int8_model), threads=args.threads)
    row["sqnr lpt"] = worst(reference, [plan.run(feed) for feed in evaluation])

    f32_recurrent = quantize_dynamic(lpt.read_model(model), recurrent_weights=False).model
    plan_f32_recurrent = lpt.compile_model(f32_recurrent, threads=args.threads)
    row["sqnr lpt, recurrent weights f32"] = worst(reference, [plan_f32_recurrent.run(f) for f in evaluation])

    with_conv = quantize_dynamic(lpt.read_model(model), conv=True).model
    plan_with_conv = lpt.compile_model(with_conv, threads=args.threads)
    row["sqnr lpt, Conv too"] = worst(reference, [plan_with_conv.run(f) for f in evaluation])

    static = {}  # lpt's static int8, the recurrences left f32 (the default) and on int8 (--int8-recurrent)
    for label, int8_recurrent in (("static", False), ("static, int8 recurrent", True)):
        quantized = lpt.quantize(model, here / "calibration.npz", int8_recurrent=int8_recurrent,
                                 subset_size=len(CALIBRATION))
        static[label] = lpt.compile_model(lpt.clone(quantized.int8_model), threads=args.threads)
        row[f"sqnr lpt {label}"] = worst(reference, [static[label].run(f) for f in evaluation])
        if int8_recurrent:
            row["int8 recurrences"] = len(quantized.report.calibration.recurrent)

    ort_path = here / f"{name}.ort_dynamic.onnx"
    ort_quantize_dynamic(model, ort_path)
    ort_dynamic = ort_session(ort_path, args.threads)
    row["sqnr quantize_dynamic (onnxruntime)"] = worst(reference, ort_outputs(ort_dynamic, evaluation))
    try:
        ort_on_lpt = lpt.compile_model(lpt.read_model(ort_path), threads=args.threads)
        row["sqnr quantize_dynamic (lpt's backend)"] = worst(reference, [ort_on_lpt.run(f) for f in evaluation])
    except Exception as error:  # noqa: BLE001 - e.g. a com.microsoft op lpt's backend does not run
        row["sqnr quantize_dynamic (lpt's backend)"] = f"failed: {str(error).splitlines()[0][:120]}"
    row["ops quantize_dynamic"] = sorted({n.op_type for n in onnx.load(ort_path).graph.node
                                          if "Integer" in n.op_type or "Dynamic" in n.op_type})

    lpt_in_ort = ort_session(lpt_path, args.threads)
    feed = evaluation[0]
    engines = {"onnxruntime fp32": lambda: fp32.run(None, feed),
               "lpt backend, lpt model": lambda: plan.run(feed),
               **{f"lpt backend, lpt {label}": (lambda p=p: p.run(feed)) for label, p in static.items()},
               "onnxruntime, lpt model": lambda: lpt_in_ort.run(None, feed),
               "onnxruntime, quantize_dynamic model": lambda: ort_dynamic.run(None, feed)}
    latency = median_ms_in_turns(engines, args.repeats)
    base = latency["onnxruntime fp32"]
    row["latency ms"] = latency
    row["latency vs onnxruntime fp32"] = {k: round(v / base, 2) for k, v in latency.items()}
    row["size MB"] = {"fp32": round(Path(model).stat().st_size / 1e6, 2),
                      "lpt": round(lpt_path.stat().st_size / 1e6, 2),
                      "quantize_dynamic": round(ort_path.stat().st_size / 1e6, 2)}
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "lpt" / "corpus")
    parser.add_argument("--work", type=Path)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    corpus = read_corpus()
    rows = []
    with tempfile.TemporaryDirectory() as temporary:
        work = args.work or Path(temporary)
        for name in args.models.split(","):
            row = measure(name, corpus, args, work)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "lpt report"}, indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
