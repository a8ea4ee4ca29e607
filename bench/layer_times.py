"""Where lpt's int8 time goes against OpenVINO's, layer by layer, on the same fake-quantized model.

    python bench/layer_times.py MODEL.fq.onnx DATA.npz [--threads 2] [--repeats 10] [--top 40]

lpt's plan runs with its per-instruction timing (the time of each instruction of a native program,
as `lpt bench` prints it) and OpenVINO's CPU plugin with its per-layer counters (PERF_COUNT), in one
process, on the first sample of DATA.npz; each lpt layer is printed beside OpenVINO's layer of the
same name (OpenVINO keeps the ONNX node names of the layers it does not fuse away), slowest first,
with the sums. A layer much slower in lpt than in OpenVINO is where lpt's engine has work left; a
name OpenVINO lacks was fused into a neighbour there (its time is in that neighbour's).

Needs `pip install openvino` (the `bench` extra).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import numpy as np

import lpt
from lpt.backend.plan import compile_model
from lpt.benchmark import _profile
from lpt.calibration.data import input_specs


def first_sample(model, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each input's first item along its batch axis, as lpt's data reading finds it (a recurrent state's
    [layers, N, ...] along axis 1); an input without one whole."""
    axes = {spec.name: spec.batch_axis for spec in input_specs(model)}
    return {k: v if axes.get(k) is None else v.take([0], axis=axes[k]) for k, v in data.items()}


def openvino_layers(path: str, feed: dict, threads: int, repeats: int) -> dict[str, float]:
    import openvino

    core = openvino.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", {"INFERENCE_NUM_THREADS": threads, "PERF_COUNT": True})
    request = compiled.create_infer_request()
    for _ in range(3):
        request.infer(feed)
    ms: dict[str, float] = defaultdict(float)
    for _ in range(repeats):
        request.infer(feed)
        for layer in request.profiling_info:
            ms[layer.node_name] += layer.real_time.total_seconds() * 1e3 / repeats
    return ms


def lpt_layers(model, feed: dict, threads: int, repeats: int) -> list[tuple[str, str, float]]:
    """(layer name, the ops it covers, ms) for each step and each instruction inside a native program."""
    lpt.transform(model)
    plan = compile_model(model, threads=threads)
    plan.run(feed)
    rows = []
    for name, ms in _profile(plan, feed, repeats):
        if name.startswith("native program"):
            continue  # its instructions are rows of their own
        ops, _, node = name.removeprefix("in program: ").rpartition(" [")
        rows.append((node.rstrip("]").removesuffix("/integer"), ops, ms))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a fake-quantized ONNX model (lpt quantize writes NAME.fq.onnx)")
    parser.add_argument("data", help="an .npz of inputs by name; the first sample runs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--top", type=int, default=40, help="the slowest lpt layers to print")
    args = parser.parse_args(argv)
    try:
        import openvino  # noqa: F401
    except ImportError:
        print("error: OpenVINO is not installed (pip install openvino)", file=sys.stderr)
        return 1
    model = lpt.load(args.model)
    with np.load(args.data) as data:
        feed = first_sample(model, dict(data))
    ours = lpt_layers(model, feed, args.threads, args.repeats)
    try:
        theirs = openvino_layers(args.model, feed, args.threads, args.repeats)
    except RuntimeError as err:  # a model its frontend cannot convert
        print(f"error: OpenVINO cannot run {args.model}: {str(err).strip().splitlines()[-1][:200]}", file=sys.stderr)
        return 1
    print(f"lpt: {sum(ms for _, _, ms in ours):.2f} ms in its layers; OpenVINO: {sum(theirs.values()):.2f} ms "
          f"({args.threads} threads, median of {args.repeats} runs for lpt, mean for OpenVINO)")
    print(f"{'lpt ms':>8} {'OV ms':>8} {'ratio':>6}  layer (lpt's ops)")
    for name, ops, ms in sorted(ours, key=lambda r: -r[2])[:args.top]:
        other = theirs.get(name, theirs.get(f"{name}/WithoutBiases"))  # OpenVINO's name for a layer with a bias
        ratio = f"{ms / other:6.2f}" if other else "     -"
        print(f"{ms:8.3f} {other if other is not None else float('nan'):8.3f} {ratio}  {name[:48]} ({ops[:50]})")
    named = {name for name, _, _ in ours} | {f"{name}/WithoutBiases" for name, _, _ in ours}
    rest = sorted(((ms, name) for name, ms in theirs.items() if name not in named and ms > 0), reverse=True)
    if rest:
        print("OpenVINO's layers with no lpt layer of that name (fused, or named otherwise), slowest first:")
        for ms, name in rest[:10]:
            print(f"{'':8} {ms:8.3f}         {name[:80]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
