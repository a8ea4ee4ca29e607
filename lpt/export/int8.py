"""lpt's int8 graph ⇒ standard ONNX int8 that onnxruntime runs (`lpt export`).

    ConvInteger → Cast → Mul(m) [→ Add(b)] [→ Relu] → QuantizeLinear(s_y, z_y)
        ⇒ QLinearConv(x_q, 1, z_x, w_q, m, z_w, s_y, z_y, round(b / m))
    MatMulInteger → Cast → Mul(m) [→ Relu] → QuantizeLinear(s_y, z_y)
        ⇒ QLinearMatMul(a_q, 1, z_a, b_q, m, z_b, s_y, z_y)
    lpt::Quantize(x, il, ih; levels)  ⇒  QuantizeLinear(x, (ih − il)/(levels − 1), qmin − il/scale) [→ Clip]
    lpt::ConvTransposeInteger(x_q, w_q, z_x, z_w)  ⇒  Cast(int32, ConvTranspose(DQ(x_q, 1, z_x), DQ(w_q, 1, z_w)))

Only the product of the input and weight scales matters to QLinear*, so the input scale is 1
and the weight scale carries m. A Relu folds only where the output zero point is the type's
minimum (saturation then does its work). Where the two forms differ, the export says so:
the int32 bias is rounded (b / m), QLinear* requantizes f32(acc + B)·(m / s_y) instead of
(f32(acc)·m + b) / s_y, and QuantizeLinear rounds x / scale where lpt::Quantize rounds
x·isc + ish. `lpt run --check` measures the result in LSBs. Anything else is standard already.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass, RemoveUnusedOpsetsPass

from lpt import kernels
from lpt.backend.chains import read_int8_layer
from lpt.backend.step import Int8Layer
from lpt.export.portable import to_portable
from lpt.graph.constants import add_constant, const_array
from lpt.graph.rewrite import replace_value
from lpt.numerics.levels import level_range

logger = logging.getLogger(__name__)


@dataclass
class ExportReport:
    fused: list[str] = field(default_factory=list)  # nodes now QLinearConv/QLinearMatMul
    approximated: list[str] = field(default_factory=list)  # where the standard form rounds differently


def _fits_qlinear(node: ir.Node, layer: Int8Layer, nodes: list[ir.Node]) -> bool:
    """Whether QLinearConv/QLinearMatMul can say what the chain computes."""
    destination, quantize = layer.destination, nodes[-1]
    if layer.multiplier is None or destination is None or not destination.is_per_tensor:
        return False
    if quantize.op_type != "QuantizeLinear" or len(quantize.inputs) < 3:
        return False  # lpt::Quantize rounds FakeQuantize's way; QLinear* need the zero point's type
    if layer.op == "matmul" and layer.bias is not None:
        return False  # QLinearMatMul has no bias
    if any(not isinstance(op, kernels.Relu) for op in layer.post_ops) or (
            layer.post_ops and int(destination.zero_point) != destination.qmin):
        return False  # a Relu folds only where saturation at the zero point does its work
    if layer.bias is not None and _bias_levels(layer) is None:
        return False  # QLinearConv's int32 bias cannot say it
    # onnxruntime's QLinear kernels want the output type equal to the input type
    return node.inputs[0].dtype.numpy() == destination.zero_point.dtype


def _bias_levels(layer: Int8Layer) -> np.ndarray | None:
    """The bias in units of the multiplier, as QLinearConv's int32 bias, or None where there is no such
    number: a channel whose multiplier is 0 (its weights all 0) under a bias, or a bias past int32."""
    multiplier = layer.multiplier.astype(np.float64).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        levels = np.round(layer.bias.astype(np.float64).reshape(-1) / multiplier)
    if not np.all(np.isfinite(levels)) or np.abs(levels).max(initial=0) > np.iinfo(np.int32).max:
        return None
    return levels.astype(np.int32)


def _fuse(node: ir.Node, report: ExportReport) -> None:
    chain = read_int8_layer(node)
    if chain is None or chain[0].op == "conv_transpose" or not _fits_qlinear(node, *chain):
        return
    layer, nodes = chain
    quantize = nodes[-1]
    is_conv = layer.op == "conv"
    graph, name = node.graph, node.name
    multiplier = layer.multiplier.astype(np.float32).reshape(-1)
    x, w = node.inputs[0], node.inputs[1]
    x_zp = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] is not None else add_constant(
        graph, f"{name}/x_zero_point", np.zeros((), x.dtype.numpy()))
    w_zp = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3] is not None else add_constant(
        graph, f"{name}/w_zero_point", np.zeros((), w.dtype.numpy()))
    one = add_constant(graph, f"{name}/x_scale", np.float32(1.0))
    w_scale = add_constant(graph, f"{name}/w_scale", multiplier if multiplier.size > 1 else multiplier.reshape(()))
    inputs = [x, one, x_zp, w, w_scale, w_zp, quantize.inputs[1], quantize.inputs[2]]
    if layer.bias is not None:
        inputs.append(add_constant(graph, f"{name}/bias_int32", _bias_levels(layer)))
    attributes = {k: v for k, v in node.attributes.items()} if is_conv else {}
    fused = ir.node("QLinearConv" if is_conv else "QLinearMatMul", inputs, attributes, name=name)
    fused.outputs[0].type = quantize.outputs[0].type
    graph.insert_after(quantize, fused)
    replace_value(quantize.outputs[0], fused.outputs[0])
    for old in reversed(nodes):
        graph.remove(old, safe=True)
    report.fused.append(name)
    report.approximated.append(f"{name}: requantization of the QLinear form"
                               + (" and int32 bias" if layer.bias is not None else ""))


def _quantize_to_standard(node: ir.Node, report: ExportReport) -> None:
    graph, name = node.graph, node.name
    il, ih = const_array(node.inputs[1]), const_array(node.inputs[2])
    levels = node.attributes["levels"].as_int()
    dtype = ir.DataType(node.attributes["to"].as_int())
    qmin, qmax = level_range(levels, dtype == ir.DataType.INT8)
    scale = ((ih.astype(np.float32) - il) / np.float32(levels - 1)).astype(np.float32)
    zero_point = np.clip(np.round(qmin - il / scale), qmin, qmax).astype(dtype.numpy())
    if scale.size > 1:
        logger.warning("%s: per-channel lpt::Quantize is left as it is", name)
        return
    inputs = [node.inputs[0], add_constant(graph, f"{name}/scale", scale.reshape(())),
              add_constant(graph, f"{name}/zero_point", zero_point.reshape(()))]
    nodes = [ir.node("QuantizeLinear", inputs, name=name)]
    info = np.iinfo(dtype.numpy())
    if (qmin, qmax) != (info.min, info.max):
        bounds = [add_constant(graph, f"{name}/{k}", np.asarray(v, dtype.numpy())) for k, v in (("qmin", qmin), ("qmax", qmax))]
        nodes.append(ir.node("Clip", [nodes[0].outputs[0], *bounds], name=f"{name}/narrow"))
    for n in nodes:
        n.outputs[0].type = ir.TensorType(dtype)
    graph.insert_after(node, nodes)
    replace_value(node.outputs[0], nodes[-1].outputs[0])
    graph.remove(node, safe=True)
    report.approximated.append(f"{name}: FakeQuantize rounding written as QuantizeLinear")


def _conv_transpose_to_float(node: ir.Node, report: ExportReport) -> None:
    """ONNX has no integer ConvTranspose: the same integers, dequantized with scale 1, through the f32 op."""
    graph, name = node.graph, node.name
    one = add_constant(graph, f"{name}/one", np.float32(1.0))
    dequantized = []
    for index, role in ((0, "x"), (1, "w")):
        zero_point = node.inputs[index + 2] if len(node.inputs) > index + 2 else None
        inputs = [node.inputs[index], one] + ([zero_point] if zero_point is not None else [])
        dq = ir.node("DequantizeLinear", inputs, {"axis": 1} if role == "w" else {}, name=f"{name}/dequantize_{role}")
        dq.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
        dequantized.append(dq)
    conv = ir.node("ConvTranspose", [d.outputs[0] for d in dequantized], dict(node.attributes), name=name)
    conv.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    # Back to the int32 accumulator it stands for: what reads it (an Identity, a Cast) keeps its types.
    accumulator = ir.node("Cast", [conv.outputs[0]], {"to": ir.DataType.INT32}, name=f"{name}/accumulator")
    accumulator.outputs[0].type = ir.TensorType(ir.DataType.INT32)
    graph.insert_after(node, dequantized + [conv, accumulator])
    replace_value(node.outputs[0], accumulator.outputs[0])
    graph.remove(node, safe=True)
    report.approximated.append(f"{name}: integer ConvTranspose written as f32 ConvTranspose (exact while sums fit f32)")


def to_standard_int8(model: ir.Model) -> tuple[ir.Model, ExportReport]:
    """A copy of the int8 graph in standard ONNX ops, and what changed numerically on the way."""
    model = to_portable(model)
    report = ExportReport()
    for node in list(model.graph):
        if node.graph is None:
            continue
        if node.op_type == "Quantize" and node.domain == "lpt":
            _quantize_to_standard(node, report)
        elif node.op_type == "ConvTransposeInteger" and node.domain == "lpt":
            _conv_transpose_to_float(node, report)
    for node in list(model.graph):
        if node.graph is not None and node.op_type in ("ConvInteger", "MatMulInteger") and node.domain in ("", "ai.onnx"):
            _fuse(node, report)
    RemoveUnusedNodesPass()(model)
    RemoveUnusedOpsetsPass()(model)
    return model, report
