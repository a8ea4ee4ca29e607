"""op(DQ(q)) ⇒ DQ(op(q)) for ops that only move, select or compare values (MaxPool, Reshape, ...).

Such an op gives the same result on the integers as on the floats, as long as the
dequantization is the same everywhere the op moves values: a per-tensor dequantization
always is; a per-channel one only while the op keeps the channel axis where it was (MaxPool,
Resize, Identity, Transpose with the scale permuted). MaxPool also needs positive scales,
and Pad a pad value that is a level of the integer grid.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from lpt.graph.constants import add_constant, const_array
from lpt.transformations.base import Check, LayerTransformation
from lpt.transformations.dequantization import Dequantization, move_after

# Ops that keep every axis where it is, so per-channel scales ride along unchanged.
_KEEP_AXES = ("MaxPool", "Resize", "Identity")
_MOVE_ONLY = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Split", "Gather", "DepthToSpace", "SpaceToDepth",
              "Pad")


class MoveThroughPrecisionPreserved(LayerTransformation):
    """Move a dequantization from an op's data input to after the op."""

    op_types = _KEEP_AXES + _MOVE_ONLY + ("Transpose",)
    precision_preserved = True

    def can_be_transformed(self, node: ir.Node) -> Check:
        dq = Dequantization.of(node.inputs[0])
        if dq is None:
            return Check.fail("input is not dequantized")
        if node.op_type != "Split" and any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
            return Check.fail("a second output (indices) is used")
        if node.op_type == "MaxPool" and dq.is_accumulator:
            return Check.fail("an int32 accumulator: MaxPool has no int32 form in ONNX")
        if node.op_type == "MaxPool" and np.any(dq.scale <= 0):
            return Check.fail("a non-positive scale reverses the order MaxPool picks by")
        if node.op_type == "Resize" and _attr(node, "mode", "nearest") != "nearest":
            return Check.fail("Resize interpolates (only nearest picks existing values)")
        if not dq.is_per_tensor and node.op_type in _MOVE_ONLY:
            return Check.fail(f"per-channel dequantization cannot follow the channel axis through {node.op_type}")
        if node.op_type == "Pad":
            return self._check_pad(node, dq)
        return Check.ok()

    def _check_pad(self, node: ir.Node, dq: Dequantization) -> Check:
        if _attr(node, "mode", "constant") != "constant":
            return Check.ok()  # edge/reflect copy existing values
        pad_value = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else np.float32(0)
        if pad_value is None:
            return Check.fail("the pad value is not a constant")
        level = pad_value / dq.scale + (0 if dq.shift is None else dq.shift)
        if not np.array_equal(level, np.round(level)):
            return Check.fail("the pad value is not a level of the integer grid")
        if np.unique(level).size > 1:
            return Check.fail("the pad value is a different level in each channel")
        return Check.ok()

    def transform(self, node: ir.Node) -> None:
        dq = Dequantization.of(node.inputs[0])
        scale, shift = dq.scale, dq.shift
        if node.op_type == "Transpose" and not dq.is_per_tensor:
            scale, shift = (_permute(a, node, dq.output) if a is not None else None for a in (scale, shift))
        if node.op_type == "Pad" and _attr(node, "mode", "constant") == "constant":
            # The pad value (0 when not given) becomes its level: the zero point, for 0.0.
            given = len(node.inputs) > 2 and node.inputs[2] is not None
            pad_value = const_array(node.inputs[2]) if given else np.float32(0)
            level = np.unique(pad_value / dq.scale + (0 if dq.shift is None else dq.shift))
            if len(node.inputs) < 3:
                node.resize_inputs(3)
            node.replace_input_with(2, add_constant(node.graph, f"{node.name}/pad_level",
                                                    np.round(level).astype(dq.data.dtype.numpy()).reshape(())))
        outputs = tuple(range(len(node.outputs))) if node.op_type == "Split" else (0,)
        move_after(node, {0: dq}, scale, shift, outputs)


def _attr(node: ir.Node, name: str, default):
    attribute = node.attributes.get(name)
    if attribute is None:
        return default
    value = attribute.value
    return value.decode() if isinstance(value, bytes) else value


def _permute(array: np.ndarray, node: ir.Node, value: ir.Value) -> np.ndarray:
    rank = len(value.shape)
    full = array.reshape((1,) * (rank - array.ndim) + array.shape)
    perm = _attr(node, "perm", None) or list(reversed(range(rank)))
    return np.transpose(full, perm)
