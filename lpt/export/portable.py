"""lpt::FakeQuantize ⇒ standard ONNX that other tools run.

    FakeQuantize with QDQ semantics on an activation  ⇒  QuantizeLinear → DequantizeLinear
    FakeQuantize with QDQ semantics on a constant     ⇒  integer constant → DequantizeLinear
    FakeQuantize with OpenVINO semantics              ⇒  org.openvinotoolkit::FakeQuantize

Both QDQ forms are bit-exact with the FakeQuantize they replace. A QDQ-semantics FQ whose
integer range is narrower than its storage type (levels 255 on an activation) cannot be a QDQ
pair exactly, so it is written as OpenVINO's op too.
"""

from __future__ import annotations

import logging

import onnx_ir as ir
from onnx_ir.passes.common import NameFixPass, RemoveUnusedNodesPass, RemoveUnusedOpsetsPass

from lpt.graph.constants import add_constant, const_array
from lpt.graph.fake_quantize_op import OPENVINO_DOMAIN, is_fake_quantize, read_fake_quantize
from lpt.graph.rewrite import replace_value
from lpt.model_io import clone

logger = logging.getLogger(__name__)


def to_portable(model: ir.Model) -> ir.Model:
    """A copy of `model` in which no lpt-domain FakeQuantize remains."""
    model = clone(model)
    for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
        if is_fake_quantize(node) and node.domain != OPENVINO_DOMAIN:
            _rewrite(node, model)
    RemoveUnusedNodesPass()(model)
    _remove_unused_subgraph_initializers(model)
    NameFixPass()(model)  # the Q/DQ nodes' new values: a subgraph's default names repeat the main graph's
    RemoveUnusedOpsetsPass()(model)
    return model


def _remove_unused_subgraph_initializers(model: ir.Model) -> None:
    """The FQ parameters a subgraph (a Scan body, say) no longer reads: RemoveUnusedNodesPass keeps
    the initializers of subgraphs."""
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.GRAPH:
                graph = attribute.value
                for value in list(graph.initializers.values()):
                    if not (value.uses() or value.is_graph_input() or value.is_graph_output()):
                        graph.initializers.pop(value.name)


def _rewrite(node: ir.Node, model: ir.Model) -> None:
    fq = read_fake_quantize(node)
    graph, name, x = node.graph, node.name, node.inputs[0]
    full_range = fq is not None and fq.scale is not None and fq.levels == 2 ** (8 * fq.zero_point.dtype.itemsize)
    weight = const_array(x)
    if fq is None or fq.scale is None or (weight is None and not full_range):
        node.domain = OPENVINO_DOMAIN
        node.attributes.pop("axis", None)
        node.resize_inputs(5)
        model.opset_imports.setdefault(OPENVINO_DOMAIN, 1)
        if fq is not None and fq.scale is not None:
            logger.warning("%s: levels %d on an activation has no exact QDQ form; written as OpenVINO FakeQuantize",
                           name, fq.levels)
        return
    scale, zero_point = node.inputs[5], node.inputs[6]
    axis = {"axis": fq.axis} if fq.scale.size > 1 else {}
    new = []
    if weight is not None:
        q = add_constant(graph, f"{x.name}/quantized", fq.quantize(weight))
    else:
        quantize = ir.node("QuantizeLinear", [x, scale, zero_point], axis, name=f"{name}/quantize")
        new.append(quantize)
        q = quantize.outputs[0]
    dequantize = ir.node("DequantizeLinear", [q, scale, zero_point], axis, name=name)
    new.append(dequantize)
    graph.insert_after(node, new)
    replace_value(node.outputs[0], dequantize.outputs[0])
    dequantize.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    graph.remove(node, safe=True)
