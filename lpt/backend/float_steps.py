"""The float32 ops between int8 layers, as steps of lpt's own, so that a network stays in one native program.

A model quantized around its convolutions leaves a few float32 ops between them: an average pool
after a ReLU that only the pool's output quantizes, a squeeze-excite's scale (x · sigmoid(...)), a
HardSwish, a Concat of two layers' float outputs, a global average before the classifier. Run by
onnxruntime, each is a session call (about 0.02 ms) and cuts the native program in two. Taken here,
each is a step with lpt.kernels' float32 function and the native engine's instruction that computes
the same bits:

    GlobalAveragePool            kernels.global_average_pool      "mean"
    AveragePool (2-D, floor)     kernels.average_pool             "average_pool"
    HardSwish                    kernels.hard_swish               "hard_swish"
    Mul, Add                     numpy's · or +                   "binary" (same shapes, or [N, C, 1, 1])
    Concat (channels)            numpy's concatenate              "concat"

The plan takes such a node only where int8 steps (or steps of this module) make every tensor it reads
at run time; elsewhere float32 regions stay with onnxruntime. onnxruntime computes the same bits,
except for the sums of the two averages, which it adds in its own order (kernels.float_ops says where).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from lpt import kernels
from lpt.backend.chains import attribute
from lpt.backend.int8_steps import _step

_FLOAT = ir.DataType.FLOAT
BACKEND = "lpt float32"  # Step.backend: float32 ops, not int8 kernels, and not onnxruntime's


def _float_step(run, inputs, node, native) -> tuple:
    return _step(run, inputs, [node], native=native, backend=BACKEND)


def try_float_step(node: ir.Node) -> tuple | None:
    """The step for a float32 op between int8 layers (the table above), or None where lpt does not take it."""
    if node.domain not in ("", "ai.onnx") or not node.inputs or any(v is None or v.dtype != _FLOAT for v in node.inputs):
        return None
    x = node.inputs[0]
    if node.op_type == "GlobalAveragePool":
        return _float_step(lambda a: [kernels.global_average_pool(a)], [x], node, ("mean", None))
    if node.op_type == "HardSwish":
        return _float_step(lambda a: [kernels.hard_swish(a)], [x], node, ("hard_swish", None))
    if node.op_type == "AveragePool":
        return _average_pool(node)
    if node.op_type in ("Mul", "Add") and len(node.inputs) == 2 and _engine_broadcasts(*node.inputs):
        multiply = node.op_type == "Mul"
        # asarray: numpy gives a scalar for two 0-d arrays (a dynamic quantization's scales)
        return _float_step(lambda a, b: [np.asarray(a * b if multiply else a + b)], list(node.inputs), node,
                           ("binary", "mul" if multiply else "add"))
    if node.op_type == "Concat" and x.shape is not None:
        axis = attribute(node, "axis", 1)
        if axis in (1, 1 - len(x.shape)) and len(x.shape) >= 2:
            return _float_step(lambda *parts: [np.concatenate(parts, axis=1)], list(node.inputs), node,
                               ("concat", None))
    return None


def _average_pool(node: ir.Node) -> tuple | None:
    kernel = attribute(node, "kernel_shape")
    if kernel is None or len(kernel) != 2 or attribute(node, "ceil_mode", 0) != 0:
        return None
    if attribute(node, "auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET") or any(d != 1 for d in attribute(node, "dilations", [1, 1])):
        return None
    strides = tuple(attribute(node, "strides", [1, 1]))
    pads = tuple(attribute(node, "pads", [0, 0, 0, 0]))
    include_pad = bool(attribute(node, "count_include_pad", 0))
    return _float_step(lambda a: [kernels.average_pool(a, kernel, strides, pads, include_pad)], [node.inputs[0]], node,
                       ("average_pool", (tuple(kernel), strides, pads, include_pad)))


def _engine_broadcasts(a: ir.Value, b: ir.Value) -> bool:
    """Whether the shapes are ones the engine's "binary" takes: the same, or one value per image and
    channel ([N, C, 1, ...]) over [N, C, *spatial]. Anything else would make the program give way at run time."""
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return False
    if tuple(a.shape) == tuple(b.shape):
        return True
    big, small = (a, b) if all(d == 1 for d in b.shape[2:]) else (b, a)
    return (len(big.shape) >= 3 and tuple(small.shape[:2]) == tuple(big.shape[:2])
            and all(d == 1 for d in small.shape[2:]))
