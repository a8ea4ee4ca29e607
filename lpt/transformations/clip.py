"""Clip(DQ(q), lo, hi) ⇒ DQ(Clip(q, q_lo, q_hi)), q_lo = ⌈lo/scale + zp⌉, q_hi = ⌊hi/scale + zp⌋.

Exact when lo and hi are levels of the grid (Relu6's 0 always is); otherwise a clipped value
becomes the nearest level inside [lo, hi] instead of the bound itself, less than one step away.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from lpt.graph.constants import add_constant, const_array
from lpt.transformations.base import Check, LayerTransformation
from lpt.transformations.dequantization import Dequantization, move_after


def _bounds(node: ir.Node) -> tuple[float, float] | None:
    values = []
    for index, default in ((1, -np.inf), (2, np.inf)):
        if len(node.inputs) > index and node.inputs[index] is not None:
            array = const_array(node.inputs[index])
            if array is None:
                return None
            values.append(float(array))
        else:
            values.append(default)
    return values[0], values[1]


class ClipTransformation(LayerTransformation):
    op_types = ("Clip",)
    precision_preserved = True

    def can_be_transformed(self, node: ir.Node) -> Check:
        dq = Dequantization.of(node.inputs[0])
        if dq is None:
            return Check.fail("input is not dequantized")
        if dq.is_accumulator:
            return Check.fail("an int32 accumulator: Clip joins the layer's f32 output stage")
        if not dq.is_per_tensor:
            return Check.fail("per-channel dequantization would need per-channel bounds")
        if np.any(dq.scale <= 0):
            return Check.fail("a non-positive scale swaps the bounds")
        if dq.zero_point is None:
            return Check.fail("the zero point is not an integer")
        if _bounds(node) is None:
            return Check.fail("the bounds are not constants")
        return Check.ok()

    def transform(self, node: ir.Node) -> None:
        dq = Dequantization.of(node.inputs[0])
        lo, hi = _bounds(node)
        info = np.iinfo(dq.data.dtype.numpy())
        zp, scale = float(dq.zero_point), float(dq.scale)
        q_lo = info.min if np.isinf(lo) else int(np.clip(np.ceil(lo / scale + zp), info.min, info.max))
        q_hi = info.max if np.isinf(hi) else int(np.clip(np.floor(hi / scale + zp), info.min, info.max))
        dtype = dq.data.dtype.numpy()
        node.resize_inputs(3)
        node.replace_input_with(1, add_constant(node.graph, f"{node.name}/min_level", np.asarray(q_lo, dtype)))
        node.replace_input_with(2, add_constant(node.graph, f"{node.name}/max_level", np.asarray(q_hi, dtype)))
        move_after(node, {0: dq}, dq.scale, dq.shift)
