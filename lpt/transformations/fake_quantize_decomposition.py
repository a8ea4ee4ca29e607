"""FakeQuantize(x) ⇒ Quantize(x) → Cast → [Sub(shift)] → Mul(scale): quantize to u8/i8, then dequantize.

* QDQ semantics: QuantizeLinear (plus an integer Clip for a narrow range such as levels 255);
  the dequantization is DequantizeLinear's arithmetic, so the output is bit-exact.
* OpenVINO semantics, levels 255/256: lpt::Quantize (the FQ's affine form, giving integers);
  u8 when the output interval is non-negative, else i8, as OpenVINO chooses. scale =
  (oh − ol)/(levels − 1), shift = qmin − ol/scale; a shift that is not an integer stays an f32
  Subtract (and later stops integer Conv/MatMul).

FQs on constants are weights, handled by FoldWeightFakeQuantize; other levels, binarization
and inverted intervals keep their FakeQuantize.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from lpt.graph.constants import add_constant, const_array
from lpt.graph.fake_quantize_op import DOMAIN, FakeQuantize, is_fake_quantize, read_fake_quantize
from lpt.graph.rewrite import replace_value
from lpt.transformations.base import Check, LayerTransformation
from lpt.transformations.dequantization import insert_dequantization

QUANTIZE_OP = "Quantize"  # lpt::Quantize(x, input_low, input_high; levels, to): FakeQuantize's integer half


def dequantization_of(fq: FakeQuantize, rank: int) -> tuple[np.ndarray, np.ndarray, ir.DataType]:
    """(scale, shift, integer type) that read the FQ's integers back as its output values."""
    qmin, qmax = fq.integer_range
    if fq.scale is not None:
        scale, shift = fq.scale, fq.zero_point.astype(np.float32)
        if fq.scale.size > 1:
            shape = [1] * rank
            shape[fq.axis % rank] = fq.scale.size
            scale, shift = scale.reshape(shape), shift.reshape(shape)
        return scale, shift, ir.DataType.from_numpy(fq.zero_point.dtype)
    scale = ((fq.output_high - fq.output_low) / np.float32(qmax - qmin)).astype(np.float32)
    shift = (np.float32(qmin) - fq.output_low / scale).astype(np.float32)
    rounded = np.round(shift)
    # A shift within float noise of an integer is that integer: it is a zero point.
    shift = np.where(np.abs(shift - rounded) < 1e-3, rounded, shift).astype(np.float32)
    return scale, shift, ir.DataType.INT8 if fq.signed else ir.DataType.UINT8


class FakeQuantizeDecomposition(LayerTransformation):
    """Split activation FakeQuantizes into quantize + dequantize."""

    def matches(self, node: ir.Node) -> bool:
        return is_fake_quantize(node) and node.domain == DOMAIN

    def can_be_transformed(self, node: ir.Node) -> Check:
        if const_array(node.inputs[0]) is not None:
            return Check.fail("a FakeQuantize on a constant is a weight")
        fq = read_fake_quantize(node)
        if fq is None:
            return Check.fail("FakeQuantize limits are not constants")
        if node.inputs[0].shape is None and np.size(fq.input_low) > 1:
            return Check.fail("per-channel limits on an input of unknown rank")
        if fq.scale is None:
            if fq.levels not in (255, 256):
                return Check.fail(f"levels {fq.levels} is not an 8-bit range (255 or 256)")
            if np.any(fq.input_high <= fq.input_low) or np.any(fq.output_high <= fq.output_low):
                return Check.fail("an empty or inverted interval has no integer form")
        return Check.ok()

    def transform(self, node: ir.Node) -> None:
        graph, x = node.graph, node.inputs[0]
        fq = read_fake_quantize(node)
        rank = len(x.shape) if x.shape is not None else 0  # unknown only where the limits are per tensor
        scale, shift, dtype = dequantization_of(fq, rank)
        qmin, qmax = fq.integer_range
        name = node.name or f"{x.name}/fq"
        if fq.scale is not None:
            quantize = [ir.node("QuantizeLinear", [x, node.inputs[5], node.inputs[6]], {"axis": fq.axis},
                                name=f"{name}/quantize")]
            if (qmin, qmax) != (np.iinfo(fq.zero_point.dtype).min, np.iinfo(fq.zero_point.dtype).max):
                bounds = [add_constant(graph, f"{name}/{k}", np.asarray(v, fq.zero_point.dtype))
                          for k, v in (("qmin", qmin), ("qmax", qmax))]
                quantize.append(ir.node("Clip", [quantize[0].outputs[0], *bounds], name=f"{name}/narrow"))
        else:
            quantize = [ir.node(QUANTIZE_OP, node.inputs[:3], {"levels": fq.levels, "to": dtype},
                                domain=DOMAIN, name=f"{name}/quantize")]
        for q in quantize:
            q.outputs[0].type = ir.TensorType(dtype)
            q.outputs[0].shape = x.shape
            q.outputs[0].name = q.name
        graph.insert_after(node, quantize)
        out = insert_dequantization(graph, quantize[-1].outputs[0], scale, shift, after=quantize[-1], name=name)
        replace_value(node.outputs[0], out)
        graph.remove(node, safe=True)
