"""Conv(DQ(x_q), DQ(w_q), b) ⇒ Cast(ConvInteger(x_q, w_q, zp_x, zp_w)) · (s_x·s_w[oc]) + b.

ConvTranspose the same way, into lpt::ConvTransposeInteger (ONNX has no integer
ConvTranspose); its weights are [C_in, C_out/group, *kernel], so their output channel is axis 1.

The activation's per-tensor dequantization moves after the op and multiplies into the
per-output-channel weight scales; its zero point becomes ConvInteger's x_zero_point, which
the backend turns into the precomputed compensation term (zp_x · Σ w_q) and the zero-point
padding. A weight zero point stays (the general four-term form); the bias stays f32, added
after dequantization.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from lpt.graph.constants import add_constant, const_array
from lpt.graph.rewrite import remove_unused, replace_value
from lpt.transformations.base import Check, LayerTransformation
from lpt.transformations.dequantization import Dequantization, insert_dequantization

_8_BIT = (ir.DataType.UINT8, ir.DataType.INT8)
CONV_TRANSPOSE_INTEGER = "ConvTransposeInteger"  # lpt::ConvTransposeInteger: ConvInteger's inputs, ConvTranspose's attributes


def _out_channels(node: ir.Node, weights: np.ndarray) -> tuple[int, int]:
    """(output channels, the weight axis they lie along) of a Conv or ConvTranspose."""
    if node.op_type == "ConvTranspose":
        group = node.attributes["group"].as_int() if "group" in node.attributes else 1
        return weights.shape[1] * group, 1
    return weights.shape[0], 0


def check_activation(dq: Dequantization | None) -> Check:
    """The activation side of an integer Conv/MatMul: per-tensor, 8-bit, integer zero point."""
    if dq is None:
        return Check.fail("input is not dequantized")
    if dq.data.dtype not in _8_BIT:
        return Check.fail(f"input is {dq.data.dtype.name}, not 8-bit")
    if not dq.is_per_tensor:
        return Check.fail("input dequantization is per channel (it cannot move past a reduction over channels)")
    if dq.zero_point is None:
        return Check.fail("input zero point is not an integer (it stays an f32 Subtract)")
    return Check.ok()


def per_output_channel(array: np.ndarray, out_channels: int, axis: int) -> np.ndarray | None:
    """A weight scale/zero point as one value per output channel (None if it varies along another axis)."""
    if array.size == 1:
        return array.reshape(())
    if array.shape[axis] == out_channels and array.size == out_channels:
        return array.reshape(out_channels)
    return None


def zero_point_input(graph: ir.Graph, zero_point: np.ndarray, dtype: ir.DataType, name: str) -> ir.Value | None:
    if not np.any(zero_point):
        return None
    return add_constant(graph, name, zero_point.astype(dtype.numpy()))


class ConvTransformation(LayerTransformation):
    op_types = ("Conv", "ConvTranspose")

    def can_be_transformed(self, node: ir.Node) -> Check:
        if node.op_type == "ConvTranspose":
            if "output_shape" in node.attributes:
                return Check.fail("ConvTranspose with output_shape is not supported (give pads)")
            auto_pad = node.attributes["auto_pad"].as_string() if "auto_pad" in node.attributes else "NOTSET"
            if auto_pad != "NOTSET":
                return Check.fail(f"ConvTranspose with auto_pad {auto_pad} is not supported (give pads)")
        activation = check_activation(Dequantization.of(node.inputs[0]))
        if not activation:
            return activation
        weight = Dequantization.of(node.inputs[1])
        if weight is None or const_array(weight.data) is None:
            return Check.fail("weight is not a quantized constant")
        if weight.data.dtype not in _8_BIT or weight.zero_point is None:
            return Check.fail("weight is not 8-bit with an integer zero point")
        out_channels, axis = _out_channels(node, const_array(weight.data))
        group = node.attributes["group"].as_int() if "group" in node.attributes else 1
        if node.op_type == "ConvTranspose" and group > 1 and not weight.is_per_tensor:
            return Check.fail("per-channel weights of a grouped ConvTranspose are not supported")
        if per_output_channel(weight.scale, out_channels, axis) is None or (
                weight.shift is not None and per_output_channel(weight.shift, out_channels, axis) is None):
            return Check.fail("weight scales are not per output channel")
        if len(node.inputs) > 2 and node.inputs[2] is not None and const_array(node.inputs[2]) is None:
            return Check.fail("bias is not a constant")
        return Check.ok()

    def transform(self, node: ir.Node) -> None:
        graph, name = node.graph, node.name or "conv"
        x, w = Dequantization.of(node.inputs[0]), Dequantization.of(node.inputs[1])
        bias = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
        out_channels, axis = _out_channels(node, const_array(w.data))
        w_scale = per_output_channel(w.scale, out_channels, axis)
        w_zp = per_output_channel(w.zero_point, out_channels, axis)
        inputs = [x.data, w.data,
                  zero_point_input(graph, x.zero_point, x.data.dtype, f"{name}/x_zero_point"),
                  zero_point_input(graph, w_zp, w.data.dtype, f"{name}/w_zero_point")]
        if inputs[3] is not None and inputs[2] is None:
            inputs[2] = add_constant(graph, f"{name}/x_zero_point", np.zeros((), x.data.dtype.numpy()))
        while inputs[-1] is None:
            inputs.pop()
        if node.op_type == "ConvTranspose":
            conv = ir.node(CONV_TRANSPOSE_INTEGER, inputs, dict(node.attributes), domain="lpt", name=f"{name}/integer")
        else:
            conv = ir.node("ConvInteger", inputs, dict(node.attributes), name=f"{name}/integer")
        accumulator = conv.outputs[0]
        accumulator.type, accumulator.name = ir.TensorType(ir.DataType.INT32), f"{name}/accumulator"
        out = node.outputs[0]
        rank = const_array(w.data).ndim  # a convolution's output has its weights' rank, whatever the graph knows
        channel_shape = (1, out_channels) + (1,) * (rank - 2)
        scale = (x.scale.reshape(()) * w_scale).astype(np.float32)
        graph.insert_before(node, conv)
        result = insert_dequantization(graph, accumulator, np.broadcast_to(scale, (out_channels,)).reshape(channel_shape),
                                       None, after=conv, name=f"{name}/dequantize")
        result = add_bias(graph, result, bias, channel_shape, name)
        replace_value(out, result)
        graph.remove(node, safe=True)
        remove_unused(graph, list(reversed(x.nodes)) + list(reversed(w.nodes)))


def add_bias(graph: ir.Graph, value: ir.Value, bias: np.ndarray | None, shape, name: str) -> ir.Value:
    """value + bias (reshaped to `shape` to broadcast per channel), in f32 after dequantization."""
    if bias is None:
        return value
    constant = add_constant(graph, f"{name}/bias", bias.astype(np.float32).reshape(shape))
    add = ir.node("Add", [value, constant], name=f"{name}/add_bias")
    add.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    add.outputs[0].name = add.name
    graph.insert_after(value.producer(), add)
    return add.outputs[0]
