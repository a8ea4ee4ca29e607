"""The int8 chains the backend runs on lpt's kernels, each prepared once into a Step.

    ConvInteger|lpt::ConvTransposeInteger|MatMulInteger → Cast → Mul(m) [→ Add(bias)] [→ Relu|Clip|Sigmoid]*
        [→ QuantizeLinear|lpt::Quantize]
        one kernel call: weights packed and compensation precomputed here, then the oneDNN
        output stage (f32 dequantization, bias, post-ops, destination quantization);
    QuantizeLinear, lpt::Quantize                     quantize kernels (f32 → u8/i8);
    Cast → [Sub] → Mul [→ QuantizeLinear]             dequantize (the graph's own f32 operations),
                                                      and requantize when a quantize follows;
    Cast → [Sub] → Mul → AveragePool|GlobalAveragePool → QuantizeLinear
                                                      integer average (exact half-to-even, see
                                                      lpt.kernels.pooling), rescaled to the output;
    MaxPool, Relu, Max(zero point), Clip on integers  integer kernels;
    Flatten, Reshape, Transpose, (Un)Squeeze          views and copies of the integers;
    Add|Mul|Concat of dequantized branches [→ Relu] → QuantizeLinear|lpt::Quantize
                                                      argument scaling: each branch dequantized
                                                      with its own scale, joined, requantized
                                                      (Add|Mul without a quantize: to f32).
The float32 ops between such steps are lpt.backend.float_steps'.

Every step computes the same f32 operations, in the same order, as the ONNX nodes it replaces,
so a plan and onnxruntime running the same int8 graph agree bit for bit (see the tests) — except
the integer average, which rounds once where the graph rounds twice (at most 1 LSB apart).
"""

from __future__ import annotations

from functools import partial

import logging
import math

import numpy as np
import onnx_ir as ir

from lpt import kernels
from lpt.backend.chains import (INTEGER_TYPES, only_consumer, optional_constant, quantized_next, read_one_hot,
                                read_int8_layer, read_quantization)
from lpt.backend.emulation import saturating_layer_function
from lpt.backend.step import Int8Layer, Step
from lpt.errors import DataError
from lpt.graph.constants import const_array
from lpt.graph.ops import attribute
from lpt.kernels.quantize import integer_container
from lpt.transformations.dequantization import Dequantization

_POOLS = ("AveragePool", "GlobalAveragePool")
logger = logging.getLogger(__name__)


def _step(run, inputs, nodes, outputs=None, layer: Int8Layer | None = None, engine: str = "",
          native: tuple | None = None, backend: str = "int8 kernel") -> tuple[Step, list[ir.Node]]:
    outputs = outputs or [nodes[-1].outputs[0]]
    return (Step(run, tuple(v.name for v in inputs), tuple(v.name for v in outputs), tuple(n.name for n in nodes),
                 tuple(n.op_type for n in nodes), backend, layer, engine, native), nodes)


def try_int8_step(node: ir.Node, threads: int = 0, native: bool = True,
                  emulate: str | None = None) -> tuple[Step, list[ir.Node]] | None:
    """A kernel step starting at `node` and the nodes it covers, or None (the node falls back).

    `threads` is for the integer GEMM (0: one per core). With `native`, int8 layers run on lpt's
    native engine where it takes them (lpt.native), else on lpt's NumPy/MLAS kernels. With
    `emulate` ("avx2"), layers that CPU's kernels saturate compute as they do (lpt.backend.emulation).
    """
    if node.domain not in ("", "ai.onnx", "lpt"):
        return None
    integer_input = node.inputs and node.inputs[0] is not None and node.inputs[0].dtype in INTEGER_TYPES
    if (chain := read_int8_layer(node)) is not None:
        layer = chain[0]
        emulated = None
        if emulate is not None:  # the exact accumulator from lpt's kernels, then the CPU's saturation
            emulated = saturating_layer_function(layer, partial(accumulator_function, threads=threads), emulate)
        run, engine = emulated or (native_layer_function(layer, threads) if native else (None, ""))
        if run is None:
            run, engine = layer_function(layer, threads)
        return None if run is None else _step(run, _runtime_inputs(node, layer), chain[1], layer=layer, engine=engine,
                                              native=getattr(run, "instruction", None))
    if (node.op_type, node.domain) in (("QuantizeLinear", ""), ("QuantizeLinear", "ai.onnx"), ("Quantize", "lpt")):
        return _quantize(node)
    if node.op_type == "Cast" and node.inputs[0].dtype in INTEGER_TYPES + (ir.DataType.INT32,):
        return _dequantize(node)
    if integer_input and node.op_type in ("MaxPool", "Relu", "Max", "Clip", "Flatten", *LAYOUT_OPS):
        return _integer_op(node)
    if integer_input and node.op_type == "Pad":
        return pad_step(node)
    return None


def try_join_step(node: ir.Node) -> tuple[Step, list[ir.Node]] | None:
    """Add, Mul or Concat of dequantized 8-bit branches followed by a quantize: one step from integers to integers.

    An Add or Mul that no quantize follows (a residual block's last Add before a global pool, say)
    is a step from integers to float32, the same operations as the nodes it covers."""
    if node.op_type not in ("Add", "Mul", "Concat") or node.domain not in ("", "ai.onnx"):
        return None
    branches = []
    for value in node.inputs:
        dq = Dequantization.of(value)
        if dq is None or dq.data.dtype not in INTEGER_TYPES or len(list(value.consumers())) != 1 or value.is_graph_output():
            return None
        branches.append(dq)
    if len(branches) < 2:
        return None
    nodes, last = [n for dq in branches for n in dq.nodes] + [node], node
    relu = only_consumer(node.outputs[0], ("Relu",))
    if relu is not None:
        nodes.append(relu)
        last = relu
    destination = quantized_next(last.outputs[0])
    if destination is None and node.op_type == "Concat":
        return None
    quantization = destination[1] if destination is not None else None
    if destination is not None:
        nodes.append(destination[0])
    parameters = [(dq.scale, dq.shift) for dq in branches]
    axis = attribute(node, "axis", 0)
    # the quantize inside join_q, in one pass where it can
    fused = quantization.output_stage_destination() if quantization is not None else None

    def run(*integers):
        if node.op_type == "Concat":
            parts = [kernels.dequantize_shifted(q, shift, scale) for q, (scale, shift) in zip(integers, parameters)]
            x = np.concatenate(parts, axis=axis)
            return [quantization.quantize(np.maximum(x, np.float32(0), out=x) if relu is not None else x, in_place=True)]
        (scale1, shift1), (scale2, shift2) = parameters
        joined = kernels.join_q(node.op_type == "Mul", integers[0], shift1, scale1, integers[1], shift2, scale2,
                                relu is not None, **(fused or {}))
        return [joined if fused or quantization is None else quantization.quantize(joined, in_place=True)]

    instruction = None
    to_float = quantization is None
    if node.op_type != "Concat" and (to_float or fused is not None) and all(
            np.size(p) == 1 for pair in parameters for p in pair if p is not None) and (to_float or np.dtype(
            integer_container(quantization.qmin, quantization.qmax)).itemsize == 1):
        (scale1, shift1), (scale2, shift2) = [(float(np.reshape(s, ())), 0.0 if z is None else float(np.reshape(z, ())))
                                              for s, z in parameters]
        to = None if to_float else (float(quantization.scale.reshape(())), int(quantization.zero_point.reshape(())),
                                    quantization.qmin, quantization.qmax, quantization.qmin < 0)
        instruction = ("join", (node.op_type == "Mul", shift1, scale1, shift2, scale2, relu is not None, to))
    return _step(run, [dq.data for dq in branches], nodes, native=instruction)


def _runtime_inputs(node: ir.Node, layer: Int8Layer) -> list[ir.Value]:
    """What the layer reads at run time: the source, and a matmul's right-hand side when it is not constant."""
    return [node.inputs[0]] + ([node.inputs[1]] if layer.weights is None else [])


def native_layer_function(layer: Int8Layer, threads: int = 0):
    """(run, engine) for an Int8Layer on lpt's native engine, or (None, "") where it does not take the layer."""
    from lpt import native

    if not native.available() or layer.multiplier is None:
        return None, ""
    upsampling = _upsampling(layer) if layer.op == "conv_transpose" else None
    if layer.op == "conv_transpose" and upsampling is None:
        return None, ""
    destination = layer.destination
    if destination is not None and not destination.is_per_tensor:
        return None, ""
    # The engine's output stage takes the elementwise post-ops; from the first other post-op on (a Sum, a
    # FakeQuantize), the step finishes in numpy on the engine's f32 values, as kernels.output_stage does.
    first_other = next((i for i, op in enumerate(layer.post_ops) if not isinstance(op, kernels.ELEMENTWISE_POST_OPS)),
                       len(layer.post_ops))
    in_engine, tail = layer.post_ops[:first_other], layer.post_ops[first_other:]
    stage = dict(multiplier=layer.multiplier, bias=layer.bias, post_ops=in_engine, threads=threads)
    if destination is not None and not tail:
        stage.update(dst_scale=destination.scale, dst_zero_point=destination.zero_point, qmin=destination.qmin,
                     qmax=destination.qmax, dst_dtype=destination.zero_point.dtype)
    if tail and layer.weights is None:
        return None, ""
    if layer.weights is None:
        return _native_product(layer, stage, threads)
    stage.update(src_zero_point=int(layer.src_zero_point), weight_zero_point=layer.weight_zero_point)
    try:
        if upsampling is not None:
            operation = _NativeUpsampling(layer, stage, *upsampling)
        elif layer.op == "conv":
            window = kernels.Window.of(layer.weights.shape[2:], layer.attribute("strides"), layer.attribute("dilations"),
                                       layer.attribute("pads"), layer.attribute("auto_pad", "NOTSET")).with_fixed_pads()
            if window is None:  # SAME_* with a stride: pads the input's size decides
                return None, ""
            operation = native.Conv(layer.weights, groups=layer.attribute("group", 1), strides=window.strides,
                                    dilations=window.dilations, pads=window.pads, **stage)
        else:
            operation = native.MatMul(layer.weights, **stage)
    except native.Unsupported as why:
        logger.debug("%s layer stays on lpt's kernels: %s", layer.op, why)
        return None, ""

    if tail:
        def run(x):
            out = operation(x)
            for op in tail:
                out = op.apply(out)
            return [out if destination is None else destination.quantize(out, in_place=True)]

        return run, native.engine_name(operation.route)

    def run(x):
        return [operation(x)]

    run.instruction = operation.instruction  # for lpt.backend.native_program (None: not a program's)
    return run, native.engine_name(operation.route)


def _upsampling(layer: Int8Layer) -> tuple[int, int] | None:
    """(kernel_h, kernel_w) of a 2-D ConvTranspose whose stride is its kernel, with no dilation, pads,
    output padding or groups (a decoder's 2×2 upsampling), else None. Each output pixel then reads
    exactly one input pixel: the layer is a matmul of every pixel's channels with the weights as
    [C_in, C_out·kh·kw], its outputs laid out again as [C_out, H·kh, W·kw]."""
    kernel = tuple(layer.weights.shape[2:]) if layer.weights is not None else ()
    if len(kernel) != 2 or layer.attribute("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return None
    plain = (tuple(layer.attribute("strides") or (1, 1)) == kernel and layer.attribute("group", 1) == 1
             and all(d == 1 for d in layer.attribute("dilations") or (1, 1))
             and not any(layer.attribute("pads") or ()) and not any(layer.attribute("output_padding") or ())
             and layer.attribute("output_shape") is None)
    return kernel if plain else None


class _NativeUpsampling:
    """A ConvTranspose of _upsampling's kind on the native engine, called as a native operation is: a
    matmul with the output stage per column, its columns [kh][kw][C_out] (each tap's run of output
    channels, which a pixel of the output takes whole), then the layout."""

    def __init__(self, layer: Int8Layer, stage: dict, kernel_h: int, kernel_w: int):
        from lpt import native

        self.c_in, self.c_out = layer.weights.shape[:2]
        self.kernel = (kernel_h, kernel_w)
        taps = kernel_h * kernel_w

        def per_column(values):
            return None if values is None else np.tile(np.broadcast_to(np.asarray(values).reshape(-1), (self.c_out,)),
                                                       taps)

        stage = dict(stage, multiplier=per_column(stage["multiplier"]), bias=per_column(stage["bias"]),
                     weight_zero_point=per_column(stage["weight_zero_point"]))
        columns = layer.weights.transpose(0, 2, 3, 1).reshape(self.c_in, taps * self.c_out)  # [C_in, kh, kw, C_out]
        self.matmul = native.MatMul(np.ascontiguousarray(columns), **stage)
        self.route = self.matmul.route

    @property
    def instruction(self) -> tuple:
        """This upsampling as an instruction of a native program (lpt.native.program)."""
        return ("upsample", (self.matmul.instruction[1], *self.kernel))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        n, _, h, w = x.shape
        (kh, kw), c_out = self.kernel, self.c_out
        out = self.matmul(np.moveaxis(x, 1, -1).reshape(-1, self.c_in))  # [N·H·W, kh·kw·C_out]
        out = out.reshape(n, h, w, kh, kw, c_out).transpose(0, 5, 1, 3, 2, 4)
        return np.ascontiguousarray(out).reshape(n, c_out, h * kh, w * kw)


def accumulator_function(layer: Int8Layer, threads: int = 0):
    """(run, engine) giving an output-stage-free layer's exact int32 accumulators: on the native engine
    where it takes the layer (the emulations of lpt.backend.emulation start from these), else on
    lpt's kernels (layer_function)."""
    from lpt import native

    if native.available() and layer.weights is not None and layer.op in ("conv", "matmul") and np.size(
            layer.src_zero_point) == 1 and layer.attribute("auto_pad", "NOTSET") in ("NOTSET", b"NOTSET"):
        try:
            if layer.op == "conv":
                operation = native.Conv(layer.weights, groups=layer.attribute("group", 1),
                                        strides=layer.attribute("strides"), dilations=layer.attribute("dilations"),
                                        pads=layer.attribute("pads"), src_zero_point=int(layer.src_zero_point),
                                        weight_zero_point=layer.weight_zero_point, threads=threads)
            else:
                operation = native.MatMul(layer.weights, src_zero_point=int(layer.src_zero_point),
                                          weight_zero_point=layer.weight_zero_point, threads=threads)
        except native.Unsupported:
            pass
        else:
            return (lambda x: [operation.accumulate(x)]), native.engine_name(operation.route)
    return layer_function(layer, threads)


def _native_product(layer: Int8Layer, stage: dict, threads: int):
    """A matmul of two activations on the native engine; lpt's kernels where it does not take the operands
    (operands that broadcast, a reduction past int32, ...)."""
    from lpt import native

    try:
        product = native.Product(a_zero_point=layer.src_zero_point, b_zero_point=layer.weight_zero_point, **stage)
    except native.Unsupported as why:
        logger.debug("a product stays on lpt's kernels: %s", why)
        return None, ""
    on_kernels, _ = layer_function(layer, threads)

    def run(a, b):
        try:
            return [product(a, b)]
        except native.Unsupported:
            return on_kernels(a, b)

    run.instruction = product.instruction
    return run, native.PRODUCT_ENGINE


def layer_function(layer: Int8Layer, threads: int = 0):
    """(run(*runtime inputs) -> [output], engine) for an Int8Layer, its weights packed and compensation
    precomputed now; (None, "") where lpt's kernels do not take the layer. The engine is MLAS's
    integer GEMM (its route) where the packing put the product there, else numpy."""
    window = dict(groups=layer.attribute("group", 1), strides=layer.attribute("strides"),
                  dilations=layer.attribute("dilations"), pads=layer.attribute("pads"))
    src_zp, weight_zp = layer.src_zero_point, layer.weight_zero_point
    packed = None
    if layer.op == "conv":
        packed = kernels.pack_conv(layer.weights, weight_zp, int(src_zp), **window, threads=threads,
                                   auto_pad=layer.attribute("auto_pad", "NOTSET"))
        # The output stage reads f32: skip the int32 round trip where exact.
        accumulate = partial(kernels.conv_accumulate, packed=packed, exact_float=layer.multiplier is not None)
    elif layer.op == "conv_transpose":
        if layer.attribute("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
            return None, ""
        accumulate = partial(kernels.conv_transpose_accumulate, weights_q=layer.weights, src_zero_point=int(src_zp),
                             weight_zero_point=weight_zp, output_padding=layer.attribute("output_padding"), **window)
    elif layer.weights is not None:
        packed = kernels.pack_matmul_weights(layer.weights, weight_zp, src_zp, threads=threads)
        accumulate = partial(kernels.matmul_accumulate_packed, packed=packed)
    else:
        def accumulate(a, b):
            return kernels.matmul_accumulate(a, src_zp, b, weight_zp)
    gemm = packed.int8_gemm if packed is not None else None
    engine = f"MLAS ({gemm.route})" if gemm is not None else "numpy"
    if layer.multiplier is None:
        return (lambda *arrays: [accumulate(*arrays)]), engine
    destination = layer.destination
    fused = destination.output_stage_destination() if destination is not None else None  # one pass

    def run(*arrays):
        out = kernels.output_stage(accumulate(*arrays), layer.multiplier, layer.bias, layer.post_ops,
                                   axis=layer.channel_axis, **(fused or {}))
        return [destination.quantize(out, in_place=True) if destination is not None and not fused else out]

    return run, engine


def _quantize(node: ir.Node):
    quantization = read_quantization(node)
    if quantization is None:
        return None
    instruction = None
    if quantization.is_per_tensor and np.dtype(integer_container(quantization.qmin, quantization.qmax)).itemsize == 1:
        instruction = ("quantize", (float(quantization.scale.reshape(())), int(quantization.zero_point.reshape(())),
                                    quantization.qmin, quantization.qmax, quantization.qmin < 0))
    return _step(lambda x: [quantization.quantize(x)], [node.inputs[0]], [node], native=instruction)


def try_one_hot_step(node: ir.Node) -> tuple[Step, list[ir.Node]] | None:
    """A quantized one-hot (chains.read_one_hot) as one step from its first node: 8-bit levels, written once,
    instead of a float32 tensor K times v's size for onnxruntime to compare and cast and lpt to quantize
    (magika's bytes: [N, 2048, 257]). A Dense reading it then sees rows of one value other than its zero
    point, which the engine gathers (lpt.native: a one-hot source)."""
    found = read_one_hot(node)
    if found is None:
        return None
    table, source, expand_shape, quantization, nodes = found
    low, high = (int(q) for q in quantization.quantize(np.array([0.0, 1.0], np.float32)))
    dtype = integer_container(quantization.qmin, quantization.qmax)

    def run(v, shape=None):
        if shape is not None:  # an Expand broadcasts both ways
            v = np.broadcast_to(v, np.broadcast_shapes(np.shape(v), tuple(int(d) for d in np.asarray(shape).reshape(-1))))
        return [kernels.one_hot_levels(v, table, low, high, dtype)]

    inputs = [source] + ([expand_shape] if expand_shape is not None else [])
    return _step(run, inputs, nodes, native=("one_hot", (table.astype(np.int64), low, high, quantization.qmin < 0)))


def _dequantize(node: ir.Node):
    """Cast → [Sub(shift)] → Mul(scale), with what may follow it fused: a quantize or an average pool."""
    nodes, shift = [node], None
    subtract = only_consumer(node.outputs[0], ("Sub",))
    if subtract is not None and (shift := const_array(subtract.inputs[1])) is not None:
        nodes.append(subtract)
    multiply = only_consumer(nodes[-1].outputs[0], ("Mul",))
    scale = const_array(multiply.inputs[1]) if multiply is not None else None
    if scale is None:
        return None
    nodes.append(multiply)
    shift = None if shift is None else shift.astype(np.float32)
    scale = scale.astype(np.float32)
    pool = only_consumer(multiply.outputs[0], _POOLS)
    if pool is not None and (fused := _average_pool(node, nodes + [pool], scale, shift)) is not None:
        return fused
    destination = quantized_next(multiply.outputs[0])
    if destination is not None and _quantizes_back_to_itself(node.inputs[0], shift, scale, destination[1]):
        # onnxruntime's QDQ models write such a pair around a MaxPool or a Reshape: no values change
        return _step(lambda q: [q], [node.inputs[0]], nodes + [destination[0]], native=("identity", None))

    def run(q):
        x = kernels.dequantize_shifted(q, shift, scale)
        return [destination[1].quantize(x, in_place=True) if destination else x]  # x is the step's own

    return _step(run, [node.inputs[0]], nodes + ([destination[0]] if destination else []))


def _quantizes_back_to_itself(source: ir.Value, shift: np.ndarray | None, scale: np.ndarray,
                              quantization) -> bool:
    """Whether quantize(dequantize(q)) is q for every 8-bit q: the same scale and zero point, into q's own
    type. Exactly so: with k = q − zero point (|k| ≤ 255) and a normal scale s, fl(fl(k·s) / s) lies within
    255·2⁻²³ of k, so rint gives k back and nothing saturates."""
    if source.dtype not in (ir.DataType.UINT8, ir.DataType.INT8) or not quantization.is_per_tensor:
        return False
    if scale.size != 1 or (shift is not None and shift.size != 1):
        return False
    s = np.float32(scale.reshape(()))
    info = np.iinfo(source.dtype.numpy())
    return (bool(2.0**-100 <= s <= 2.0**100) and np.float32(quantization.scale.reshape(())) == s
            and float(quantization.zero_point.reshape(())) == (0.0 if shift is None else float(shift.reshape(())))
            and (quantization.qmin, quantization.qmax) == (int(info.min), int(info.max)))


def _average_pool(cast: ir.Node, nodes: list[ir.Node], scale: np.ndarray, shift: np.ndarray | None):
    """The integer average pool: the dequantization's zero point in, the next quantize's scale out."""
    pool = nodes[-1]
    quantize = only_consumer(pool.outputs[0], ("QuantizeLinear",))
    zero_point = np.zeros((), np.int32) if shift is None else shift
    if (quantize is None or scale.size != 1 or np.size(zero_point) != 1 or zero_point != np.round(zero_point)
            or cast.inputs[0].dtype not in INTEGER_TYPES or attribute(pool, "auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET")
            or attribute(pool, "ceil_mode", 0)):
        return None
    out_scale, out_zp = const_array(quantize.inputs[1]), optional_constant(quantize, 2)
    if out_scale is None or out_scale.size != 1 or out_zp is None:
        return None
    info = np.iinfo(out_zp.dtype if out_zp.dtype != np.int32 else np.uint8)
    rescale = dict(multiplier=np.float32(scale.reshape(())) / np.float32(out_scale.reshape(())),
                   out_zero_point=int(out_zp), qmin=int(info.min), qmax=int(info.max))
    zp = int(zero_point)
    if pool.op_type == "GlobalAveragePool":
        run = partial(kernels.global_average_pool_q, zero_point=zp, **rescale)
    else:
        run = partial(kernels.average_pool_q, zero_point=zp, kernel_shape=attribute(pool, "kernel_shape"),
                      strides=attribute(pool, "strides"), pads=attribute(pool, "pads"),
                      count_include_pad=bool(attribute(pool, "count_include_pad", 0)), dilations=attribute(pool, "dilations"),
                      **rescale)
    return _step(lambda q: [run(q)], [cast.inputs[0]], nodes + [quantize])


def _max_pool_instruction(window: kernels.Window) -> tuple | None:
    """A 2-D MaxPool as an instruction of lpt.native's programs; other ranks stay Python steps."""
    if len(window.kernel) != 2:
        return None
    return ("max_pool", (window.kernel, window.strides, window.dilations, window.pads))


LAYOUT_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Gather")


def layout_step(node: ir.Node, backend: str = "int8 kernel") -> tuple[Step, list[ir.Node]] | None:
    """Reshape, Transpose, Squeeze, Unsqueeze, Slice or Gather of a tensor of any type, with constant
    parameters: a view or a copy of its values, as numpy's, and an instruction of lpt.native's programs."""
    x = node.inputs[0]
    if node.op_type == "Slice":
        return slice_step(node, backend)
    if node.op_type == "Gather":
        return gather_step(node, backend)
    if node.op_type == "Transpose":
        perm = attribute(node, "perm")
        if perm is None:
            return None  # the reversed axes: a rank the graph may not say
        return _step(lambda q: [q.transpose(perm)], [x], [node], native=("transpose", tuple(perm)), backend=backend)
    if node.op_type == "Reshape":
        shape, allow_zero = const_array(node.inputs[1]), bool(attribute(node, "allowzero", 0))
        if shape is None:  # computed at run time (ddddocr's before and after its classifier, magika's), read second
            return _step(lambda q, target: [_reshaped(node, q, tuple(int(d) for d in target.reshape(-1)), allow_zero)],
                         [x, node.inputs[1]], [node], native=("reshape", (None, allow_zero)), backend=backend)
        target = tuple(int(d) for d in shape.reshape(-1))
        return _step(lambda q: [_reshaped(node, q, target, allow_zero)], [x], [node],
                     native=("reshape", (target, allow_zero)), backend=backend)
    axes = attribute(node, "axes")  # before opset 13; an input from it on
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = const_array(node.inputs[1])
        if axes is None:
            return None
    if axes is None and node.op_type == "Unsqueeze":
        return None
    axes = () if axes is None else tuple(int(a) for a in np.reshape(axes, -1))
    if node.op_type == "Squeeze":  # without axes (or with none): every axis of 1, as onnxruntime's
        return _step(lambda q: [np.squeeze(q, axis=axes or None)], [x], [node], native=("squeeze", axes), backend=backend)
    return _step(lambda q: [np.expand_dims(q, axes)], [x], [node], native=("unsqueeze", axes), backend=backend)


def slice_step(node: ir.Node, backend: str = "int8 kernel") -> tuple[Step, list[ir.Node]] | None:
    """A Slice whose starts, ends, axes and steps are constants (attributes before opset 10): numpy's basic
    slicing of the ranges ONNX's clamping gives (slice_range), and the native engine's copy of them, a
    view where it takes every value (magika's jax2tf Slices before and after its convolution)."""
    if attribute(node, "starts") is not None:
        values = [attribute(node, "starts"), attribute(node, "ends"), attribute(node, "axes"), None]
    else:
        given = list(node.inputs[1:5]) + [None] * (5 - len(node.inputs))
        values = [None if v is None else const_array(v) for v in given]
        if any(value is None and v is not None for value, v in zip(values, given)):
            return None  # computed at run time: onnxruntime's
    if values[0] is None or values[1] is None:
        return None
    starts, ends = ([int(v) for v in np.reshape(value, -1)] for value in values[:2])
    axes = list(range(len(starts))) if values[2] is None else [int(v) for v in np.reshape(values[2], -1)]
    steps = [1] * len(starts) if values[3] is None else [int(v) for v in np.reshape(values[3], -1)]
    if not len(starts) == len(ends) == len(axes) == len(steps) or any(s == 0 or abs(s) >= 2 ** 62 for s in steps):
        return None  # not a Slice onnxruntime runs either: its error says why

    def cut(q):
        q = np.asarray(q)
        index = [slice(None)] * q.ndim
        for start, end, axis, step in zip(starts, ends, axes, steps):
            if not -q.ndim <= axis < q.ndim:
                raise DataError(f"node {node.name!r} (Slice): axis {axis} of an input of rank {q.ndim}")
            first, count = slice_range(q.shape[axis], start, end, step)
            last = first + count * step
            index[axis] = slice(first, last if last >= 0 else None, step) if count else slice(0, 0)
        return [q[tuple(index)]]

    return _step(cut, [node.inputs[0]], [node], native=("slice", (starts, ends, axes, steps)), backend=backend)


def gather_step(node: ir.Node, backend: str = "int8 kernel") -> tuple[Step, list[ir.Node]] | None:
    """A Gather of one constant index (a scalar) along an axis: that slice of the values, the axis gone, as
    numpy's take; the native engine's slice of one value along the axis, which it drops (plcmos_v2's two
    halves of its GRU's output, an onnxruntime region of their own between two native programs)."""
    if node.inputs[0].dtype not in (ir.DataType.FLOAT, *INTEGER_TYPES):
        return None  # what the engine's slice copies: shape arithmetic's int64 stays where it is
    index = const_array(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if index is None or index.ndim != 0 or index.dtype.kind not in "iu":
        return None
    index, axis = int(index), int(attribute(node, "axis", 0))

    def take(q):
        q = np.asarray(q)
        at = axis + q.ndim if axis < 0 else axis
        if not 0 <= at < q.ndim:
            raise DataError(f"node {node.name!r} (Gather): axis {axis} of an input of rank {q.ndim}")
        if not -q.shape[at] <= index < q.shape[at]:
            raise DataError(f"node {node.name!r} (Gather): index {index} outside [{-q.shape[at]}, {q.shape[at] - 1}]")
        return [np.take(q, index, axis=at)]

    end = index + 1 if index != -1 else 2 ** 63 - 1  # ONNX's Slice clamps an end past the axis
    return _step(take, [node.inputs[0]], [node], native=("slice", ([index], [end], [axis], [1], True)), backend=backend)


def slice_range(dim: int, start: int, end: int, step: int) -> tuple[int, int]:
    """Where ONNX's Slice starts on an axis of `dim` values, and how many it takes: a negative start or end
    counts from the end, and both are clamped to the axis ([0, dim] stepping forward, [−1, dim − 1] back)."""
    start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        return start, max(0, -(-(end - start) // step))
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return start, max(0, -(-(start - end) // -step))


def pad_step(node: ir.Node, backend: str = "int8 kernel") -> tuple[Step, list[ir.Node]] | None:
    """A Pad in constant or reflect mode with constant, non-negative pads (opset 11 and later, without axes): a
    copy inside a border of the constant (a Keras ZeroPadding2D's, before its convolution) or of the values'
    mirror (basic_pitch_nmp's reflection_pad1d before each octave of its CQT), of any type."""
    mode = attribute(node, "mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("constant", "reflect") or len(node.inputs) < 2 or \
            node.inputs[1] is None or (len(node.inputs) > 3 and node.inputs[3] is not None):
        return None
    pads = const_array(node.inputs[1])
    value = np.zeros(()) if len(node.inputs) < 3 or node.inputs[2] is None else const_array(node.inputs[2])
    if pads is None or value is None or value.size != 1 or np.any(pads < 0) or pads.size % 2:
        return None
    rank = pads.size // 2
    widths = tuple((int(pads[i]), int(pads[i + rank])) for i in range(rank))
    fill = value.reshape(())

    def pad(q):
        q = np.asarray(q)
        if q.ndim != rank:
            raise DataError(f"node {node.name!r} (Pad): {rank * 2} pads for an input of rank {q.ndim}")
        if mode == "reflect":
            if any(max(w) >= d and any(w) for w, d in zip(widths, q.shape)):
                raise DataError(f"node {node.name!r} (Pad): reflect pads {widths} reach past the edge of an input "
                                f"of shape {q.shape} (each must be below its axis' length)")
            return [np.pad(q, widths, mode="reflect")]
        return [np.pad(q, widths, constant_values=fill.astype(q.dtype))]

    parameters = (tuple(int(p) for p in pads), float(fill)) + (("reflect",) if mode == "reflect" else ())
    return _step(pad, [node.inputs[0]], [node], native=("pad", parameters), backend=backend)


def _reshaped(node: ir.Node, q: np.ndarray, target: tuple, allow_zero: bool) -> np.ndarray:
    dims = onnx_reshape_dims(q.shape, target, allow_zero)
    try:
        return q.reshape(dims)
    except ValueError:
        raise DataError(f"node {node.name!r} (Reshape): an input of shape {q.shape} cannot take the shape "
                        f"{dims}") from None


def onnx_reshape_dims(shape: tuple, target: tuple, allow_zero: bool) -> tuple:
    """ONNX Reshape's target: 0 copies the input's dimension there (unless `allow_zero`), −1 is inferred (numpy does)."""
    return tuple(shape[i] if d == 0 and not allow_zero else d for i, d in enumerate(target))


def max_pool_step(node: ir.Node, backend: str = "int8 kernel") -> tuple[Step, list[ir.Node]] | None:
    """A MaxPool of 8-bit or float32 values (kernels.max_pool_q), or None where it has ceil_mode or its
    indices are read."""
    if attribute(node, "ceil_mode", 0) or (len(node.outputs) > 1 and node.outputs[1].uses()):
        return None
    # auto_pad VALID (TensorFlow's exports), or SAME_* with stride 1 (Paddle's), has pads fixed ahead
    window = kernels.Window.of(attribute(node, "kernel_shape"), attribute(node, "strides"), attribute(node, "dilations"),
                               attribute(node, "pads"), attribute(node, "auto_pad", "NOTSET")).with_fixed_pads()
    if window is None:
        return None
    run = partial(kernels.max_pool_q, kernel_shape=window.kernel, strides=window.strides, pads=window.pads,
                  dilations=window.dilations)
    return _step(lambda q: [run(q)], [node.inputs[0]], [node], [node.outputs[0]], native=_max_pool_instruction(window),
                 backend=backend)


def _integer_op(node: ir.Node):
    x = node.inputs[0]
    if node.op_type == "MaxPool":
        return max_pool_step(node)
    if node.op_type == "Flatten":
        axis = attribute(node, "axis", 1)

        def flatten(q):
            at = axis + q.ndim if axis < 0 else axis
            return [q.reshape(math.prod(q.shape[:at]), math.prod(q.shape[at:]))]

        return _step(flatten, [x], [node], native=("flatten", int(axis)))
    if node.op_type in LAYOUT_OPS:
        return layout_step(node)
    if node.op_type == "Relu":
        return _step(lambda q: [kernels.relu_q(q, 0)], [x], [node])
    if node.op_type == "Max" and len(node.inputs) == 2 and (zp := const_array(node.inputs[1])) is not None and zp.size == 1:
        return _step(lambda q: [kernels.relu_q(q, zp)], [x], [node])
    if node.op_type == "Clip" and len(node.inputs) == 3:
        low, high = const_array(node.inputs[1]), const_array(node.inputs[2])
        if low is not None and high is not None:
            return _step(lambda q: [kernels.clip_q(q, low, high)], [x], [node])
    return None
