"""Concat(DQ(q1), DQ(q2), ...) with one shared dequantization ⇒ DQ(Concat(q1, q2, ...)).

Inputs with different scales are left as they are: the backend requantizes each to the
destination's scale when it fuses the Concat with the FakeQuantize after it.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from lpt.transformations.base import Check, LayerTransformation
from lpt.transformations.dequantization import Dequantization, move_after


def _same(a: Dequantization, b: Dequantization) -> bool:
    shift_a = np.zeros(1, np.float32) if a.shift is None else a.shift
    shift_b = np.zeros(1, np.float32) if b.shift is None else b.shift
    return (a.data.dtype == b.data.dtype and np.array_equal(a.scale.reshape(-1), b.scale.reshape(-1))
            and np.array_equal(shift_a.reshape(-1), shift_b.reshape(-1)))


class ConcatTransformation(LayerTransformation):
    op_types = ("Concat",)
    precision_preserved = True

    def can_be_transformed(self, node: ir.Node) -> Check:
        dqs = [Dequantization.of(v) for v in node.inputs]
        if any(dq is None for dq in dqs):
            return Check.fail("not every input is dequantized")
        if not all(dq.is_per_tensor for dq in dqs):
            return Check.fail("per-channel dequantization on an input")
        if not all(_same(dqs[0], dq) for dq in dqs[1:]):
            return Check.fail("inputs have different scales (requantized when fused with the next FakeQuantize)")
        return Check.ok()

    def transform(self, node: ir.Node) -> None:
        dqs = {i: Dequantization.of(v) for i, v in enumerate(node.inputs)}
        first = dqs[0]
        move_after(node, dqs, first.scale, first.shift)
