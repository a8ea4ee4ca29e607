"""Integer arithmetic on constants, computed once when a plan is compiled.

Exporters write shape computations out even where every value they read is a constant:
silero_vad_16k_op15's STFT pads its input by Shape([0, 64]) → Gather → Sub → ConstantOfShape → Concat →
Reshape → Slice → Transpose → Reshape → Cast, and slices its frequencies with bounds Unsqueezed from
scalars. Left in, such nodes make their readers' parameters look computed at run time, and those
readers (a reflection Pad, Slices) stayed in an onnxruntime region with them.

Here each node whose inputs are all constants and whose outputs are integers or booleans becomes its
outputs, as initializers: integer arithmetic has no rounding, so onnxruntime would have computed the same
values at every run. Float results stay nodes (the plan decides where float32 ops run and how), and so do
the ops that make new values at each run, quantizations (lpt's int8 steps read those as they are) and
nodes holding subgraphs.
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
_KEPT = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "RandomNormal", "RandomUniform",
         "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial")
MAX_VALUES = 1 << 16  # a result larger than this stays a node: shape arithmetic is far smaller


def fold_integer_constants(model: ir.Model) -> int:
    """Replace the foldable nodes of `model`'s main graph (see the module doc) by their results; how many."""
    graph, folded = model.graph, 0
    opsets = [onnx.helper.make_opsetid(domain, version) for domain, version in model.opset_imports.items()]
    for node in list(graph):
        inputs = [const_array(v) if v is not None else None for v in node.inputs]
        if not _foldable(node, inputs):
            continue
        try:
            results = _evaluate(node, inputs, opsets)
        except Exception as why:  # noqa: BLE001 - what the reference evaluator cannot compute, the plan runs
            logger.info("%s (%s) is not folded: %s", node.name, node.op_type, why)
            continue
        if any(np.asarray(r).size > MAX_VALUES for r in results):
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


def _foldable(node: ir.Node, inputs: list) -> bool:
    return (node.domain in ("", "ai.onnx") and node.op_type not in ("Constant", *_KEPT)
            and all(array is not None for v, array in zip(node.inputs, inputs) if v is not None)
            and bool(node.outputs) and all(v.dtype in _INTEGERS and not v.is_graph_output() for v in node.outputs)
            and not any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
                        for a in node.attributes.values()))


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
