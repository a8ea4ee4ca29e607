"""A dynamically quantized convolution or matmul, as onnxruntime's quantize_dynamic writes it, as one step.

quantize_dynamic turns a Conv into (ddddocr_common_old_dynq's 21 layers; a MatMul alike, its classifier):

    q, s, zp = DynamicQuantizeLinear(x)
    acc = ConvInteger(q, W, zp, zw)  or  MatMulInteger(q, W, zp, zw)   W, zw constant
    [acc = acc + Reshape(Cast<int32>(Floor(Div(b, Mul(s, sw_b)))))]    the bias in steps of s·sw_b (b, sw_b constant)
    y = Cast<float>(acc) · Mul(s, sw)                                  sw constant: one value, or one per channel
    [y = y + Reshape(b)]                                               the bias in float32 (onnxruntime 1.32's
                                                                       quantize_dynamic; ddddocr's has the form above),
                                                                       along the channels or a matmul's columns
    [y = y · Sigmoid(y)]                                               a SiLU (onnxruntime fuses it into QuickGelu)

As steps of their own, the quantization and the convolution were lpt's and the rest onnxruntime's: on
ddddocr_common_old_dynq 21 regions of 0.21 ms a call, about a quarter of lpt's time on it. Read here as one step,
its run computes onnxruntime's bits (lpt.numerics.dynamic_quantize_linear, the exact accumulators, the float32
ops in its order, its Sigmoid: lpt.numerics.onnxruntime_logistic), and its native instruction "dynamic_layer"
computes the same in one pass after the convolution; consecutive layers and the float32 Adds between them then
run as one native program.

onnxruntime fuses the SiLU into QuickGelu, which calls MLAS's SiLU: x·logistic(x) on AVX2, and on AVX-512F CPUs
(onnxruntime 1.32) a kernel that also clamps the logistic at 1. Which one this machine's onnxruntime computes is
asked once (onnxruntime_silu_form), and the step computes that one; were it neither, the Sigmoid and the Mul would
stay onnxruntime's, and the outputs its bits still.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from lpt.backend.int8_steps import onnx_reshape_dims
from lpt.backend.onnx_int8_steps import NativeConvInteger, NativeMatMulInteger, convolution_window
from lpt.backend.step import Step
from lpt.graph.constants import const_array
from lpt.graph.ops import attribute
from lpt.numerics.onnxruntime_logistic import silu as onnxruntime_silu


@dataclass(frozen=True, eq=False)
class DynamicLayer:
    """The chain the module's docstring shows, read from its DynamicQuantizeLinear."""

    source: ir.Value
    output: ir.Value
    product: ir.Node  # the ConvInteger or MatMulInteger
    bias: np.ndarray | None  # float32, one per output channel (column), added to the accumulators in steps of s·sw_b
    bias_scale: np.ndarray  # sw_b, float32: one value
    scale: np.ndarray  # sw, float32: one value, or one per output channel
    float_bias: np.ndarray | None  # float32, one per output channel, added after the product by s·sw
    silu: bool
    nodes: tuple[ir.Node, ...]


def read_dynamic_layer(quantize: ir.Node, take_silu: bool = True) -> DynamicLayer | None:
    """The chain from `quantize` (a DynamicQuantizeLinear), or None where the graph is another: the quantization's
    outputs and every value inside the chain read only by its nodes, constant weights, weight scales and a bias along
    the output channels (a convolution's axis 1, a matmul's last). A SiLU after it only with `take_silu`."""
    if quantize.op_type != "DynamicQuantizeLinear" or quantize.domain not in ("", "ai.onnx") or \
            len(quantize.outputs) != 3 or quantize.inputs[0].dtype not in (ir.DataType.FLOAT, None):
        return None
    q, s, zp = quantize.outputs
    product = _only_reader(q)
    if product is None or product.op_type not in ("ConvInteger", "MatMulInteger") or \
            product.domain not in ("", "ai.onnx") or len(product.inputs) < 3 or product.inputs[0] is not q or \
            product.inputs[2] is not zp or (weights := const_array(product.inputs[1])) is None or \
            (len(product.inputs) > 3 and product.inputs[3] is not None and const_array(product.inputs[3]) is None):
        return None
    if product.op_type == "MatMulInteger" and weights.ndim != 2:
        return None
    # the output's rank for a convolution; None for a matmul, whose channels are its last axis
    channels, rank = (weights.shape[0], weights.ndim) if product.op_type == "ConvInteger" else (weights.shape[1], None)
    nodes = [quantize, product]
    acc, bias, bias_scale = product.outputs[0], None, np.zeros(1, np.float32)
    reader = _only_reader(acc)
    if reader is not None and reader.op_type == "Add" and len(reader.inputs) == 2:
        found = _bias(reader.inputs[1] if reader.inputs[0] is acc else reader.inputs[0], s, channels, rank)
        if found is None:
            return None
        bias, bias_scale, bias_nodes = found
        nodes += [*bias_nodes, reader]
        acc = reader.outputs[0]
        reader = _only_reader(acc)
    if reader is None or reader.op_type != "Cast" or attribute(reader, "to") != ir.DataType.FLOAT:
        return None
    nodes.append(reader)
    scaling = _only_reader(reader.outputs[0])
    if scaling is None or scaling.op_type != "Mul" or len(scaling.inputs) != 2:
        return None
    scales = scaling.inputs[1] if scaling.inputs[0] is reader.outputs[0] else scaling.inputs[0]
    scale = _weight_scale(scales.producer(), s, channels, rank)
    if scale is None:
        return None
    nodes += [scales.producer(), scaling]
    output, float_bias = scaling.outputs[0], None
    adding = _only_reader(output)
    if adding is not None and adding.op_type == "Add" and len(adding.inputs) == 2:
        other = adding.inputs[1] if adding.inputs[0] is output else adding.inputs[0]
        float_bias = _per_channel_constant(other, channels, rank)
        if float_bias is not None:
            nodes += [n for n in (other.producer(),) if n is not None and n.op_type == "Reshape"] + [adding]
            output = adding.outputs[0]
    silu = _silu(output) if take_silu else None
    if silu is not None:
        nodes += silu
        output = silu[-1].outputs[0]
    nodes = list(dict.fromkeys(nodes))  # the bias's and the output's Mul(s, sw) may be one node
    inside = {id(n) for n in nodes}
    for node in nodes:
        for value in node.outputs:
            read_outside = any(id(user) not in inside for user, _ in value.uses())
            if value is not output and (value.is_graph_output() or read_outside):
                return None
    return DynamicLayer(quantize.inputs[0], output, product, bias, bias_scale, scale, float_bias, silu is not None,
                        tuple(nodes))


def _only_reader(value: ir.Value) -> ir.Node | None:
    users = {id(user): user for user, _ in value.uses()}
    return next(iter(users.values())) if len(users) == 1 and not value.is_graph_output() else None


def _weight_scale(mul: ir.Node | None, source_scale: ir.Value, channels: int, rank: int | None) -> np.ndarray | None:
    """c of Mul(s, c) or Mul(c, s), a constant float32 of one value or of one per channel (as _along_channels
    broadcasts it), flat; or None."""
    constant = _scale_constant(mul, source_scale)
    if constant is None or (constant.size != 1 and not _along_channels(constant.shape, None, None, channels, rank)):
        return None
    return np.ascontiguousarray(constant.reshape(-1))


def _scale_constant(mul: ir.Node | None, source_scale: ir.Value) -> np.ndarray | None:
    """c of Mul(s, c) or Mul(c, s) where c is a constant float32, as given; or None."""
    if mul is None or mul.op_type != "Mul" or len(mul.inputs) != 2 or source_scale not in mul.inputs:
        return None
    constant = const_array(mul.inputs[1] if mul.inputs[0] is source_scale else mul.inputs[0])
    return constant if constant is not None and constant.dtype == np.float32 else None


def _bias(value: ir.Value, source_scale: ir.Value, channels: int, rank: int | None):
    """(bias, sw_b, nodes) of Reshape(Cast<int32>(Floor(Div(b, Mul(s, sw_b))))) along the channels, or None."""
    reshape = value.producer()
    if reshape is None or reshape.op_type != "Reshape" or (target := const_array(reshape.inputs[1])) is None:
        return None
    cast = reshape.inputs[0].producer()
    if cast is None or cast.op_type != "Cast" or attribute(cast, "to") != ir.DataType.INT32:
        return None
    floor = cast.inputs[0].producer()
    divide = floor.inputs[0].producer() if floor is not None and floor.op_type == "Floor" else None
    if divide is None or divide.op_type != "Div" or (bias := const_array(divide.inputs[0])) is None or \
            bias.dtype != np.float32 or bias.size != channels:
        return None
    bias_scale = _scale_constant(divide.inputs[1].producer(), source_scale)  # one value: the form onnxruntime wrote
    if bias_scale is None or bias_scale.size != 1 or not _along_channels(bias.shape, target, reshape, channels, rank):
        return None
    return bias.reshape(-1), np.ascontiguousarray(bias_scale.reshape(-1)), [divide.inputs[1].producer(), divide, floor,
                                                                           cast, reshape]


def _per_channel_constant(value: ir.Value, channels: int, rank: int | None) -> np.ndarray | None:
    """A constant float32 of one value per channel, as it broadcasts over the output (_along_channels): given so, or a
    Reshape of a constant to that. None otherwise."""
    constant = const_array(value)
    reshape = value.producer()
    if constant is None and reshape is not None and reshape.op_type == "Reshape":
        constant, target = const_array(reshape.inputs[0]), const_array(reshape.inputs[1])
        if constant is None or target is None or not _along_channels(constant.shape, target, reshape, channels, rank):
            return None
    elif constant is None or not _along_channels(constant.shape, None, None, channels, rank):
        return None
    if constant.dtype != np.float32 or constant.size != channels:
        return None
    return np.ascontiguousarray(constant.reshape(-1))


def _along_channels(shape: tuple, target, reshape: ir.Node | None, channels: int, rank: int | None) -> bool:
    """Whether values of `shape`, reshaped to `target` (by `reshape`; None: as they are), broadcast one per channel
    over a convolution's [N, C, *spatial] of `rank` axes, or (rank None) over a matmul's [..., C]."""
    if target is not None:
        target = onnx_reshape_dims(shape, tuple(int(d) for d in target.reshape(-1)), attribute(reshape, "allowzero", 0))
        try:
            shape = np.zeros(shape).reshape(target).shape
        except ValueError:
            return False
    if rank is None:
        return len(shape) >= 1 and shape[-1] == channels and all(d == 1 for d in shape[:-1])
    if len(shape) > rank:
        return False
    shape = (1,) * (rank - len(shape)) + tuple(shape)
    return shape[1] == channels and all(d == 1 for i, d in enumerate(shape) if i != 1)


def _silu(y: ir.Value) -> list[ir.Node] | None:
    """[Sigmoid, Mul] where y's readers are Sigmoid(y) and Mul of y by it, and nothing else."""
    users = list({id(user): user for user, _ in y.uses()}.values())
    sigmoid = next((u for u in users if u.op_type == "Sigmoid"), None)
    if len(users) != 2 or sigmoid is None or y.is_graph_output():
        return None
    mul = next(u for u in users if u is not sigmoid)
    if mul.op_type != "Mul" or {id(v) for v in mul.inputs} != {id(y), id(sigmoid.outputs[0])} or \
            _only_reader(sigmoid.outputs[0]) is not mul:
        return None
    return [sigmoid, mul]


SILU_FORMS = ("unclamped", "clamped")  # lpt.numerics.onnxruntime_logistic.silu without and with `clamped`


@functools.cache
def onnxruntime_silu_form() -> str | None:
    """Which of SILU_FORMS onnxruntime, as it runs a model, computes x·Sigmoid(x) with on this machine, or None:
    asked once per process, on values across the logistic's range and past its clamps."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
                              "silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.concatenate([np.linspace(-20, 20, 40_001, dtype=np.float32),
                        np.random.default_rng(0).normal(0, 4, 10_000).astype(np.float32)])
    y = session.run(None, {"x": x})[0]
    return next((form for form in SILU_FORMS if np.array_equal(y, onnxruntime_silu(x, form == "clamped"))), None)


def dynamic_output(acc: np.ndarray, source_scale, bias, bias_scale, scale, float_bias, silu: str | None,
                   channel_axis: int) -> np.ndarray:
    """onnxruntime's float32 ops after the product, on int32 acc (its channels along `channel_axis`, 1 or −1): the
    bias in steps of s·sw_b (Div, Floor, then Cast to int32 as x86 converts: INT32_MIN where NaN or beyond), the
    int32 Add (wrapping), the Cast, the product by s·sw, the float32 bias, the SiLU in form `silu` (SILU_FORMS)."""
    source_scale = np.float32(source_scale)
    along = (-1,) + (1,) * (acc.ndim - 2) if channel_axis == 1 else -1  # one value per channel, as it broadcasts
    if bias is not None:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            steps = np.floor(bias / (source_scale * bias_scale))
        steps = np.where((steps >= -2.0 ** 31) & (steps < 2.0 ** 31), steps, -2.0 ** 31).astype(np.int32)
        channels = steps.reshape(along)
        acc = (acc.view(np.uint32) + channels.view(np.uint32)).view(np.int32)
    with np.errstate(over="ignore", invalid="ignore"):
        y = acc.astype(np.float32) * (source_scale * scale).reshape(along if scale.size > 1 else ())
        if float_bias is not None:
            y = y + float_bias.reshape(along)
    return onnxruntime_silu(y, silu == "clamped") if silu else y


def try_dynamic_layer_step(node: ir.Node, threads: int) -> tuple[Step, list[ir.Node]] | None:
    """The step for the chain from `node` where it is one and lpt's native engine takes its product, else None."""
    from lpt import native

    chain = read_dynamic_layer(node)
    silu = onnxruntime_silu_form() if chain is not None and chain.silu else None
    if chain is not None and chain.silu and silu is None:
        chain = read_dynamic_layer(node, take_silu=False)
    if chain is None or chain.source.dtype != ir.DataType.FLOAT:
        return None
    product = chain.product
    weights = const_array(product.inputs[1])
    weight_zp = const_array(product.inputs[3]) if len(product.inputs) > 3 and product.inputs[3] is not None \
        else np.zeros((), np.int32)
    if weights.dtype not in (np.int8, np.uint8):
        return None
    if product.op_type == "ConvInteger":
        operation, channel_axis = NativeConvInteger.make(weights, weight_zp, convolution_window(product), threads), 1
    else:
        operation, channel_axis = NativeMatMulInteger.make(weights, weight_zp, threads), -1
    if operation is None:
        return None

    def run(x):
        q, s, zp = native.dynamic_quantize(x, threads)
        acc = operation.accumulate(q, int(zp))
        return [dynamic_output(acc, s, chain.bias, chain.bias_scale, chain.scale, chain.float_bias, silu,
                               channel_axis), q, s, zp, acc]

    bias = None if chain.bias is None else np.ascontiguousarray(chain.bias, np.float32)
    instruction = ("dynamic_layer", (operation.native.instruction[1], bias, chain.bias_scale, chain.scale,
                                     chain.float_bias, 0 if silu is None else 1 + SILU_FORMS.index(silu),
                                     operation.residual_entries()))
    # The quantization's outputs and the accumulators too, as they come: what a per-layer check compares (the native
    # instruction gives the layer's output alone, and nothing else reads them)
    outputs = (chain.output, *node.outputs, product.outputs[0])
    step = Step(run, (chain.source.name,), tuple(v.name for v in outputs), tuple(n.name for n in chain.nodes),
                tuple(n.op_type for n in chain.nodes), "int8 kernel", engine=native.engine_name(operation.native.route),
                native=instruction)
    return step, list(chain.nodes)
