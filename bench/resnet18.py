"""lpt's int8 backend vs onnxruntime on a ResNet-18-shaped model (batch 1, 3x224x224).

    python bench/resnet18.py [--threads 2] [--repeats 20] [--json out.json]

The model is generated here with random He-initialized weights (it is not committed: the
timing, not the accuracy, is what this measures), calibrated by lpt on random inputs, and run
by lpt's int8 plan, onnxruntime on lpt's QDQ model (its own int8 kernels), OpenVINO on the same
model (its int8 CPU plugin; where installed: pip install 'lpt[bench]') and onnxruntime on the
fp32 model, in one process with the same thread count. Prints medians, ratios, and where
lpt's time goes.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper, numpy_helper

import lpt
from lpt.benchmark import benchmark, machine_line

RNG = np.random.default_rng(0)


class _Builder:
    def __init__(self):
        self.nodes, self.inits, self.count = [], [], 0

    def conv(self, x, cin, cout, kernel, stride=1, relu=True):
        self.count += 1
        name = f"conv{self.count}"
        w = RNG.normal(0, np.sqrt(2 / (cin * kernel * kernel)), (cout, cin, kernel, kernel)).astype(np.float32)
        b = RNG.normal(0, 0.05, cout).astype(np.float32)
        self.inits += [numpy_helper.from_array(w, f"{name}.w"), numpy_helper.from_array(b, f"{name}.b")]
        pad = kernel // 2
        self.nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [name], name=name,
                                           kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4))
        if not relu:
            return name
        self.nodes.append(helper.make_node("Relu", [name], [f"{name}.relu"], name=f"{name}.relu"))
        return f"{name}.relu"

    def block(self, x, cin, cout, stride):
        y = self.conv(x, cin, cout, 3, stride)
        y = self.conv(y, cout, cout, 3, 1, relu=False)
        shortcut = self.conv(x, cin, cout, 1, stride, relu=False) if stride != 1 or cin != cout else x
        out = f"add{self.count}"
        self.nodes += [helper.make_node("Add", [y, shortcut], [out], name=out),
                       helper.make_node("Relu", [out], [f"{out}.relu"], name=f"{out}.relu")]
        return f"{out}.relu"


def resnet18() -> onnx.ModelProto:
    b = _Builder()
    x = b.conv("input", 3, 64, 7, 2)
    b.nodes.append(helper.make_node("MaxPool", [x], ["pool"], name="pool", kernel_shape=[3, 3], strides=[2, 2],
                                    pads=[1, 1, 1, 1]))
    x, cin = "pool", 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        x = b.block(x, cin, cout, stride)
        x = b.block(x, cout, cout, 1)
        cin = cout
    fc_w = RNG.normal(0, np.sqrt(1 / 512), (1000, 512)).astype(np.float32)
    b.inits += [numpy_helper.from_array(fc_w, "fc.w"), numpy_helper.from_array(np.zeros(1000, np.float32), "fc.b")]
    b.nodes += [helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"),
                helper.make_node("Flatten", ["gap"], ["flat"], name="flat"),
                helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="fc", transB=1)]
    graph = helper.make_graph(b.nodes, "resnet18", [helper.make_tensor_value_info("input", 1, ["N", 3, 224, 224])],
                              [helper.make_tensor_value_info("logits", 1, ["N", 1000])], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)

    fp32 = ir.serde.deserialize_model(resnet18())
    calibration = {"input": RNG.uniform(-2, 2, (8, 3, 224, 224)).astype(np.float32)}
    fq = lpt.calibrate(fp32, calibration, quiet=True, bias_correction=False).model
    feeds = {"input": RNG.uniform(-2, 2, (1, 3, 224, 224)).astype(np.float32)}
    result = benchmark(fq, feeds, fp32_model=fp32, threads=args.threads, repeats=args.repeats)
    print(f"ResNet-18 shape, batch 1, 224x224, {args.threads} threads, median of {args.repeats}; "
          f"{machine_line(result.machine)}")
    for engine, ms in result.median_ms.items():
        print(f"  {engine:<18} {ms:8.2f} ms   x{result.ratios()[engine]:.2f} of onnxruntime fp32")
    for engine, why in result.unavailable.items():
        print(f"  {engine:<18} did not run: {why}")
    print("lpt's slowest steps:")
    for step, ms in result.profile[:60]:
        print(f"  {ms:7.2f} ms  {step}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result.to_dict(), f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
