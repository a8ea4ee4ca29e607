"""Shape arithmetic and data movement between lpt's steps, as NumPy steps (no native instruction).

Exported models compute a Reshape's target from the tensor itself (Shape → Gather → Unsqueeze →
Concat → Reshape) and pick a state's rows by constant indices. Left
to onnxruntime, each such run between lpt's steps is a session call: 0.03-0.3 ms each on
plcmos_v2, against a few microseconds for a NumPy step. They move values and do no arithmetic, so
they give onnxruntime's results:

    Shape (start, end)              the input's dimensions, int64
    Gather (constant indices)       numpy's take, of any type (a constant table's is float_steps')
    Concat (any axis, any type)     numpy's concatenate (float_steps' takes the channels natively)
    Reshape (a computed target)     numpy's reshape, with ONNX's 0 and −1
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from lpt.backend.int8_steps import _step, onnx_reshape_dims
from lpt.errors import DataError
from lpt.graph.constants import const_array
from lpt.graph.ops import attribute


def try_shape_step(node: ir.Node, backend: str) -> tuple | None:
    """The NumPy step for one of the ops above, or None."""
    if node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] is None:
        return None
    if node.op_type == "Shape":
        return _shape(node, backend)
    if node.op_type == "Gather" and len(node.inputs) == 2 and node.inputs[1] is not None:
        return _gather(node, backend)
    if node.op_type == "Concat" and all(v is not None for v in node.inputs) and attribute(node, "axis") is not None:
        axis = attribute(node, "axis")
        return _step(lambda *parts: [np.concatenate(parts, axis=axis)], list(node.inputs), [node], backend=backend)
    if node.op_type == "Reshape" and len(node.inputs) == 2 and node.inputs[1] is not None:
        return _reshape(node, backend)
    return None


def _shape(node: ir.Node, backend: str) -> tuple:
    start, end = attribute(node, "start", 0), attribute(node, "end")  # opset 15: a slice of the dimensions
    return _step(lambda a: [np.array(np.shape(a)[start:end], np.int64)], [node.inputs[0]], [node], backend=backend)


def _gather(node: ir.Node, backend: str) -> tuple | None:
    indices = const_array(node.inputs[1])
    if indices is None or const_array(node.inputs[0]) is not None:
        return None
    axis, name = attribute(node, "axis", 0), node.name

    def gather(a):
        a = np.asarray(a)
        size = a.shape[axis]
        if indices.size and (indices.min() < -size or indices.max() >= size):
            raise DataError(f"node {name!r} (Gather): an index outside [{-size}, {size - 1}] along axis {axis}")
        return [np.take(a, indices, axis=axis)]

    return _step(gather, [node.inputs[0]], [node], backend=backend)


def _reshape(node: ir.Node, backend: str) -> tuple:
    allow_zero, name = bool(attribute(node, "allowzero", 0)), node.name

    def reshape(a, shape):
        target = tuple(int(d) for d in np.reshape(shape, -1))
        try:
            return [np.reshape(a, onnx_reshape_dims(np.shape(a), target, allow_zero))]
        except ValueError:
            raise DataError(f"node {name!r} (Reshape): {list(np.shape(a))} cannot take the shape {list(target)}") from None

    return _step(reshape, list(node.inputs), [node], backend=backend)
