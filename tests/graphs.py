"""Declarative builders for the small test graphs, and helpers to run them."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import helper, numpy_helper

from lpt.kernels.int8_gemm import exact_routes

FLOAT = onnx.TensorProto.FLOAT


def model(nodes, inputs, outputs, initializers=None, opset=13, extra_opsets=None, extra_inputs=None,
          checked=True) -> onnx.ModelProto:
    """An ONNX model; `inputs`/`outputs` are {name: shape} of float tensors, `initializers` {name: array},
    `extra_inputs` {name: element type} of scalar inputs of another type. `checked`: with onnx's shape
    inference and checker (which refuse an If whose branches give outputs of different ranks)."""
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info(n, FLOAT, s) for n, s in inputs.items()]
        + [helper.make_tensor_value_info(n, t, []) for n, t in (extra_inputs or {}).items()],
        [helper.make_tensor_value_info(n, FLOAT, s) for n, s in outputs.items()],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in (initializers or {}).items()],
    )
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    proto = helper.make_model(graph, opset_imports=opsets)
    proto.ir_version = 8 if opset < 21 else 10  # what onnxruntime accepts
    if checked:
        proto = onnx.shape_inference.infer_shapes(proto)  # fills the output shapes left as None
        onnx.checker.check_model(proto)
    return proto


def ir_model(proto: onnx.ModelProto) -> ir.Model:
    return ir.serde.deserialize_model(proto)


def run_ort(proto: onnx.ModelProto | ir.Model, feeds: dict) -> list[np.ndarray]:
    """Outputs from onnxruntime with graph optimizations off: its QDQ fusions (DequantizeLinear +
    MatMul → dynamically quantized MatMul) would change the numbers being compared."""
    if isinstance(proto, ir.Model):
        from lpt.model_io import to_proto

        proto = to_proto(proto)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


# Whether onnxruntime's own u8 × s8 kernels (QLinearConv, ConvInteger, QDQ fusions) are exact on this CPU:
# without VNNI they saturate pair sums in int16, and only the exact reference stands for the integer op.
ONNXRUNTIME_INT8_IS_EXACT = "u8s8" in exact_routes()


def op_types(model: ir.Model | onnx.ModelProto) -> list[str]:
    nodes = model.graph.node if isinstance(model, onnx.ModelProto) else model.graph
    return [n.op_type for n in nodes]


def tricky_inputs(shape, scale: float, zero_point: int = 0, seed: int = 0) -> np.ndarray:
    """Random values plus exact ties (k + 0.5)·scale and far out-of-range values."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 80 * scale, size=shape).astype(np.float32)
    flat = x.reshape(-1)
    n = flat.size
    flat[: n // 4] = ((rng.integers(-140, 140, n // 4) + 0.5 - zero_point) * scale).astype(np.float32)
    flat[n // 4 : n // 4 + 4] = [1e6, -1e6, 0.0, -0.0]
    return x
