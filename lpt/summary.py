"""What a model holds, for `lpt inspect`: ops, fake-quantized tensors, unquantized heavy ops."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx_ir as ir

from lpt.graph.constants import const_array
from lpt.graph.fake_quantize_op import is_fake_quantize, read_fake_quantize
from lpt.graph.ops import PRECISION_PRESERVING_OPS, QUANTIZABLE_OPS, QUANTIZED_OPS



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
class OpPrecision:
    node: str
    op_type: str
    precision: str  # "int8", "quantize", "dequantize", "fused" (f32 inside an int8 kernel call) or "f32"
    reason: str = ""


@dataclass(frozen=True)
class ModelSummary:
    op_counts: dict[str, int]
    fake_quantized: list[FakeQuantizedTensor] = field(default_factory=list)
    unquantized: list[UnquantizedOp] = field(default_factory=list)
    precisions: list[OpPrecision] = field(default_factory=list)  # filled for transformed (int8) graphs

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
    while node is not None and node.op_type in PRECISION_PRESERVING_OPS:
        node = node.inputs[0].producer()
    return node is not None and is_fake_quantize(node)


def _unquantized_reason(node: ir.Node) -> str | None:
    names = ["input", "weight"]
    missing = [names[i] for i, v in enumerate(node.inputs[:2]) if not _is_quantized(v)]
    if not missing:
        return None
    return " and ".join(missing) + (" is" if len(missing) == 1 else " are") + " not fake-quantized"


def is_quantized(model: ir.Model) -> bool:
    """Whether a normalized model is fake-quantized, or quantized in a form lpt runs as it is (an int8 graph,
    DynamicQuantizeLinear + ConvInteger)."""
    nodes = ir.traversal.RecursiveGraphIterator(model.graph)
    return any(is_fake_quantize(n) or n.op_type in QUANTIZED_OPS for n in nodes)


def summarize(model: ir.Model) -> ModelSummary:
    """Op histogram, fake-quantized tensors, quantizable ops left unquantized, and, for an int8
    graph, each op's precision (compiled, so that fused output stages are told apart)."""
    nodes = list(ir.traversal.RecursiveGraphIterator(model.graph))
    counts = Counter(_op_name(n) for n in nodes)
    fqs = [_describe(n) for n in nodes if is_fake_quantize(n)]
    unquantized = [
        UnquantizedOp(n.name, n.op_type, reason)
        for n in nodes
        if n.op_type in QUANTIZABLE_OPS and n.domain in ("", "ai.onnx") and (reason := _unquantized_reason(n))
    ]
    precisions = []
    if any(p.precision != "f32" for p in op_precisions(model)):
        from lpt.backend import compile_model

        precisions = op_precisions(model, compile_model(model))
    return ModelSummary(dict(counts.most_common()), fqs, unquantized, precisions)


_INTEGER_TENSORS = (ir.DataType.UINT8, ir.DataType.INT8, ir.DataType.INT32)  # quantized data and accumulators


def op_precisions(model: ir.Model, plan=None) -> list[OpPrecision]:
    """Per node of a transformed graph: does it run on integers, and if not, why.

    With the compiled `plan`, f32 nodes that the backend fuses into an int8 kernel call (a
    bias add, a Relu before the next quantize: the kernel's output stage) say so.
    """
    from lpt.transformations.base import recorded_reason
    from lpt.transformations.dequantization import Dequantization

    fused = set()
    if plan is not None:
        fused = {name for step in plan.steps if step.backend == "int8 kernel" and len(step.nodes) > 1
                 for name in step.nodes}
    nodes = list(ir.traversal.RecursiveGraphIterator(model.graph))  # an If's branches' after it
    dequantize = set()
    for node in nodes:
        dq = Dequantization.of(node.outputs[0]) if node.op_type == "Mul" else None
        if dq is not None:
            dequantize.update(id(n) for n in dq.nodes)
    report = []
    for node in nodes:
        if node.op_type == "Constant":
            continue  # not an op that runs: a value
        name = node.name or node.op_type
        # Constant inputs (zero points, shapes) do not make an op integer: its data inputs do.
        integer_in = any(v is not None and v.dtype in _INTEGER_TENSORS and const_array(v) is None for v in node.inputs)
        integer_out = any(v.dtype in _INTEGER_TENSORS for v in node.outputs)
        reason = ""
        if id(node) in dequantize:
            precision = "dequantize"
        elif integer_out and not integer_in:
            precision = "quantize"
        elif integer_in or (name in fused and node.op_type in ("AveragePool", "GlobalAveragePool")):
            precision = "int8"  # the pools of a fused step sum the integers themselves
        elif name in fused:
            precision, reason = "fused", "f32 arithmetic inside an int8 kernel call (output stage, argument scaling)"
        else:
            precision = "f32"
            reason = recorded_reason(node) or _default_reason(node)
        report.append(OpPrecision(name, _op_name(node), precision, reason))
    return report


def _default_reason(node: ir.Node) -> str:
    if node.op_type in QUANTIZABLE_OPS:
        return "inputs are not quantized"
    if node.op_type == "If":
        return "a choice of branch: their ops are listed after it"
    return f"no int8 form for {node.op_type}"
