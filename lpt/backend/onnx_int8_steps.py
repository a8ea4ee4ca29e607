"""Standard ONNX int8 ops as they come, parameters possibly given at run time, on lpt's kernels.

    ConvInteger, MatMulInteger                      exact int32 accumulators
    QLinearConv, QLinearMatMul                      ONNX's own requantization (lpt.kernels.qlinear_output)
    QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear     lpt.numerics (onnxruntime's arithmetic)

lpt's own graphs reach these only where a chain in lpt.backend.int8_steps does not fit; a model
exported as standard ONNX int8 (or ONNX's node test models) runs here as it is, weights and all
parameters as inputs, packed on every call.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from lpt import kernels
from lpt.backend.step import Step
from lpt.graph.constants import const_array
from lpt.graph.ops import attribute
from lpt.kernels.conv import with_src_zero_point
from lpt.numerics import dequantize_linear, dynamic_quantize_linear, quantize_linear

_OPS = ("ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul", "QuantizeLinear", "DequantizeLinear",
        "DynamicQuantizeLinear")
_INTEGERS = (ir.DataType.UINT8, ir.DataType.INT8)


def _optional_constant(node: ir.Node, index: int):
    """Input `index` as an array: zeros where it is absent, None where it is computed at run time."""
    if len(node.inputs) <= index or node.inputs[index] is None:
        return np.zeros((), np.int32)
    return const_array(node.inputs[index])


def _zero(value):
    return np.zeros((), np.int32) if value is None else value


def _runner(node: ir.Node):
    window = dict(groups=attribute(node, "group", 1), strides=attribute(node, "strides"), dilations=attribute(node, "dilations"),
                  pads=attribute(node, "pads"), auto_pad=attribute(node, "auto_pad", "NOTSET"))
    op = node.op_type
    if op == "ConvInteger":
        weights, weight_zp = const_array(node.inputs[1]), _optional_constant(node, 3)
        if weights is not None and weight_zp is not None:  # packed once; the source zero point may change per run
            packed = kernels.pack_conv(weights, weight_zp, 0, **window)
            return lambda x, w, x_zp=None, w_zp=None: [kernels.conv_accumulate(
                x, with_src_zero_point(packed, int(_zero(x_zp)))).astype(np.int32)]
        return lambda x, w, x_zp=None, w_zp=None: [
            kernels.conv_accumulate(x, kernels.pack_conv(w, _zero(w_zp), int(_zero(x_zp)), **window)).astype(np.int32)]
    if op == "MatMulInteger":
        def on_kernels(a, b, a_zp=None, b_zp=None):
            return [kernels.matmul_accumulate(a, _zero(a_zp), b, _zero(b_zp)).astype(np.int32)]

        return _native_matmul_integer(node, on_kernels) or on_kernels
    if op in ("QLinearConv", "QLinearMatMul"):
        def run(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias=None):
            info = np.iinfo(y_zp.dtype)
            multiplier = kernels.qlinear_multiplier(x_scale, w_scale, y_scale)
            if op == "QLinearConv":
                acc = kernels.conv_accumulate(x, kernels.pack_conv(w, w_zp, int(x_zp), **window))
                return [kernels.qlinear_output(acc, multiplier, y_zp, int(info.min), int(info.max), bias=bias)]
            acc = kernels.matmul_accumulate(x, x_zp, w, w_zp)
            return [kernels.qlinear_output(acc, multiplier, y_zp, int(info.min), int(info.max), axis=-1)]
        return run
    axis, block_size = attribute(node, "axis", 1), attribute(node, "block_size", 0)
    if op == "QuantizeLinear":
        output_dtype = attribute(node, "output_dtype")
        dtype = ir.DataType(output_dtype).numpy() if output_dtype else None
        return lambda x, scale, zp=None: [quantize_linear(x, scale, zp, axis=axis, block_size=block_size,
                                                          output_dtype=dtype)]
    if op == "DequantizeLinear":
        return lambda q, scale, zp=None: [dequantize_linear(q, scale, zp, axis=axis, block_size=block_size)]
    return lambda x: list(dynamic_quantize_linear(x))


def _native_matmul_integer(node: ir.Node, on_kernels):
    """MatMulInteger with constant weights (a dynamically quantized model's) on lpt's native engine, or None.

    The weights less their zero point are int8 (quantize_dynamic's and lpt's u8 weights around 128
    are), so the engine computes Σ a·(w − zw) once per run, and the source zero point, which
    DynamicQuantizeLinear gives at run time, comes off as za·Σ_k (w − zw) per column: exact integers."""
    from lpt import native

    weights, weight_zp = const_array(node.inputs[1]), _optional_constant(node, 3)
    if not native.available() or weights is None or weight_zp is None or weights.ndim != 2 or np.ndim(weight_zp) > 1:
        return None
    shifted = weights.astype(np.int32) - weight_zp.astype(np.int32)
    if shifted.min(initial=0) < -128 or shifted.max(initial=0) > 127:
        return None
    try:
        matmul = native.MatMul(shifted.astype(np.int8))
    except native.Unsupported:
        return None
    column_sums = shifted.sum(axis=0, dtype=np.int64)

    def run(a, b, a_zp=None, b_zp=None):
        source_zp = _zero(a_zp)
        if np.size(source_zp) != 1 or np.asarray(a).ndim < 1:  # a zero point per row: lpt's kernels
            return on_kernels(a, b, a_zp, b_zp)
        acc = matmul.accumulate(a)
        if int(source_zp):
            acc = (acc - int(source_zp) * column_sums).astype(np.int32)
        return [acc]

    run.engine = native.engine_name(matmul.route)
    return run


def try_onnx_int8_step(node: ir.Node) -> tuple[Step, list[ir.Node]] | None:
    """A kernel step for a standard int8 op, or None (unknown op, or a type the kernels do not take)."""
    if node.op_type not in _OPS or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type in ("ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul") and any(
            v is not None and v.dtype is not None and v.dtype.is_integer() and v.dtype not in _INTEGERS
            for v in (node.inputs[0], node.inputs[1 if "Integer" in node.op_type else 3])):
        return None
    names = [v.name if v is not None else "" for v in node.inputs]
    run = _runner(node)
    present = [i for i, name in enumerate(names) if name]

    def call(*arrays):
        arguments = [None] * len(names)
        for index, array in zip(present, arrays):
            arguments[index] = array
        return run(*arguments)

    step = Step(call, tuple(names[i] for i in present), tuple(v.name for v in node.outputs), (node.name,),
                (node.op_type,), "int8 kernel", engine=getattr(run, "engine", ""))
    return step, [node]
