"""Pre-quantized operators ⇒ DequantizeLinear → float op → QuantizeLinear, which the QDQ pass then folds.

    QLinearConv(x_q, ..., w_q, ..., y_s, y_zp, B)  ⇒  Q(Conv(DQ(x_q), DQ(w_q), B·s_x·s_w), y_s, y_zp)
    QLinearMatMul(a_q, ..., b_q, ..., y_s, y_zp)   ⇒  Q(MatMul(DQ(a_q), DQ(b_q)), y_s, y_zp)
    Cast(ConvInteger|MatMulInteger(x_q, w_q, zx, zw)) · c   ⇒  Conv|MatMul(DQ(x_q), DQ(w_q, c / s_x))
        where x_q = QuantizeLinear(x, s_x, zx) with constant parameters.

These are the TVM RFC's "pre-quantized models". The float form is what the integer op
approximates: the int32 bias and the requantization rounding of the original are not kept
bit for bit (lpt re-derives them from the FakeQuantize ranges).
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir

from lpt.graph.constants import add_constant, const_array

logger = logging.getLogger(__name__)

_CONV_ATTRIBUTES = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _dq(graph: ir.Graph, q: ir.Value, scale: ir.Value, zero_point: ir.Value | None, name: str, axis: int = 1) -> ir.Node:
    inputs = [q, scale] + ([zero_point] if zero_point is not None else [])
    return ir.node("DequantizeLinear", inputs, {"axis": axis}, name=name)


class QLinearOpsToQdq(ir.passes.InPlacePass):
    """Rewrite QLinearConv, QLinearMatMul and ConvInteger/MatMulInteger+scale into QDQ around float ops."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
            if node.domain not in ("", "ai.onnx") or node.graph is None:
                continue
            if node.op_type in ("QLinearConv", "QLinearMatMul"):
                modified |= self._rewrite_qlinear(node)
            elif node.op_type in ("ConvInteger", "MatMulInteger"):
                modified |= self._try_rewrite_integer(node)
        return ir.passes.PassResult(model, modified)

    def _rewrite_qlinear(self, node: ir.Node) -> bool:
        graph, name = node.graph, node.name or node.op_type
        x, xs, xz, w, ws, wz, ys, yz = node.inputs[:8]
        is_conv = node.op_type == "QLinearConv"
        w_axis = 0 if is_conv else -1  # per output channel: Conv's first dim, MatMul's last
        new = [_dq(graph, x, xs, xz, f"{name}/dequantize_input"),
               _dq(graph, w, ws, wz, f"{name}/dequantize_weight", axis=w_axis)]
        inputs = [new[0].outputs[0], new[1].outputs[0]]
        if is_conv and len(node.inputs) > 8 and node.inputs[8] is not None:
            bias, s_x, s_w = (const_array(v) for v in (node.inputs[8], xs, ws))
            if bias is None or s_x is None or s_w is None:
                logger.info("%s %r kept: bias or scales are not constants", node.op_type, name)
                return False
            bias_f32 = (bias.astype(np.float64) * s_x * s_w).astype(np.float32)
            inputs.append(add_constant(graph, f"{name}/bias", bias_f32))
        attributes = {k: v for k, v in node.attributes.items() if k in _CONV_ATTRIBUTES}
        op = ir.node("Conv" if is_conv else "MatMul", inputs, attributes, name=name)
        quantize = ir.node("QuantizeLinear", [op.outputs[0], ys, yz], name=f"{name}/quantize_output")
        new += [op, quantize]
        for value in (op.outputs[0],):
            value.type = ir.TensorType(ir.DataType.FLOAT)
        ir.convenience.replace_nodes_and_values(graph, node, [node], new, node.outputs, quantize.outputs)
        return True

    def _try_rewrite_integer(self, node: ir.Node) -> bool:
        graph, name = node.graph, node.name or node.op_type
        x_q, w_q = node.inputs[:2]
        x_zp = node.inputs[2] if len(node.inputs) > 2 else None
        w_zp = node.inputs[3] if len(node.inputs) > 3 else None
        quantize = x_q.producer()
        users = list(node.outputs[0].consumers())
        cast = users[0] if len(users) == 1 and users[0].op_type == "Cast" else None
        mul_users = list(cast.outputs[0].consumers()) if cast else []
        mul = mul_users[0] if len(mul_users) == 1 and mul_users[0].op_type == "Mul" else None
        scale_value = next((v for v in mul.inputs if v is not cast.outputs[0]), None) if mul else None
        combined = const_array(scale_value)
        if quantize is None or quantize.op_type != "QuantizeLinear" or combined is None or const_array(w_q) is None:
            logger.info("%s %r kept: needs a static QuantizeLinear input, a constant weight and Cast → Mul(constant)", node.op_type, name)
            return False
        s_x = const_array(quantize.inputs[1])
        if s_x is None or s_x.size != 1:
            return False
        is_conv = node.op_type == "ConvInteger"
        w_scale = (combined.astype(np.float64).reshape(-1) / s_x.reshape(())).astype(np.float32)
        if w_scale.size == 1:
            w_scale = w_scale.reshape(())
        new = [_dq(graph, x_q, quantize.inputs[1], x_zp, f"{name}/dequantize_input"),
               _dq(graph, w_q, add_constant(graph, f"{name}/weight_scale", w_scale), w_zp,
                   f"{name}/dequantize_weight", axis=0 if is_conv else -1)]
        attributes = {k: v for k, v in node.attributes.items() if k in _CONV_ATTRIBUTES}
        op = ir.node("Conv" if is_conv else "MatMul", [new[0].outputs[0], new[1].outputs[0]], attributes, name=name)
        new.append(op)
        ir.convenience.replace_nodes_and_values(graph, mul, [node, cast, mul], new, mul.outputs, op.outputs)
        return True
