"""Add or Mul of a dequantized tensor and a constant ⇒ folded into the dequantization.

    DQ(q; s, z) + c  ⇒  DQ(q; s, z − c/s)       DQ(q; s, z) · c  ⇒  DQ(q; s·c, z)

A scalar constant always folds; a per-channel one only when the dequantization is per
tensor or varies along the same axis. On an int32 accumulator only Mul folds (attention's
1/√d joins the scale); an Add there is a bias, which stays an f32 add in the output stage. The new shift may not be an integer: it then stays an
f32 Subtract, and the next integer op says so.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from lpt.graph.constants import const_array
from lpt.graph.rewrite import remove_unused, replace_value
from lpt.transformations.base import Check, LayerTransformation
from lpt.transformations.dequantization import Dequantization, insert_dequantization


def _split(node: ir.Node) -> tuple[Dequantization | None, np.ndarray | None]:
    for data, other in ((0, 1), (1, 0)):
        dq, constant = Dequantization.of(node.inputs[data]), const_array(node.inputs[other])
        if dq is not None and constant is not None:
            return dq, constant.astype(np.float32)
    return None, None


def _keeps_shape(data: ir.Value, constant: np.ndarray) -> bool:
    dims = list(data.shape) if data.shape is not None else None
    if dims is None or constant.ndim > len(dims):
        return False
    return all(c == 1 or c == d for c, d in zip(reversed(constant.shape), reversed(dims)))


class ConstantArithmeticTransformation(LayerTransformation):
    op_types = ("Add", "Mul")

    def can_be_transformed(self, node: ir.Node) -> Check:
        dq, constant = _split(node)
        if dq is None:
            return Check.fail("not a dequantized tensor and a constant")
        if node.op_type == "Add" and dq.data.dtype not in (ir.DataType.UINT8, ir.DataType.INT8):
            return Check.fail("a bias stays an f32 Add after the accumulator's dequantization (the kernel's output stage)")
        if constant.size > 1 and not _keeps_shape(dq.data, constant):
            return Check.fail("the constant would broadcast the tensor to a bigger shape")
        if constant.size > 1 and not dq.is_per_tensor:
            return Check.fail("a per-channel constant on a per-channel dequantization")
        if node.op_type == "Mul" and np.any(constant == 0):
            return Check.fail("multiplying by zero would make a zero scale")
        return Check.ok()

    def transform(self, node: ir.Node) -> None:
        dq, constant = _split(node)
        shift = np.zeros((), np.float32) if dq.shift is None else dq.shift
        if node.op_type == "Add":
            scale, shift = dq.scale, (shift - constant / dq.scale).astype(np.float32)
        else:
            scale = (dq.scale * constant).astype(np.float32)
        result = insert_dequantization(node.graph, dq.data, scale, shift, after=node, name=node.name or node.op_type)
        replace_value(node.outputs[0], result)
        node.graph.remove(node, safe=True)
        remove_unused(result.graph, list(reversed(dq.nodes)))
