"""Standard ONNX int8 ops as they come, parameters possibly given at run time, on lpt's kernels.

    ConvInteger, MatMulInteger                      exact int32 accumulators
    QLinearConv, QLinearMatMul                      ONNX's own requantization (lpt.kernels.qlinear_output)
    QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear     lpt.numerics (onnxruntime's arithmetic)

lpt's own graphs reach these only where a chain in lpt.backend.int8_steps does not fit; a model
exported as standard ONNX int8 (or ONNX's node test models) runs here as it is, weights and all
parameters as inputs, packed on every call. A dynamically quantized model (quantize_dynamic's
DynamicQuantizeLinear, then ConvInteger / MatMulInteger with constant weights) runs these three on
the native engine where it is built: the same integers, the source's zero point given at each run.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from lpt import kernels
from lpt.backend.step import Step
from lpt.graph.constants import const_array
from lpt.graph.ops import attribute
from lpt.kernels.conv import with_src_zero_point
from lpt.kernels.window import Window
from lpt.numerics import dequantize_linear, dynamic_quantize_linear, quantize_linear

_OPS = ("ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul", "QuantizeLinear", "DequantizeLinear",
        "DynamicQuantizeLinear")
_INTEGERS = (ir.DataType.UINT8, ir.DataType.INT8)
KERNELS = "lpt kernels"  # how reports name lpt's NumPy/MLAS kernels computing one of these products


def _optional_constant(node: ir.Node, index: int):
    """Input `index` as an array: zeros where it is absent, None where it is computed at run time."""
    if len(node.inputs) <= index or node.inputs[index] is None:
        return np.zeros((), np.int32)
    return const_array(node.inputs[index])


def _zero(value):
    return np.zeros((), np.int32) if value is None else value


def convolution_window(node: ir.Node) -> dict:
    """A ConvInteger's or QLinearConv's groups, strides, dilations, pads and auto_pad, as kernels.pack_conv takes
    them."""
    return dict(groups=attribute(node, "group", 1), strides=attribute(node, "strides"),
                dilations=attribute(node, "dilations"), pads=attribute(node, "pads"),
                auto_pad=attribute(node, "auto_pad", "NOTSET"))


def _runner(node: ir.Node, threads: int, native: bool):
    """run(*inputs) -> outputs for the op; its `engine` attribute names what computes a product (a
    ConvInteger's or MatMulInteger's) where it is one."""
    window = convolution_window(node)
    op = node.op_type
    if op == "ConvInteger":
        weights, weight_zp = const_array(node.inputs[1]), _optional_constant(node, 3)
        if weights is not None and weight_zp is not None:  # packed once; the source zero point may change per run
            packed = kernels.pack_conv(weights, weight_zp, 0, **window, threads=threads)

            def on_kernels(x, w, x_zp=None, w_zp=None):
                return [kernels.conv_accumulate(x, with_src_zero_point(packed, int(_zero(x_zp)))).astype(np.int32)]

            on_kernels.engine = f"MLAS ({packed.int8_gemm.route})" if packed.int8_gemm is not None else "numpy"
            return (native and _native_conv_integer(weights, weight_zp, window, threads, on_kernels)) or on_kernels

        def packed_each_run(x, w, x_zp=None, w_zp=None):
            return [kernels.conv_accumulate(x, kernels.pack_conv(w, _zero(w_zp), int(_zero(x_zp)), **window))
                    .astype(np.int32)]

        packed_each_run.engine = KERNELS
        return packed_each_run
    if op == "MatMulInteger":
        def on_kernels(a, b, a_zp=None, b_zp=None):
            return [kernels.matmul_accumulate(a, _zero(a_zp), b, _zero(b_zp)).astype(np.int32)]

        on_kernels.engine = KERNELS
        return (native and _native_matmul_integer(node, threads, on_kernels)) or on_kernels
    if op in ("QLinearConv", "QLinearMatMul"):
        def run(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias=None):
            info = np.iinfo(y_zp.dtype)
            multiplier = kernels.qlinear_multiplier(x_scale, w_scale, y_scale)
            if op == "QLinearConv":
                acc = kernels.conv_accumulate(x, kernels.pack_conv(w, w_zp, int(x_zp), **window))
                return [kernels.qlinear_output(acc, multiplier, y_zp, int(info.min), int(info.max), bias=bias)]
            acc = kernels.matmul_accumulate(x, x_zp, w, w_zp)
            return [kernels.qlinear_output(acc, multiplier, y_zp, int(info.min), int(info.max), axis=-1)]

        run.engine = KERNELS
        return run
    axis, block_size = attribute(node, "axis", 1), attribute(node, "block_size", 0)
    if op == "QuantizeLinear":
        output_dtype = attribute(node, "output_dtype")
        dtype = ir.DataType(output_dtype).numpy() if output_dtype else None
        return lambda x, scale, zp=None: [quantize_linear(x, scale, zp, axis=axis, block_size=block_size,
                                                          output_dtype=dtype)]
    if op == "DequantizeLinear":
        return lambda q, scale, zp=None: [dequantize_linear(q, scale, zp, axis=axis, block_size=block_size)]
    return (native and _native_dynamic_quantize(threads)) or (lambda x: list(dynamic_quantize_linear(x)))


def _native_dynamic_quantize(threads: int):
    """DynamicQuantizeLinear on the native engine (the same integers, scale and zero point), or None."""
    from lpt import native

    if not native.available():
        return None

    def run(x):
        if np.asarray(x).dtype != np.float32:
            return list(dynamic_quantize_linear(x))
        return list(native.dynamic_quantize(x, threads))

    return run


# Weights less their zero point that leave int8 are added back one by one (Residuals); past this
# many, lpt's kernels run the op. quantize_dynamic's u8 weights around a zero point leave it only at
# their extremes: 1 to 3 values per layer in ddddocr_common_old_dynq (w − zw down to −178, up to 161).
MAX_RESIDUALS = 64


class Residuals:
    """w − zw as int8 weights for the native engine, clipped to [−128, 127], and the few values the
    clip changed, (index, w − zw − clipped), to add back: the product stays exact."""

    def __init__(self, shifted: np.ndarray):
        clipped = np.clip(shifted, -128, 127)
        self.weights = clipped.astype(np.int8)
        left = shifted - clipped
        self.entries = [(tuple(int(i) for i in index), int(left[tuple(index)])) for index in np.argwhere(left)]

    def fits(self) -> bool:
        return len(self.entries) <= MAX_RESIDUALS


class NativeMatMulInteger:
    """MatMulInteger with constant weights [K, N] (a dynamically quantized model's) on lpt's native engine: the
    MatMul of w − zw (Residuals) and the values it adds back, one column each."""

    def __init__(self, matmul, shifted: Residuals):
        self.native, self.shifted = matmul, shifted  # native: the lpt.native MatMul

    @classmethod
    def make(cls, weights: np.ndarray, weight_zp: np.ndarray, threads: int):
        """The operation, or None where the engine does not take it."""
        from lpt import native

        if not native.available() or weights.ndim != 2 or np.ndim(weight_zp) > 1:
            return None
        shifted = Residuals(weights.astype(np.int32) - weight_zp.astype(np.int32))
        if not shifted.fits():
            return None
        try:
            return cls(native.MatMul(shifted.weights, threads=threads), shifted)
        except native.Unsupported:
            return None

    def accumulate(self, a: np.ndarray, zero_point: int) -> np.ndarray:
        acc = self.native.accumulate(a, src_zero_point=zero_point)
        for (k, n), value in self.shifted.entries:
            acc[..., n] += value * (a[..., k].astype(np.int32) - zero_point)
        return acc

    def residual_entries(self) -> list[int]:
        """The values added back as the engine's dynamic_layer takes them: (row of the weights, column, value)
        each, one after the other."""
        return [v for (k, n), value in self.shifted.entries for v in (k, n, value)]


def _native_matmul_integer(node: ir.Node, threads: int, on_kernels):
    """MatMulInteger with constant weights on lpt's native engine (NativeMatMulInteger), or None. The engine takes
    the source zero point, which DynamicQuantizeLinear gives at run time, at each run."""
    from lpt import native

    weights, weight_zp = const_array(node.inputs[1]), _optional_constant(node, 3)
    if weights is None or weight_zp is None:
        return None
    matmul_integer = NativeMatMulInteger.make(weights, weight_zp, threads)
    if matmul_integer is None:
        return None

    def run(a, b, a_zp=None, b_zp=None):
        source_zp = _zero(a_zp)
        if np.size(source_zp) != 1 or np.asarray(a).ndim < 1:  # a zero point per row: lpt's kernels
            return on_kernels(a, b, a_zp, b_zp)
        return [matmul_integer.accumulate(a, int(np.reshape(source_zp, ())))]

    run.engine = native.engine_name(matmul_integer.native.route)
    return run


class NativeConvInteger:
    """ConvInteger with constant weights on lpt's native engine: the Conv of w − zw (Residuals) and the values it
    adds back, each one pass over an output channel where its tap meets the source (the padding holds the
    source's zero point, as in ONNX's ConvInteger: it adds nothing)."""

    def __init__(self, conv, shifted: Residuals, geometry: Window, per_group_in: int, per_group_out: int):
        self.native, self.shifted, self.geometry = conv, shifted, geometry  # native: the lpt.native Conv
        self.per_group_in, self.per_group_out = per_group_in, per_group_out

    @classmethod
    def make(cls, weights: np.ndarray, weight_zp: np.ndarray, window: dict, threads: int):
        """The operation, or None where the engine does not take it."""
        from lpt import native

        if not native.available() or np.ndim(weight_zp) > 1 or not 3 <= weights.ndim <= 5:
            return None
        geometry = Window.of(weights.shape[2:], window["strides"], window["dilations"], window["pads"],
                             window["auto_pad"]).with_fixed_pads()
        if geometry is None:
            return None
        zero_points = np.reshape(weight_zp, (-1,) + (1,) * (weights.ndim - 1)).astype(np.int32)
        shifted = Residuals(weights.astype(np.int32) - zero_points)
        if not shifted.fits():
            return None
        try:
            conv = native.Conv(shifted.weights, groups=window["groups"], strides=geometry.strides,
                               dilations=geometry.dilations, pads=geometry.pads, threads=threads)
        except native.Unsupported:
            return None
        return cls(conv, shifted, geometry, weights.shape[1], weights.shape[0] // window["groups"])

    def source_channel(self, oc: int, ic: int) -> int:
        return oc // self.per_group_out * self.per_group_in + ic

    def accumulate(self, x: np.ndarray, zero_point: int) -> np.ndarray:
        acc = self.native.accumulate(x, src_zero_point=zero_point)
        for (oc, ic, *tap), value in self.shifted.entries:
            region = _tap_region(tap, self.geometry, x.shape[2:], acc.shape[2:])
            if region is not None:
                outputs, sources = region
                acc[(slice(None), oc) + outputs] += value * (x[(slice(None), self.source_channel(oc, ic)) + sources]
                                                             .astype(np.int32) - zero_point)
        return acc

    def residual_entries(self) -> list[int]:
        """The values added back as the engine's dynamic_layer takes them: (output channel, source channel,
        tap…, value) each, one after the other."""
        return [v for (oc, ic, *tap), value in self.shifted.entries
                for v in (oc, self.source_channel(oc, ic), *tap, value)]


def _native_conv_integer(weights: np.ndarray, weight_zp: np.ndarray, window: dict, threads: int, on_kernels):
    """ConvInteger with constant weights on lpt's native engine (NativeConvInteger), or None."""
    from lpt import native

    conv_integer = NativeConvInteger.make(weights, weight_zp, window, threads)
    if conv_integer is None:
        return None

    def run(x, w, x_zp=None, w_zp=None):
        return [conv_integer.accumulate(x, int(np.reshape(_zero(x_zp), ())))]

    run.engine = native.engine_name(conv_integer.native.route)
    return run


def _tap_region(tap, geometry: Window, in_shape, out_shape) -> tuple[tuple, tuple] | None:
    """(output slices, source slices) where kernel position `tap` reads the source, not its padding; None
    where it reads only padding. Output o reads source o·stride + tap·dilation − pad_begin."""
    outputs, sources = [], []
    for k, d, s, begin, size, count in zip(tap, geometry.dilations, geometry.strides, geometry.pads, in_shape,
                                           out_shape):
        offset = k * d - begin
        first = max(0, -(offset // s))  # ⌈−offset / s⌉
        last = min(count, (size - 1 - offset) // s + 1) if size - 1 - offset >= 0 else 0
        if last <= first:
            return None
        outputs.append(slice(first, last))
        sources.append(slice(first * s + offset, (last - 1) * s + offset + 1, s))
    return tuple(outputs), tuple(sources)


def try_onnx_int8_step(node: ir.Node, threads: int = 0, native: bool = True) -> tuple[Step, list[ir.Node]] | None:
    """A kernel step for a standard int8 op, or None (unknown op, or a type the kernels do not take). With
    `native`, a dynamically quantized model's ops run on the native engine where it is built."""
    if node.op_type not in _OPS or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type in ("ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul") and any(
            v is not None and v.dtype is not None and v.dtype.is_integer() and v.dtype not in _INTEGERS
            for v in (node.inputs[0], node.inputs[1 if "Integer" in node.op_type else 3])):
        return None
    names = [v.name if v is not None else "" for v in node.inputs]
    run = _runner(node, threads, native)
    present = [i for i, name in enumerate(names) if name]

    def call(*arrays):
        arguments = [None] * len(names)
        for index, array in zip(present, arrays):
            arguments[index] = array
        return run(*arguments)

    step = Step(call, tuple(names[i] for i in present), tuple(v.name for v in node.outputs), (node.name,),
                (node.op_type,), "int8 kernel", engine=getattr(run, "engine", ""))
    return step, [node]
