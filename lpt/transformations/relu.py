"""Relu(DQ(q)) ⇒ DQ(Max(q, zp)): Relu runs on the integer tensor, thresholding at the zero point.

scale·(q − zp) > 0 ⇔ q > zp when scale > 0. With zp = 0 it is a plain Relu on int8 and
nothing at all on uint8 (every level is already ≥ 0), so that Relu is removed.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from lpt.graph.constants import add_constant
from lpt.graph.rewrite import replace_value
from lpt.transformations.base import Check, LayerTransformation
from lpt.transformations.dequantization import Dequantization, move_after


class ReluTransformation(LayerTransformation):
    op_types = ("Relu",)
    precision_preserved = True

    def can_be_transformed(self, node: ir.Node) -> Check:
        dq = Dequantization.of(node.inputs[0])
        if dq is None:
            return Check.fail("input is not dequantized")
        if dq.is_accumulator:
            return Check.fail("an int32 accumulator: Relu joins the layer's f32 output stage")
        if np.any(dq.scale <= 0):
            return Check.fail("a non-positive scale flips the threshold")
        if dq.zero_point is None:
            return Check.fail("the zero point is not an integer, so the threshold is not a level")
        return Check.ok()

    def transform(self, node: ir.Node) -> None:
        dq = Dequantization.of(node.inputs[0])
        if dq.data.dtype == ir.DataType.UINT8 and not np.any(dq.zero_point):
            replace_value(node.outputs[0], node.inputs[0])
            node.graph.remove(node, safe=True)
            return
        if np.any(dq.zero_point != 0):
            threshold = add_constant(node.graph, f"{node.name}/zero_point", dq.zero_point.astype(dq.data.dtype.numpy()))
            node.op_type = "Max"
            node.resize_inputs(2)
            node.replace_input_with(1, threshold)
        move_after(node, {0: dq}, dq.scale, dq.shift)
