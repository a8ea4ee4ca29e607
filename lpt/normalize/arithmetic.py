"""FakeQuantize written out in elementwise arithmetic ⇒ lpt::FakeQuantize.

Two spellings frameworks without QDQ export write:

* quantize-dequantize: ``Div(s) → Round → [Add(zp)] → Clip(qmin, qmax) → [Sub(zp)] → Mul(s)``
  becomes a FakeQuantize with QDQ semantics (scale s, zero point zp); it computes the same
  float32 operations as QuantizeLinear → DequantizeLinear, so it stays exact.
* the FakeQuantize formula: ``Clip(lo, hi)`` (or ``Max(lo) → Min(hi)``) ``→ Sub(lo) → Div(step)
  → Round → Mul(step) → Add(lo)`` becomes an OpenVINO-semantics FakeQuantize with
  levels = (hi − lo)/step + 1; equal up to the chain's own float32 rounding.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir

from lpt.graph.constants import const_array
from lpt.graph.fake_quantize_op import DOMAIN, FakeQuantize, integer_range
from lpt.graph.rewrite import remove_unused, replace_value

logger = logging.getLogger(__name__)


def _next(value: ir.Value, op_type: str) -> ir.Node | None:
    """The only consumer of `value`, if it is an `op_type` node and `value` is not a graph output."""
    users = list(value.consumers())
    if len(users) != 1 or value.is_graph_output():
        return None
    node = users[0]
    return node if node.op_type == op_type and node.domain in ("", "ai.onnx") else None


def _prev(value: ir.Value, op_type: str) -> ir.Node | None:
    node = value.producer()
    if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx"):
        return None
    return node if len(list(value.consumers())) == 1 and not value.is_graph_output() else None


def _operand(node: ir.Node, chain_input: ir.Value) -> np.ndarray | None:
    """The constant operand of a binary node whose other input is `chain_input`."""
    if node.inputs[0] is not chain_input:
        return None
    return const_array(node.inputs[1])


def _clip_bounds(node: ir.Node) -> tuple[np.ndarray, np.ndarray] | None:
    if len(node.inputs) >= 3 and node.inputs[1] is not None and node.inputs[2] is not None:
        low, high = const_array(node.inputs[1]), const_array(node.inputs[2])
        return None if low is None or high is None else (low, high)
    if "min" in node.attributes and "max" in node.attributes:  # opset < 11
        return np.float32(node.attributes["min"].as_float()), np.float32(node.attributes["max"].as_float())
    return None


class ArithmeticToFakeQuantize(ir.passes.InPlacePass):
    """Replace the two arithmetic spellings of fake quantization with lpt::FakeQuantize."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
            if node.graph is not None and node.op_type == "Round" and node.domain in ("", "ai.onnx"):
                modified |= self._try_qdq_chain(node) or self._try_formula_chain(node)
        if modified:
            model.opset_imports.setdefault(DOMAIN, 1)
        return ir.passes.PassResult(model, modified)

    def _try_qdq_chain(self, round_node: ir.Node) -> bool:
        div = _prev(round_node.inputs[0], "Div")
        if div is None:
            return False
        x, scale = div.inputs[0], const_array(div.inputs[1])
        nodes, zero_point = [div, round_node], np.float32(0)
        value = round_node.outputs[0]
        if add := _next(value, "Add"):
            zero_point, value = _operand(add, value), add.outputs[0]
            nodes.append(add)
        clip = _next(value, "Clip")
        bounds = _clip_bounds(clip) if clip else None
        if scale is None or zero_point is None or bounds is None:
            return False
        nodes.append(clip)
        value = clip.outputs[0]
        if len(nodes) == 4 and (sub := _next(value, "Sub")):
            if not np.array_equal(_operand(sub, value), zero_point):
                return False
            value = sub.outputs[0]
            nodes.append(sub)
        mul = _next(value, "Mul")
        if mul is None or not np.array_equal(_operand(mul, value), scale):
            return False
        nodes.append(mul)
        qmin, qmax = (int(b) for b in bounds)
        signed = qmin < 0
        levels = qmax - qmin + 1
        if integer_range(levels, signed) != (qmin, qmax) or not np.array_equal(zero_point, np.round(zero_point)):
            logger.info("quantize chain at %r kept: clip [%d, %d] is not an 8/16-bit integer range", round_node.name, qmin, qmax)
            return False
        dtype = np.int8 if signed else np.uint8
        if levels > 256:
            dtype = np.int16 if signed else np.uint16
        zp = np.broadcast_to(zero_point, np.shape(scale)).astype(dtype)
        rank = len(x.shape) if x.shape is not None else None
        axis = _axis_of(scale, rank)
        if axis is None:
            return False
        fq = FakeQuantize.from_qdq(scale.reshape(-1) if scale.size > 1 else scale.reshape(()),
                                   zp.reshape(-1) if zp.size > 1 else zp.reshape(()),
                                   axis=axis, rank=rank, levels=levels)
        return self._replace(nodes, fq, x)

    def _try_formula_chain(self, round_node: ir.Node) -> bool:
        div = _prev(round_node.inputs[0], "Div")
        sub = _prev(div.inputs[0], "Sub") if div else None
        if sub is None:
            return False
        low, step = const_array(sub.inputs[1]), const_array(div.inputs[1])
        nodes = [sub, div, round_node]
        crop = sub.inputs[0]
        clip = _prev(crop, "Clip")
        if clip is not None:
            bounds, x = _clip_bounds(clip), clip.inputs[0]
            nodes.insert(0, clip)
        else:
            minimum = _prev(crop, "Min")
            maximum = _prev(minimum.inputs[0], "Max") if minimum else None
            if maximum is None:
                return False
            bounds = const_array(maximum.inputs[1]), const_array(minimum.inputs[1])
            x = maximum.inputs[0]
            nodes[:0] = [maximum, minimum]
        mul = _next(round_node.outputs[0], "Mul")
        add = _next(mul.outputs[0], "Add") if mul else None
        if add is None or low is None or step is None or bounds is None or any(b is None for b in bounds):
            return False
        lo, hi = (np.asarray(b, np.float32) for b in bounds)
        if not (np.array_equal(_operand(mul, round_node.outputs[0]), step)
                and np.array_equal(_operand(add, mul.outputs[0]), low) and np.array_equal(lo, low)):
            return False
        steps = (hi.astype(np.float64) - lo) / step
        levels = int(np.round(steps).max()) + 1
        if not np.allclose(steps, levels - 1, rtol=1e-4) or not 2 <= levels <= 65536:
            logger.info("FakeQuantize formula at %r kept: (hi - lo)/step is not one integer", round_node.name)
            return False
        fq = FakeQuantize(lo, hi, lo, hi, levels)
        return self._replace(nodes + [mul, add], fq, x)

    def _replace(self, chain: list[ir.Node], fq: FakeQuantize, x: ir.Value) -> bool:
        graph = chain[0].graph
        last = chain[-1].outputs[0]
        node = fq.make_node(graph, x, name=chain[-1].name or f"{x.name}/fake_quantize")
        graph.insert_after(chain[-1], node)
        replace_value(last, node.outputs[0])
        remove_unused(graph, reversed(chain))
        return True


def _axis_of(scale: np.ndarray, rank: int | None) -> int | None:
    """The axis a broadcastable per-channel constant varies along (1 for a scalar)."""
    if scale.size == 1:
        return 1
    if rank is None:
        return None
    dims = [d for d, n in enumerate((1,) * (rank - scale.ndim) + scale.shape) if n > 1]
    return dims[0] if len(dims) == 1 else None
