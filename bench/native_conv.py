"""Per-layer timing of ResNet-18's convolutions (batch 1): lpt's native oneDNN engine beside its peers.

    python bench/native_conv.py [--threads 2] [--repeats 30] [--json out.json]

Every engine runs one whole int8 step where it can: u8 NCHW source (zero point 128 for the stem, 0
after a ReLU), int8 weights, per-channel multiplier, bias, ReLU, u8 NCHW destination:
- native u8s8:  lpt.native.Conv on the plain oneDNN primitive (exact only with VNNI/AMX: the table
                says how many destination values agree with lpt's kernels where it is not);
- native s16:   lpt.native.Conv on lpt's own AVX2 kernel (source widened to int16, vpmaddwd; exact);
- native split: lpt.native.Conv with the weights split in two 7-bit halves (exact everywhere);
- lpt kernels:  lpt.kernels.pack_conv once, then conv_accumulate (MLAS through onnxruntime) and
                output_stage: lpt's current path;
- ort u8u8:     onnxruntime ConvInteger with the weights shifted to u8 (its exact route on AVX2),
                int32 accumulators only, no output stage (so it does a little less);
- OpenVINO:     an ONNX DequantizeLinear → Conv → Relu → QuantizeLinear layer with u8 input and
                output, which OpenVINO's CPU plugin runs as one int8 convolution (if `import openvino` works).
All in one process, the same thread count, rounds interleaved across engines; medians of the
repeats. The machine may be shared: a loaded core stalls every multi-threaded step, so read the
medians, not single runs, and compare within a run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import lpt.native
from lpt.kernels import Relu, conv_accumulate, output_stage, pack_conv

# (name, in channels, out channels, kernel, stride, input size, occurrences in ResNet-18)
LAYERS = [
    ("stem 7x7/2 3-64", 3, 64, 7, 2, 224, 1),
    ("3x3 64-64 @56", 64, 64, 3, 1, 56, 4),
    ("3x3/2 64-128 @56", 64, 128, 3, 2, 56, 1),
    ("1x1/2 64-128 @56", 64, 128, 1, 2, 56, 1),
    ("3x3 128-128 @28", 128, 128, 3, 1, 28, 3),
    ("3x3/2 128-256 @28", 128, 256, 3, 2, 28, 1),
    ("1x1/2 128-256 @28", 128, 256, 1, 2, 28, 1),
    ("3x3 256-256 @14", 256, 256, 3, 1, 14, 3),
    ("3x3/2 256-512 @14", 256, 512, 3, 2, 14, 1),
    ("1x1/2 256-512 @14", 256, 512, 1, 2, 14, 1),
    ("3x3 512-512 @7", 512, 512, 3, 1, 7, 3),
]


def layer_data(cin, cout, kernel, size, rng):
    zero_point = 128 if cin == 3 else 0
    src = rng.integers(0, 256, (1, cin, size, size), dtype=np.uint8) if zero_point else \
        np.maximum(rng.normal(0, 60, (1, cin, size, size)), 0).astype(np.uint8)  # post-ReLU: many zeros
    weights = np.clip(np.rint(rng.normal(0, 40, (cout, cin, kernel, kernel))), -128, 127).astype(np.int8)
    src_scale, weight_scale = np.float32(0.02), rng.uniform(0.002, 0.004, cout).astype(np.float32)
    multiplier = src_scale * weight_scale
    bias = rng.normal(0, 0.1, cout).astype(np.float32)
    dst_scale = np.float32(float(multiplier.mean()) * 40 * np.sqrt(cin * kernel * kernel) / 255 * 4)
    return src, weights, zero_point, src_scale, weight_scale, multiplier, bias, dst_scale


def engines(layer, data, threads):
    _, cin, cout, kernel, stride, size, _ = layer
    src, weights, zero_point, src_scale, weight_scale, multiplier, bias, dst_scale = data
    pad = kernel // 2
    window = dict(strides=(stride, stride), pads=(pad,) * 4)
    stage = dict(multiplier=multiplier, bias=bias, post_ops=(Relu(),), dst_scale=dst_scale, dst_zero_point=0)
    runs = {}
    for route in ("u8s8", "s16", "split"):
        if lpt.native.available() and (route != "s16" or route in lpt.native.exact_routes()):
            conv = lpt.native.Conv(weights, src_zero_point=zero_point, threads=threads, route=route, **window,
                                   **stage, dst_dtype=np.uint8)
            runs[f"native {route}"] = lambda conv=conv: conv(src)
    packed = pack_conv(weights, 0, zero_point, 1, [stride] * 2, None, [pad] * 4, threads=threads)
    runs["lpt kernels"] = lambda: output_stage(conv_accumulate(src, packed), multiplier, bias, (Relu(),), dst_scale,
                                               np.int32(0), 0, 255)
    runs["ort u8u8 (acc)"] = ort_conv_integer(src, weights, zero_point, stride, pad, threads)
    openvino = ov_conv(data, stride, pad, threads)
    if openvino is not None:
        runs["OpenVINO"] = openvino
    return runs


def ort_conv_integer(src, weights, zero_point, stride, pad, threads):
    shifted = (weights.astype(np.int16) + 128).astype(np.uint8)
    node = helper.make_node("ConvInteger", ["x", "w", "x_zp", "w_zp"], ["y"], strides=[stride] * 2, pads=[pad] * 4)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.UINT8, src.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
                              [numpy_helper.from_array(shifted, "w"),
                               numpy_helper.from_array(np.array(zero_point, np.uint8), "x_zp"),
                               numpy_helper.from_array(np.array(128, np.uint8), "w_zp")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return lambda: session.run(None, {"x": src})[0]


def ov_conv(data, stride, pad, threads):
    try:
        import openvino
    except ImportError:
        return None
    src, weights, zero_point, src_scale, weight_scale, _, bias, dst_scale = data
    constants = [
        numpy_helper.from_array(np.array(src_scale, np.float32), "s_x"),
        numpy_helper.from_array(np.array(zero_point, np.uint8), "zp_x"),
        numpy_helper.from_array(weights, "w_q"), numpy_helper.from_array(weight_scale, "s_w"),
        numpy_helper.from_array(np.zeros(len(weight_scale), np.int8), "zp_w"), numpy_helper.from_array(bias, "b"),
        numpy_helper.from_array(np.array(dst_scale, np.float32), "s_y"),
        numpy_helper.from_array(np.array(0, np.uint8), "zp_y")]
    nodes = [helper.make_node("DequantizeLinear", ["x", "s_x", "zp_x"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w_q", "s_w", "zp_w"], ["wf"], axis=0),
             helper.make_node("Conv", ["xf", "wf", "b"], ["c"], strides=[stride] * 2, pads=[pad] * 4),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s_y", "zp_y"], ["y"])]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.UINT8, src.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    core = openvino.Core()
    compiled = core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU",
                                  {"INFERENCE_NUM_THREADS": threads})
    request = compiled.create_infer_request()
    convs = [op for op in compiled.get_runtime_model().get_ops() if op.get_rt_info()["layerType"].astype(str) ==
             "Convolution"]
    precision = convs[0].get_rt_info()["runtimePrecision"].astype(str) if convs else "?"

    def run():
        request.infer({0: src})
        return request.get_output_tensor(0).data
    run.precision = precision
    return run


def median_ms(times):
    return statistics.median(times) * 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"lpt.native: available={lpt.native.available()} route={lpt.native.route()} "
          f"exact routes={lpt.native.exact_routes()} oneDNN {lpt.native.onednn_version()}; "
          f"{args.threads} threads, batch 1, median of {args.repeats} (ms); os.cpu_count()={os.cpu_count()}")
    rows, totals = [], {}
    for layer in LAYERS:
        data = layer_data(layer[1], layer[2], layer[3], layer[5], rng)
        runs = engines(layer, data, args.threads)
        reference = runs["lpt kernels"]()
        agreement = {name: float(np.mean(run() == reference)) for name, run in runs.items()
                     if name.startswith("native") or name == "OpenVINO"}
        times = {name: [] for name in runs}
        for name, run in runs.items():  # warm up: primitives are created and weights reordered at the first run
            for _ in range(3):
                run()
        for _ in range(args.repeats):
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
        medians = {name: median_ms(t) for name, t in times.items()}
        for name, value in medians.items():
            totals[name] = totals.get(name, 0.0) + value * layer[6]
        extra = getattr(runs.get("OpenVINO"), "precision", None)
        rows.append({"layer": layer[0], "count": layer[6], "ms": medians, "same_as_lpt": agreement,
                     "openvino_precision": extra})
    names = list(rows[0]["ms"])
    baseline = "OpenVINO" if "OpenVINO" in names else "ort u8u8 (acc)"
    taken = f"native {lpt.native.route()}"  # the exact route lpt takes on this CPU
    print("\n| layer | x | " + " | ".join(names) + f" | {taken} / {baseline} | u8s8 same as lpt |")
    print("|---|---|" + "---|" * (len(names) + 2))
    for row in rows:
        ms = row["ms"]
        cells = [f"{ms[n]:.3f}" for n in names]
        ratio = ms[taken] / ms[baseline] if taken in ms else float("nan")
        same = row["same_as_lpt"].get("native u8s8", float("nan"))
        print(f"| {row['layer']} | {row['count']} | " + " | ".join(cells) + f" | {ratio:.2f} | {same:.1%} |")
    print("| **ResNet-18 convs, weighted** | 20 | " + " | ".join(f"**{totals[n]:.2f}**" for n in names)
          + f" | **{totals.get(taken, float('nan')) / totals[baseline]:.2f}** | |")
    print("\nratios of the weighted totals (engine / native split): "
          + ", ".join(f"{n} {totals[n] / totals['native split']:.2f}" for n in names if "native split" in totals))
    for route in lpt.native.exact_routes():
        same = [row["same_as_lpt"].get(f"native {route}") for row in rows]
        print(f"native {route} == lpt kernels on every layer: {all(s == 1.0 for s in same)}")
    ov_same = [row["same_as_lpt"].get("OpenVINO") for row in rows if "OpenVINO" in row["same_as_lpt"]]
    if ov_same:
        print(f"OpenVINO's u8 outputs equal to lpt's: {min(ov_same):.1%} to {max(ov_same):.1%} per layer; "
              f"conv precision {rows[1]['openvino_precision']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "rows": rows, "totals_ms": totals}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
