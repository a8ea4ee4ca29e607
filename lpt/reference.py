"""Run any model lpt reads, FakeQuantize nodes included, with ONNX's reference evaluator.

Slow but obvious: this is the float simulation that lpt's normalization and transformations
are checked against where onnxruntime cannot run the model (lpt's or OpenVINO's FakeQuantize).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_dequantize_linear import DequantizeLinear_25

from lpt.graph.fake_quantize_op import DOMAIN, OPENVINO_DOMAIN, FakeQuantize
from lpt.kernels.conv_transpose import conv_transpose_accumulate
from lpt.numerics import fake_quantize_levels
from lpt.numerics.levels import level_range


def _run_fake_quantize(self, x, input_low, input_high, output_low, output_high, scale=None, zero_point=None,
                       levels=None, axis=None):
    if scale is not None:
        fq = FakeQuantize(input_low, input_high, output_low, output_high, levels, scale, zero_point,
                          1 if axis is None else axis)
    else:
        fq = FakeQuantize(input_low, input_high, output_low, output_high, levels)
    return (fq.apply(x),)


def _run_quantize(self, x, input_low, input_high, levels=None, to=None):
    signed = ir.DataType(to) == ir.DataType.INT8
    qmin, _ = level_range(levels, signed)
    q = fake_quantize_levels(x, input_low, input_high, levels).astype(np.int32) + qmin
    return (q.astype(np.int8 if signed else np.uint8),)


def _run_conv_transpose_integer(self, x, w, x_zero_point=None, w_zero_point=None, group=None, strides=None,
                                dilations=None, pads=None, output_padding=None, kernel_shape=None, auto_pad=None):
    acc = conv_transpose_accumulate(x, w, 0 if x_zero_point is None else int(x_zero_point),
                                    0 if w_zero_point is None else w_zero_point, group or 1, strides, dilations, pads,
                                    output_padding)
    return (acc.astype(np.int32),)


CUSTOM_OPS = [type("FakeQuantize", (OpRun,), {"op_domain": domain, "_run": _run_fake_quantize})
        for domain in (DOMAIN, OPENVINO_DOMAIN)]
CUSTOM_OPS.append(type("Quantize", (OpRun,), {"op_domain": DOMAIN, "_run": _run_quantize}))
# ONNX's evaluator implements DequantizeLinear from opset 19 on only; every earlier version is a
# subset of the latest (8-bit types, per tensor or per axis), which then serves them all.
CUSTOM_OPS.append(type("DequantizeLinear", (DequantizeLinear_25,), {"op_domain": ""}))
CUSTOM_OPS.append(type("ConvTransposeInteger", (OpRun,), {"op_domain": DOMAIN, "_run": _run_conv_transpose_integer}))


def run_reference(model: ir.Model | onnx.ModelProto, feeds: dict[str, np.ndarray],
                  outputs: list[str] | None = None) -> dict[str, np.ndarray]:
    """Outputs (by name) of `model` on `feeds`, FakeQuantize nodes evaluated with their own semantics."""
    proto = model if isinstance(model, onnx.ModelProto) else ir.serde.serialize_model(model)
    evaluator = ReferenceEvaluator(proto, new_ops=CUSTOM_OPS)
    names = outputs or [o.name for o in proto.graph.output]
    return dict(zip(names, evaluator.run(names, feeds)))
