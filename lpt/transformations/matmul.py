"""MatMul / Gemm with dequantized inputs ⇒ Cast(MatMulInteger(a_q, b_q, zp_a, zp_b)) · (s_a·s_b) [+ β·C].

B may be a quantized constant (per-column scales) or a per-tensor dequantized activation
(attention's Q·Kᵀ, P·V). Gemm's transB is applied to the integer constant here, α joins the
scale and β·C is the f32 bias; a transposed A is not supported.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from lpt.graph.constants import add_constant, const_array
from lpt.graph.ops import attribute
from lpt.graph.rewrite import remove_unused, replace_value
from lpt.transformations.base import Check, LayerTransformation
from lpt.transformations.conv import add_bias, check_activation, per_output_channel, zero_point_input
from lpt.transformations.dequantization import Dequantization, insert_dequantization


class MatMulTransformation(LayerTransformation):
    op_types = ("MatMul", "Gemm")

    def can_be_transformed(self, node: ir.Node) -> Check:
        a = check_activation(Dequantization.of(node.inputs[0]))
        if not a:
            return a
        if node.op_type == "Gemm" and attribute(node, "transA", 0):
            return Check.fail("Gemm with transA is not supported")
        b = Dequantization.of(node.inputs[1])
        if b is None:
            return Check.fail("second input is not dequantized")
        constant = const_array(b.data)
        if constant is None:
            if node.op_type == "Gemm" and attribute(node, "transB", 0):
                return Check.fail("Gemm with a transposed activation B is not supported")
            return check_activation(b)
        if b.zero_point is None or b.data.dtype not in (ir.DataType.INT8, ir.DataType.UINT8) or constant.ndim != 2:
            return Check.fail("weight is not a 2-D 8-bit constant with an integer zero point")
        if self._column_params(node, b) is None:
            return Check.fail("weight scales are not per output column")
        if node.op_type == "Gemm" and len(node.inputs) > 2 and node.inputs[2] is not None and const_array(node.inputs[2]) is None:
            return Check.fail("bias C is not a constant")
        return Check.ok()

    def _column_params(self, node: ir.Node, b: Dequantization):
        """(q_b as [K, N], scale per column, zero point per column)."""
        q = const_array(b.data)
        transposed = node.op_type == "Gemm" and attribute(node, "transB", 0)
        columns, axis = (q.shape[0], 0) if transposed else (q.shape[1], -1)
        scale = per_output_channel(b.scale, columns, axis)
        zero_point = per_output_channel(b.zero_point, columns, axis)
        if scale is None or zero_point is None:
            return None
        return (q.T if transposed else q), scale, zero_point

    def transform(self, node: ir.Node) -> None:
        graph, name = node.graph, node.name or node.op_type
        a, b = Dequantization.of(node.inputs[0]), Dequantization.of(node.inputs[1])
        if const_array(b.data) is not None:
            q_b, b_scale, b_zp = self._column_params(node, b)
            b_value = add_constant(graph, f"{name}/weight_quantized", np.ascontiguousarray(q_b))
        else:
            b_value, b_scale, b_zp = b.data, b.scale.reshape(()), b.zero_point
        inputs = [a.data, b_value,
                  zero_point_input(graph, a.zero_point, a.data.dtype, f"{name}/a_zero_point"),
                  zero_point_input(graph, b_zp, b_value.dtype, f"{name}/b_zero_point")]
        if inputs[3] is not None and inputs[2] is None:
            inputs[2] = add_constant(graph, f"{name}/a_zero_point", np.zeros((), a.data.dtype.numpy()))
        while inputs[-1] is None:
            inputs.pop()
        matmul = ir.node("MatMulInteger", inputs, name=f"{name}/integer")
        accumulator = matmul.outputs[0]
        accumulator.type, accumulator.name = ir.TensorType(ir.DataType.INT32), f"{name}/accumulator"
        graph.insert_before(node, matmul)
        alpha = np.float32(attribute(node, "alpha", 1.0)) if node.op_type == "Gemm" else np.float32(1)
        scale = (a.scale.reshape(()) * b_scale * alpha).astype(np.float32)
        result = insert_dequantization(graph, accumulator, scale, None, after=matmul, name=f"{name}/dequantize")
        if node.op_type == "Gemm" and len(node.inputs) > 2 and node.inputs[2] is not None:
            c = const_array(node.inputs[2]) * np.float32(attribute(node, "beta", 1.0))
            result = add_bias(graph, result, c, c.shape, name)
        replace_value(node.outputs[0], result)
        graph.remove(node, safe=True)
        remove_unused(graph, list(reversed(a.nodes)) + list(reversed(b.nodes)))
