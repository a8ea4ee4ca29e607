"""QuantizeLinear → DequantizeLinear pairs, and DequantizeLinear of an integer constant, to FakeQuantize.

    x → QuantizeLinear(s, zp) → DequantizeLinear(s, zp) → ...   ⇒   x → FakeQuantize(s, zp) → ...
    w_q (int constant) → DequantizeLinear(s, zp) → ...          ⇒   w (f32 constant) → FakeQuantize(s, zp) → ...
    b_q (int32 constant) → DequantizeLinear(s) → ...            ⇒   b (f32 constant) → ...

An int32 constant is a bias quantized for an integer kernel (onnxruntime's QDQ format): it is
not fake-quantized, only stored as integers, so it becomes the f32 values it stands for.

The FakeQuantize keeps QDQ semantics (scale and zero point as inputs), so outputs stay
bit-exact. A QuantizeLinear with consumers other than matching DequantizeLinear nodes is left
alone (logged with the reason), as is blocked quantization (opset 21 `block_size`).
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir

from lpt.graph.constants import add_constant, const_array
from lpt.graph.fake_quantize_op import FakeQuantize
from lpt.graph.rewrite import remove_unused, replace_value
from lpt.numerics import dequantize_linear

logger = logging.getLogger(__name__)

_ONNX = ("", "ai.onnx")


def _is(node: ir.Node | None, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in _ONNX


def _params(node: ir.Node) -> tuple[np.ndarray, np.ndarray, int] | str:
    """(scale, zero_point, axis) of a Q or DQ node, or the reason they can't be used."""
    if "block_size" in node.attributes and node.attributes["block_size"].as_int() != 0:
        return "blocked quantization (block_size) is not supported"
    scale = const_array(node.inputs[1])
    if scale is None:
        return "scale is not a constant"
    zp_value = node.inputs[2] if len(node.inputs) > 2 else None
    if zp_value is not None:
        zero_point = const_array(zp_value)
        if zero_point is None:
            return "zero point is not a constant"
    else:
        # ONNX: no zero point means 0 of the integer type: DequantizeLinear's input type,
        # QuantizeLinear's output_dtype (opset 21), else uint8.
        dtype = np.uint8
        if node.op_type == "DequantizeLinear" and node.inputs[0].dtype is not None:
            dtype = node.inputs[0].dtype.numpy()
        elif "output_dtype" in node.attributes:
            dtype = ir.DataType(node.attributes["output_dtype"].as_int()).numpy()
        zero_point = np.zeros(scale.shape, dtype)
    if zero_point.dtype not in (np.uint8, np.int8, np.uint16, np.int16):
        return f"zero point type {zero_point.dtype} is not an integer type lpt quantizes to"
    axis = node.attributes["axis"].as_int() if "axis" in node.attributes else 1
    return scale.astype(np.float32), zero_point, axis


def _same(a, b) -> bool:
    return (a[2] == b[2] or a[0].size == 1) and all(
        np.array_equal(x, y) and x.dtype == y.dtype for x, y in zip(a[:2], b[:2])
    )


class QdqToFakeQuantize(ir.passes.InPlacePass):
    """Fold QDQ pairs and dequantized integer constants into lpt::FakeQuantize nodes."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
            if node.graph is None:  # removed earlier in this loop
                continue
            if _is(node, "QuantizeLinear"):
                modified |= self._try_fuse_pair(node)
            elif _is(node, "DequantizeLinear") and const_array(node.inputs[0]) is not None:
                if node.inputs[0].dtype == ir.DataType.INT32:
                    modified |= self._fold_int32_bias(node)
                else:
                    modified |= self._try_fold_constant(node)
        if modified:
            model.opset_imports.setdefault("lpt", 1)
        return ir.passes.PassResult(model, modified)

    def _try_fuse_pair(self, quantize: ir.Node) -> bool:
        params = _params(quantize)
        consumers = list(quantize.outputs[0].consumers())
        reason = params if isinstance(params, str) else None
        if reason is None and (not consumers or quantize.outputs[0].is_graph_output()):
            reason = "its integer output is used directly"
        for dq in consumers:
            if reason:
                break
            if not _is(dq, "DequantizeLinear"):
                reason = f"consumer {dq.name!r} is {dq.op_type}, not DequantizeLinear"
            elif isinstance(dq_params := _params(dq), str) or not _same(params, dq_params):
                reason = f"DequantizeLinear {dq.name!r} uses other parameters"
        if reason:
            logger.info("QuantizeLinear %r kept: %s", quantize.name, reason)
            return False
        x = quantize.inputs[0]
        scale, zero_point, axis = params
        rank = len(x.shape) if x.shape is not None else None
        if scale.size > 1 and rank is None:
            logger.info("QuantizeLinear %r kept: per-axis and the input's rank is unknown", quantize.name)
            return False
        graph = quantize.graph
        fq = FakeQuantize.from_qdq(scale, zero_point, axis=axis, rank=rank)
        node = fq.make_node(graph, x, name=quantize.name or f"{x.name}/fake_quantize")
        graph.insert_after(quantize, node)
        for i, dq in enumerate(consumers):
            replace_value(dq.outputs[0], node.outputs[0], keep_name=i == 0)
        remove_unused(graph, consumers + [quantize])
        return True

    def _try_fold_constant(self, dq: ir.Node) -> bool:
        params = _params(dq)
        if isinstance(params, str):
            logger.info("DequantizeLinear %r kept: %s", dq.name, params)
            return False
        q_value = dq.inputs[0]
        q = const_array(q_value)
        scale, zero_point, axis = params
        graph = dq.graph
        # A symmetric constant that never uses -128 is what narrow-range (levels 255) weights look like.
        narrow = zero_point.dtype == np.int8 and not zero_point.any() and q.min() >= -127
        fq = FakeQuantize.from_qdq(scale, zero_point, axis=axis, rank=q.ndim, levels=255 if narrow else None)
        weight = add_constant(graph, f"{q_value.name}/dequantized",
                              dequantize_linear(q, scale, zero_point, axis=axis))
        node = fq.make_node(graph, weight, name=dq.name or f"{weight.name}/fake_quantize")
        graph.insert_after(dq, node)
        replace_value(dq.outputs[0], node.outputs[0])
        remove_unused(graph, [dq])
        _remove_unused_initializer(graph, q_value)
        return True


    def _fold_int32_bias(self, dq: ir.Node) -> bool:
        q_value = dq.inputs[0]
        scale = const_array(dq.inputs[1])
        zero_point = const_array(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] is not None else None
        axis = dq.attributes["axis"].as_int() if "axis" in dq.attributes else 1
        if scale is None or (len(dq.inputs) > 2 and dq.inputs[2] is not None and zero_point is None):
            return False
        graph = dq.graph
        bias = add_constant(graph, f"{q_value.name}/dequantized",
                            dequantize_linear(const_array(q_value), scale, zero_point, axis=axis))
        replace_value(dq.outputs[0], bias)
        graph.remove(dq, safe=True)
        _remove_unused_initializer(graph, q_value)
        return True


def _remove_unused_initializer(graph: ir.Graph, value: ir.Value | None) -> None:
    if value is not None and value.is_initializer() and not value.uses() and value.name in graph.initializers:
        del graph.initializers[value.name]
