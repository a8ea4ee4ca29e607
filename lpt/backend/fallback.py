"""Ops without an lpt kernel run through onnxruntime, one small session per node, built once.

This is the "maintained implementation" for the f32 remainder of the graph (Softmax,
LayerNormalization, ...) and for shape ops on integer tensors. Where onnxruntime has no
kernel for a type (some ops on int8), ONNX's reference implementation runs the node instead.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import helper
from onnx.reference import ReferenceEvaluator

from lpt.graph.constants import const_array
from lpt.reference import CUSTOM_OPS


def _value_info(value: ir.Value) -> onnx.ValueInfoProto:
    # Shapes are left out on purpose: the plan runs any batch size.
    return helper.make_tensor_value_info(value.name, int(value.dtype), None)


def node_model(node: ir.Node, opsets: dict[str, int]) -> tuple[onnx.ModelProto, list[str]]:
    """A model holding just `node`; constant inputs become initializers. Returns it and its runtime inputs."""
    inputs, initializers = [], []
    for value in node.inputs:
        if value is None:
            continue
        array = const_array(value)
        if array is not None:
            initializers.append(onnx.numpy_helper.from_array(array, value.name))
        elif value.name not in [i.name for i in inputs]:
            inputs.append(_value_info(value))
    graph = helper.make_graph([ir.serde.serialize_node(node)], node.name or node.op_type, inputs,
                              [_value_info(v) for v in node.outputs], initializers)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    standard = [o for o in proto.opset_import if o.domain in ("", "ai.onnx")]
    proto.ir_version = max(7, helper.find_min_ir_version_for(standard, ignore_unknown=True))
    return proto, [i.name for i in inputs]


class NodeRunner:
    """Runs one node with onnxruntime, or ONNX's reference evaluator where onnxruntime can't."""

    def __init__(self, node: ir.Node, opsets: dict[str, int], threads: int = 1):
        proto, self.input_names = node_model(node, opsets)
        self.output_names = [v.name for v in node.outputs]
        self.backend = "onnxruntime"
        try:
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            # Idle onnxruntime threads spin by default, and would steal the cores the int8
            # kernels' BLAS threads run on between two fallback ops.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            self._session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
            self._run = lambda feeds: self._session.run(self.output_names, feeds)
        except Exception:  # noqa: BLE001 - e.g. NOT_IMPLEMENTED for an integer type
            self.backend = "onnx reference"
            evaluator = ReferenceEvaluator(proto, new_ops=CUSTOM_OPS)
            self._run = lambda feeds: evaluator.run(self.output_names, feeds)

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        return self._run(dict(zip(self.input_names, arrays)))
