"""Integer arithmetic on constants, computed once when a plan is compiled.

Exporters write shape computations out even where every value they read is a constant:
silero_vad_16k_op15's STFT pads its input by Shape([0, 64]) → Gather → Sub → ConstantOfShape → Concat →
Reshape → Slice → Transpose → Reshape → Cast, and slices its frequencies with bounds Unsqueezed from
scalars. Left in, such nodes make their readers' parameters look computed at run time, and those
readers (a reflection Pad, Slices) stayed in an onnxruntime region with them.

Here each node whose inputs are all constants and whose outputs are integers or booleans becomes its
outputs, as initializers: integer arithmetic has no rounding, so onnxruntime would have computed the same
values at every run. Only the ops of shape arithmetic (_FOLDED), and only where the result is small
(MAX_VALUES, known before it is computed: a hostile ConstantOfShape must not fill the memory); float
results stay nodes (the plan decides where float32 ops run and how).
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator

from lpt.graph.constants import add_constant, const_array
from lpt.graph.rewrite import replace_value

logger = logging.getLogger(__name__)

_INTEGERS = (ir.DataType.INT64, ir.DataType.INT32, ir.DataType.INT16, ir.DataType.INT8, ir.DataType.UINT64,
             ir.DataType.UINT32, ir.DataType.UINT16, ir.DataType.UINT8, ir.DataType.BOOL)
# Ops whose result holds at most the product of their inputs' sizes (each counted as 2 at least: a Concat's)
_BOUNDED = ("Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Sign", "Min", "Max", "Equal", "Greater", "Less",
            "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Not", "Where", "Cast", "Identity", "Shape", "Size",
            "Gather", "Slice", "Concat", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Flatten", "ReduceProd",
            "ReduceSum", "ReduceMax", "ReduceMin")
_FOLDED = (*_BOUNDED, "ConstantOfShape", "Range")  # these two: their size computed from their inputs' values
MAX_VALUES = 1 << 16  # a result larger than this stays a node: shape arithmetic is far smaller


def fold_integer_constants(model: ir.Model) -> int:
    """Replace the foldable nodes of `model`'s main graph (see the module doc) by their results; how many."""
    graph, folded = model.graph, 0
    opsets = [onnx.helper.make_opsetid(domain, version) for domain, version in model.opset_imports.items()]
    for node in list(graph):
        if node.domain not in ("", "ai.onnx") or node.op_type not in _FOLDED or not node.outputs \
                or any(v.dtype not in _INTEGERS or v.is_graph_output() for v in node.outputs):
            continue
        inputs = [const_array(v) if v is not None else None for v in node.inputs]
        if any(array is None for v, array in zip(node.inputs, inputs) if v is not None) \
                or _result_size(node, [a for a in inputs if a is not None]) > MAX_VALUES:
            continue
        try:
            results = _evaluate(node, inputs, opsets)
        except Exception as why:  # noqa: BLE001 - what the reference evaluator cannot compute, the plan runs
            logger.info("%s (%s) is not folded: %s", node.name, node.op_type, why)
            continue
        for value, result in zip(node.outputs, results):
            result = np.asarray(result, dtype=value.dtype.numpy())
            replace_value(value, add_constant(graph, (value.name or node.op_type) + "/folded", result),
                          keep_name=False)
        graph.remove(node, safe=True)
        folded += 1
    if folded:
        logger.info("folded %d nodes of integer arithmetic on constants", folded)
    return folded


def _result_size(node: ir.Node, inputs: list[np.ndarray]) -> float:
    """A bound on the values `node`'s result holds (inf where its inputs do not bound it)."""
    try:
        if node.op_type == "ConstantOfShape":
            return float(np.prod(inputs[0].astype(np.float64))) if inputs and np.all(inputs[0] >= 0) else np.inf
        if node.op_type == "Range":
            start, limit, delta = (float(np.reshape(a, -1)[0]) for a in inputs)
            return max(0.0, np.ceil((limit - start) / delta)) if delta else np.inf
    except (ValueError, IndexError):  # not what ONNX's op reads: onnxruntime's error will say so
        return np.inf
    return float(np.prod([max(2, a.size) for a in inputs], dtype=np.float64))


def _evaluate(node: ir.Node, inputs: list, opsets: list) -> list:
    """`node`'s outputs for the constant `inputs`, by ONNX's reference evaluator (at the model's opsets)."""
    names = [f"input{i}" if v is not None else "" for i, v in enumerate(node.inputs)]
    outputs = [f"output{i}" for i in range(len(node.outputs))]
    proto = ir.serde.serialize_node(node)
    del proto.input[:], proto.output[:]
    proto.input.extend(names)
    proto.output.extend(outputs)
    feeds = {name: array for name, array in zip(names, inputs) if name}
    graph = onnx.helper.make_graph(
        [proto], "fold",
        [onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
         for name, array in feeds.items()],
        [onnx.helper.make_tensor_value_info(name, v.dtype.value, None) for name, v in zip(outputs, node.outputs)])
    evaluator = ReferenceEvaluator(onnx.helper.make_model(graph, opset_imports=opsets))
    return evaluator.run(None, feeds)
