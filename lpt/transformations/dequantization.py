"""The dequantization value object, q → Cast(f32) → [Sub(shift)] → Mul(scale), and the moves on it.

This is OpenVINO's Convert → Subtract → Multiply written in ONNX. The transformations move it
down the graph, past ops that can work on the integer tensor instead of the float one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from lpt.graph.constants import add_constant, const_array
from lpt.graph.rewrite import remove_unused, take_name

_INTEGER_TYPES = (ir.DataType.UINT8, ir.DataType.INT8, ir.DataType.INT32, ir.DataType.UINT16, ir.DataType.INT16)


def _producer(value: ir.Value | None, op_type: str) -> ir.Node | None:
    node = value.producer() if value is not None else None
    return node if node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx") else None


@dataclass(frozen=True, eq=False)
class Dequantization:
    """An integer tensor `data` read as float: scale · (data − shift)."""

    data: ir.Value
    scale: np.ndarray
    shift: np.ndarray | None
    nodes: tuple[ir.Node, ...]  # Cast, [Sub], Mul

    @classmethod
    def of(cls, value: ir.Value | None) -> Dequantization | None:
        """The dequantization producing `value`, if it is one."""
        multiply = _producer(value, "Mul")
        if multiply is None:
            return None
        scale = const_array(multiply.inputs[1])
        subtract = _producer(multiply.inputs[0], "Sub")
        shift = const_array(subtract.inputs[1]) if subtract is not None else None
        convert = _producer(subtract.inputs[0] if subtract is not None else multiply.inputs[0], "Cast")
        if scale is None or convert is None or (subtract is not None and shift is None):
            return None
        data = convert.inputs[0]
        if data.dtype not in _INTEGER_TYPES or convert.attributes["to"].as_int() != ir.DataType.FLOAT:
            return None
        nodes = (convert, subtract, multiply) if subtract is not None else (convert, multiply)
        return cls(data, scale.astype(np.float32), None if shift is None else shift.astype(np.float32), nodes)

    @property
    def output(self) -> ir.Value:
        return self.nodes[-1].outputs[0]

    @property
    def is_accumulator(self) -> bool:
        """Whether `data` is a Conv/MatMul's int32 sum: what follows it belongs to that layer's f32 output stage."""
        return self.data.dtype == ir.DataType.INT32

    @property
    def is_per_tensor(self) -> bool:
        return self.scale.size == 1 and (self.shift is None or self.shift.size == 1)

    @property
    def zero_point(self) -> np.ndarray | None:
        """The shift as integers, or None when it is not integral (it then stays an f32 Subtract)."""
        if self.shift is None:
            return np.zeros((), np.int32)
        rounded = np.round(self.shift)
        return rounded.astype(np.int32) if np.array_equal(rounded, self.shift) else None

    def channel_axis(self, rank: int) -> int | None:
        """The one axis scale/shift vary along (None when per tensor or along several)."""
        shapes = [self.scale.shape] + ([self.shift.shape] if self.shift is not None else [])
        axes = {rank - len(s) + d for s in shapes for d, n in enumerate(s) if n > 1}
        return axes.pop() if len(axes) == 1 else None


def insert_dequantization(graph: ir.Graph, data: ir.Value, scale, shift, *, after: ir.Node, name: str) -> ir.Value:
    """Add data → Cast → [Sub(shift)] → Mul(scale) after `after`; return the float output."""
    convert = ir.node("Cast", [data], {"to": ir.DataType.FLOAT}, name=f"{name}/convert")
    nodes = [convert]
    value = convert.outputs[0]
    if shift is not None and np.any(shift != 0):
        subtract = ir.node("Sub", [value, add_constant(graph, f"{name}/shift", np.asarray(shift, np.float32))],
                           name=f"{name}/subtract")
        nodes.append(subtract)
        value = subtract.outputs[0]
    multiply = ir.node("Mul", [value, add_constant(graph, f"{name}/scale", np.asarray(scale, np.float32))],
                       name=f"{name}/multiply")
    nodes.append(multiply)
    for node in nodes:
        node.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
        node.outputs[0].shape = data.shape
        node.outputs[0].name = node.name
    graph.insert_after(after, nodes)
    return multiply.outputs[0]


def move_after(node: ir.Node, dequantizations: dict[int, Dequantization], scale, shift,
               outputs: tuple[int, ...] = (0,)) -> None:
    """Rewire `node` to read the integer tensors and re-apply a dequantization after it.

    `dequantizations` maps input index → the dequantization feeding it. Each output in
    `outputs` (the first; every one of a Split) becomes an integer tensor of the first
    dequantization's type, read through the new (`scale`, `shift`), and the dequantized value
    keeps the output's name.
    """
    graph = node.graph
    first = next(iter(dequantizations.values()))
    for index, dq in dequantizations.items():
        node.replace_input_with(index, dq.data)
    for position in outputs:
        out = node.outputs[position]
        out.type = ir.TensorType(first.data.dtype)
        users = list(out.uses())
        was_output = out.is_graph_output()
        if not users and not was_output:
            continue
        new = insert_dequantization(graph, out, scale, shift, after=node,
                                    name=f"{node.name or out.name}/dequantize{position or ''}")
        for user, index in users:
            user.replace_input_with(index, new)
        if was_output:
            graph.outputs[graph.outputs.index(out)] = new
        take_name(new, out)
        out.name = f"{new.name}/quantized"
    node.doc_string = None
    for dq in dequantizations.values():
        remove_unused(graph, reversed(dq.nodes))
