"""What a model holds, for `lpt inspect`: ops, fake-quantized tensors, unquantized heavy ops."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx_ir as ir

from lpt.graph.constants import const_array
from lpt.graph.fake_quantize_op import is_fake_quantize, read_fake_quantize

# Ops whose cost int8 saves: each should read fake-quantized activations and weights.
QUANTIZABLE_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
# Ops a weight may pass through between its FakeQuantize and the op that uses it.
_LAYOUT_OPS = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity")


@dataclass(frozen=True)
class FakeQuantizedTensor:
    tensor: str
    node: str
    kind: str  # "weight" or "activation"
    levels: int
    dtype: str
    granularity: str
    low: float
    high: float
    symmetric: bool
    semantics: str


@dataclass(frozen=True)
class UnquantizedOp:
    node: str
    op_type: str
    reason: str


@dataclass(frozen=True)
class ModelSummary:
    op_counts: dict[str, int]
    fake_quantized: list[FakeQuantizedTensor] = field(default_factory=list)
    unquantized: list[UnquantizedOp] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _op_name(node: ir.Node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


def _describe(node: ir.Node) -> FakeQuantizedTensor:
    fq = read_fake_quantize(node)
    x = node.inputs[0]
    kind = "weight" if const_array(x) is not None else "activation"
    if fq is None:
        return FakeQuantizedTensor(x.name, node.name, kind, node.attributes["levels"].as_int(), "?",
                                   "dynamic limits", float("nan"), float("nan"), False, "openvino")
    bits = 8 if fq.levels <= 256 else 16
    dtype = ("i" if fq.signed else "u") + str(bits)
    axis = fq.per_channel_axis
    granularity = "per-tensor" if axis is None else f"per-channel (axis {axis})"
    return FakeQuantizedTensor(
        x.name, node.name, kind, fq.levels, dtype, granularity,
        float(np.min(fq.output_low)), float(np.max(fq.output_high)), fq.is_symmetric, fq.semantics,
    )


def _is_quantized(value: ir.Value | None) -> bool:
    node = value.producer() if value is not None else None
    while node is not None and node.op_type in _LAYOUT_OPS:
        node = node.inputs[0].producer()
    return node is not None and is_fake_quantize(node)


def _unquantized_reason(node: ir.Node) -> str | None:
    names = ["input", "weight"]
    missing = [names[i] for i, v in enumerate(node.inputs[:2]) if not _is_quantized(v)]
    if not missing:
        return None
    return " and ".join(missing) + (" is" if len(missing) == 1 else " are") + " not fake-quantized"


def summarize(model: ir.Model) -> ModelSummary:
    nodes = list(ir.traversal.RecursiveGraphIterator(model.graph))
    counts = Counter(_op_name(n) for n in nodes)
    fqs = [_describe(n) for n in nodes if is_fake_quantize(n)]
    unquantized = [
        UnquantizedOp(n.name, n.op_type, reason)
        for n in nodes
        if n.op_type in QUANTIZABLE_OPS and n.domain in ("", "ai.onnx") and (reason := _unquantized_reason(n))
    ]
    return ModelSummary(dict(counts.most_common()), fqs, unquantized)
