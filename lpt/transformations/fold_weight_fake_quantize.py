"""FakeQuantize(w constant) ⇒ q (int8 constant) → Cast → [Sub(shift)] → Mul(scale).

The weight is quantized once, here, half-to-even (QuantizeLinear semantics for QDQ-imported
FQs, the FQ's affine form otherwise); per-output-channel limits give per-channel scales.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from lpt.graph.constants import add_constant, const_array
from lpt.graph.fake_quantize_op import DOMAIN, is_fake_quantize, read_fake_quantize
from lpt.graph.rewrite import replace_value
from lpt.numerics import fake_quantize_levels
from lpt.transformations.base import Check, LayerTransformation
from lpt.transformations.dequantization import insert_dequantization
from lpt.transformations.fake_quantize_decomposition import dequantization_of


class FoldWeightFakeQuantize(LayerTransformation):
    """Quantize constant weights into integer constants with a dequantization after them."""

    def matches(self, node: ir.Node) -> bool:
        return is_fake_quantize(node) and node.domain == DOMAIN and const_array(node.inputs[0]) is not None

    def can_be_transformed(self, node: ir.Node) -> Check:
        fq = read_fake_quantize(node)
        if fq is None:
            return Check.fail("FakeQuantize limits are not constants")
        if fq.levels > 256:
            return Check.fail(f"levels {fq.levels} does not fit 8 bits")
        if fq.scale is None and (np.any(fq.input_high <= fq.input_low) or np.any(fq.output_high <= fq.output_low)):
            return Check.fail("an empty or inverted interval has no integer form")
        return Check.ok()

    def transform(self, node: ir.Node) -> None:
        graph, x = node.graph, node.inputs[0]
        fq = read_fake_quantize(node)
        weight = const_array(x)
        scale, shift, dtype = dequantization_of(fq, weight.ndim)
        qmin, _ = fq.integer_range
        if fq.scale is not None:
            q = fq.quantize(weight)
        else:
            levels = fake_quantize_levels(weight, fq.input_low, fq.input_high, fq.levels)
            q = (levels.astype(np.int32) + qmin).astype(dtype.numpy())
        name = node.name or f"{x.name}/fq"
        q_value = add_constant(graph, f"{x.name}/quantized", q)
        out = insert_dequantization(graph, q_value, scale, shift, after=node, name=name)
        replace_value(node.outputs[0], out)
        graph.remove(node, safe=True)
        if not x.uses() and x.is_initializer() and x.name in graph.initializers:
            del graph.initializers[x.name]
