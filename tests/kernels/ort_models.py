"""One-node ONNX models run in onnxruntime, for cross-checking the kernels on random data."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper


def run_node(op_type: str, inputs: dict[str, np.ndarray], output_dtype, attributes: dict | None = None,
             opset: int = 13) -> np.ndarray:
    """The output of `op_type` on `inputs` (in the op's input order), in onnxruntime with graph optimizations off."""
    node = helper.make_node(op_type, list(inputs), ["y"], **(attributes or {}))
    graph = helper.make_graph(
        [node], op_type,
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for name, a in inputs.items()],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(output_dtype)), None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)  # fills the output shape, checks the node
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, inputs)[0]
