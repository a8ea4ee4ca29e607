"""Op families shared by inspection, calibration and the transformations, and reading a node's attributes."""

import onnx_ir as ir

# Ops whose cost int8 saves: each should read fake-quantized activations and weights.
QUANTIZABLE_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")

# Ops whose integer output keeps the input's quantization: they only move, select or compare
# values, so one FakeQuantize before them serves the ops after them too.
PRECISION_PRESERVING_OPS = (
    "MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Split", "Pad",
    "Resize", "DepthToSpace", "SpaceToDepth", "Gather", "Identity",
)

# Ops that say a model is quantized already (statically, or dynamically as onnxruntime's
# quantize_dynamic writes it: DynamicQuantizeLinear + ConvInteger/MatMulInteger).
QUANTIZED_OPS = ("QuantizeLinear", "DequantizeLinear", "FakeQuantize", "QLinearConv", "QLinearMatMul",
                 "ConvInteger", "MatMulInteger", "DynamicQuantizeLinear")


def attribute(node: ir.Node, name: str, default=None):
    """The value of `node`'s attribute `name`, or `default` when the node does not set it."""
    return node.attributes[name].value if name in node.attributes else default
