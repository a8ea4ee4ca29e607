"""Dynamic quantization: int8 weights, activation ranges measured at run time (`lpt quantize --dynamic`).

onnxruntime's `quantize_dynamic` is the anchor; the model written is in the same standard form,
which lpt's backend runs exactly (DynamicQuantizeLinear and the integer ops on lpt's kernels):

    MatMul(x, W)        →  DynamicQuantizeLinear(x) → MatMulInteger(x_q, W_q, x_zp, 128) → Cast → Mul(x_s·s_W)
    Gemm(x, W, C)       →  the same, alpha folded into s_W, transB into W_q, then Add(beta·C)
    Conv(x, W, B)       →  DynamicQuantizeLinear(x) → ConvInteger(x_q, W_q, x_zp, 128) → Cast → Mul → Add(B)
                           (only with conv=True: see below)
    LSTM/GRU/RNN(W, R)  →  int8 W, Cast → Mul(s) back to f32 feeding the same op (weights only; R stays f32)

Choices, each measured (README, bench/dynamic.py):
- Weights are symmetric per output channel (per column of MatMul's W, per output channel of Conv),
  s = max|w|/127, stored as uint8 around a zero point of 128 (values 1..255), not as int8: onnxruntime's
  u8·s8 kernels on CPUs without VNNI add pairs of products in a saturating int16 (vpmaddubsw), so a
  u8 activation times an s8 weight is not exact there (255·127·2 > 32767), while its u8·u8 kernels
  widen to int16 first and are exact everywhere. Same 255 levels, one zero point for the tensor (so
  ConvInteger and MatMulInteger take it as a scalar); the per-channel scale goes into the Mul after.
- Activations: DynamicQuantizeLinear (u8, per tensor, min/max of the tensor each run, as onnxruntime),
  one per activation however many layers read it.
- Recurrent ops keep their recurrence in f32: ONNX has no integer LSTM/GRU (onnxruntime's
  DynamicQuantizeLSTM is a com.microsoft op) and hoisting X·Wᵀ out of the recurrence would leave the
  standard op an f32 identity projection of the same size per step. Their input weights W become
  int8 (per gate row), dequantized once when onnxruntime loads the model (4x smaller); the recurrent
  weights R stay f32: their error compounds over the time steps. Measured on plcmos_v2 (2 GRU):
  W and R int8 46.1 dB, W only 51.0, neither 51.4 (onnxruntime's quantize_dynamic: 46.3).
- Conv stays f32 unless asked (conv=True): on plcmos_v2 quantizing its 4 Convs dynamically took the
  output from 51.0 to 39.3 dB (onnxruntime's quantize_dynamic, which quantizes them: 46.3), though
  each Conv alone came out 2-3 dB closer to fp32 than onnxruntime's; and ConvInteger ran slower than
  the f32 Conv (onnxruntime's dynamic plcmos_v2: 3.7-5.1x its fp32 latency). Static int8 is the way for Conv.
- Ops inside If/Loop subgraphs stay f32: lpt's backend runs a subgraph whole in onnxruntime.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from lpt.errors import QuantizationError
from lpt.graph.constants import add_constant, const_array
from lpt.graph.ops import attribute
from lpt.model_io import clone

logger = logging.getLogger(__name__)

LINEAR_OPS = ("MatMul", "Gemm", "Conv")
RECURRENT_OPS = ("LSTM", "GRU", "RNN")
_WEIGHT_ZERO_POINT = 128  # symmetric weights stored as uint8: see the module docstring


@dataclass(frozen=True)
class DynamicOp:
    node: str
    op_type: str
    how: str  # what was done, or why it stayed f32


@dataclass
class DynamicReport:
    quantized: list[DynamicOp] = field(default_factory=list)  # integer ops with run-time activation scales
    weights_only: list[DynamicOp] = field(default_factory=list)  # int8 weights, f32 compute (recurrent ops)
    left_f32: list[DynamicOp] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {key: [dict(op.__dict__) for op in getattr(self, key)]
                for key in ("quantized", "weights_only", "left_f32")}


@dataclass
class DynamicResult:
    model: ir.Model
    report: DynamicReport


def quantize_dynamic(model: ir.Model, *, ignore=(), recurrent_weights: bool = True,
                     conv: bool = False) -> DynamicResult:
    """A copy of the fp32 `model` with MatMul/Gemm (and Conv, with `conv`) quantized dynamically and
    LSTM/GRU/RNN input weights W stored in int8 (with `recurrent_weights`); `ignore` as calibrate's (node names,
    re:REGEX, op types) stays f32. The report lists every candidate op and what happened to it."""
    model = clone(model)
    report = DynamicReport()
    activations: dict[str, tuple[ir.Value, ir.Value, ir.Value]] = {}  # one DynamicQuantizeLinear per tensor
    for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
        if node.op_type not in LINEAR_OPS + RECURRENT_OPS or node.domain not in ("", "ai.onnx"):
            continue
        name = node.name or node.outputs[0].name
        if node.op_type == "Conv" and not conv:
            reason = ("Conv stays f32 by default: measured on the corpus, its dynamic form costs more accuracy than "
                      "onnxruntime's and runs slower than f32 (conv=True quantizes it)")
        elif _ignored(node, ignore):
            reason = "ignored (--ignore)"
        elif node.graph is not model.graph:
            reason = "inside an If/Loop subgraph, which lpt's backend runs whole in onnxruntime"
        elif node.op_type in RECURRENT_OPS:
            reason = _recurrent_weights(node) if recurrent_weights else "recurrent weights kept f32 (by request)"
            if reason is None:
                report.weights_only.append(DynamicOp(name, node.op_type, "int8 W per gate row; R and the recurrence "
                                                     "f32 (ONNX has no integer LSTM/GRU; R's error compounds "
                                                     "over time steps)"))
                continue
        else:
            reason = _linear(node, activations)
            if reason is None:
                report.quantized.append(DynamicOp(name, node.op_type, f"{_integer_op(node.op_type)}, per-channel "
                                                  "weights, activation scale at run time"))
                continue
        report.left_f32.append(DynamicOp(name, node.op_type, reason))
    if report.quantized and _opset(model) < 10:
        raise QuantizationError(f"dynamic quantization needs opset 10 or later (DynamicQuantizeLinear, "
                                f"{_integer_op('MatMul')}); the model has opset {_opset(model)}")
    for op in report.left_f32:
        logger.info("left f32: %s (%s): %s", op.node, op.op_type, op.how)
    return DynamicResult(model, report)


def _integer_op(op_type: str) -> str:
    return "ConvInteger" if op_type == "Conv" else "MatMulInteger"


def _opset(model: ir.Model) -> int:
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))


def _ignored(node: ir.Node, ignore) -> bool:
    for pattern in ignore:
        if pattern.startswith("re:"):
            if node.name and re.search(pattern[3:], node.name):
                return True
        elif pattern in (node.name, node.op_type):
            return True
    return False


def _symmetric(weights: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 weights around 128, f32 scale per index of `axis`): s = max|w|/127 per channel (1 for zeros)."""
    other = tuple(d for d in range(weights.ndim) if d != axis)
    scale = (np.abs(weights).max(axis=other) / np.float32(127)).astype(np.float32)
    scale[scale == 0] = 1
    shape = [-1 if d == axis else 1 for d in range(weights.ndim)]
    q = np.clip(np.rint(weights / scale.reshape(shape)), -127, 127)
    return (q + _WEIGHT_ZERO_POINT).astype(np.uint8), scale


def _linear(node: ir.Node, activations: dict) -> str | None:
    """Rewrite MatMul/Gemm/Conv into the dynamic form; None when done, else why not."""
    x = node.inputs[0]
    weights = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if weights is None:
        return "the weight input is not a constant (two activations: no weight to quantize ahead)"
    if weights.dtype != np.float32 or (x.dtype is not None and x.dtype != ir.DataType.FLOAT):
        return f"not f32 ({weights.dtype})"
    if x.const_value is not None:
        return "both inputs are constants"
    op = node.op_type
    if op == "MatMul" and weights.ndim != 2:
        return f"the weight has rank {weights.ndim}; MatMulInteger here takes a 2-D one"
    if op == "Gemm" and attribute(node, "transA", 0):
        return "Gemm with transA"
    bias = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
    if op in ("Gemm", "Conv") and len(node.inputs) > 2 and node.inputs[2] is not None and bias is None:
        return "the bias is not a constant"
    graph = node.graph
    base = node.name or node.outputs[0].name
    if op == "Conv":
        q, scale = _symmetric(weights, 0)
        scale_shape = (-1,) + (1,) * (weights.ndim - 2)  # broadcast over [N, C, spatial...]
        attributes = {key: a.value for key, a in node.attributes.items()
                      if key in ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")}
    else:
        if op == "Gemm" and attribute(node, "transB", 0):
            weights = weights.T
        alpha = np.float32(attribute(node, "alpha", 1.0)) if op == "Gemm" else np.float32(1)
        q, scale = _symmetric(weights, 1)
        scale, scale_shape, attributes = scale * alpha, (-1,), {}
        if bias is not None:
            bias = bias * np.float32(attribute(node, "beta", 1.0))
    x_q, x_scale, x_zero_point = _dynamic_quantize(graph, node, x, activations)
    new = []
    integer = ir.node(_integer_op(op), [x_q, add_constant(graph, f"{base}.weight_quantized", q), x_zero_point,
                                        add_constant(graph, f"{base}.weight_zero_point", np.uint8(_WEIGHT_ZERO_POINT))],
                      attributes=attributes, name=f"{base}/{_integer_op(op)}")
    integer.outputs[0].type = ir.TensorType(ir.DataType.INT32)
    cast = ir.node("Cast", integer.outputs, attributes={"to": ir.DataType.FLOAT}, name=f"{base}/Cast")
    product = ir.node("Mul", [x_scale, add_constant(graph, f"{base}.weight_scale", scale.reshape(scale_shape))],
                      name=f"{base}/scale")
    rescale = ir.node("Mul", [cast.outputs[0], product.outputs[0]], name=f"{base}/rescale")
    new += [integer, cast, product, rescale]
    out = rescale.outputs[0]
    if bias is not None:
        add = ir.node("Add", [out, add_constant(graph, f"{base}.bias", bias.astype(np.float32).reshape(
            scale_shape if op == "Conv" else bias.shape))], name=f"{base}/bias")
        new.append(add)
        out = add.outputs[0]
    graph.insert_before(node, new)
    out.type = ir.TensorType(ir.DataType.FLOAT)
    old = [v for v in node.inputs[1:] if v is not None]
    _replace(node, out)
    for value in old:
        _drop_if_unused(graph, value)
    return None


def _dynamic_quantize(graph: ir.Graph, node: ir.Node, x: ir.Value, activations: dict):
    """(x_q, x_scale, x_zero_point) of one DynamicQuantizeLinear per activation, placed after x's producer."""
    key = x.name or str(id(x))
    if key not in activations:
        quantize = ir.node("DynamicQuantizeLinear", [x], num_outputs=3, name=f"{x.name}/DynamicQuantizeLinear")
        for value, suffix, dtype in zip(quantize.outputs, ("quantized", "scale", "zero_point"),
                                        (ir.DataType.UINT8, ir.DataType.FLOAT, ir.DataType.UINT8)):
            value.name, value.type = f"{x.name}_{suffix}", ir.TensorType(dtype)
        producer = x.producer()
        if producer is not None and producer.graph is graph:
            graph.insert_after(producer, quantize)
        else:
            graph.insert_before(node, quantize)
        activations[key] = tuple(quantize.outputs)
    return activations[key]


def _replace(node: ir.Node, value: ir.Value) -> None:
    from lpt.graph.rewrite import replace_value

    replace_value(node.outputs[0], value)
    node.graph.remove(node, safe=True)


def _recurrent_weights(node: ir.Node) -> str | None:
    """W of LSTM/GRU/RNN as int8 per gate row, Cast → Mul back to f32; None when done, else why not."""
    graph = node.graph
    base = node.name or node.outputs[0].name
    weights = const_array(node.inputs[1])
    if weights is None:
        producer = node.inputs[1].producer()
        return (f"W is computed in the graph ({producer.op_type if producer is not None else 'a graph input'}), "
                "not a constant")
    if weights.dtype != np.float32 or weights.ndim != 3:
        return f"W is not 3-D f32 ({weights.dtype}, rank {weights.ndim})"
    # per (direction, gate row): the axes a row of the gate MatMul shares
    rows = weights.reshape(-1, weights.shape[-1])
    scale = (np.abs(rows).max(axis=1) / np.float32(127)).astype(np.float32)
    scale[scale == 0] = 1
    q = np.clip(np.rint(rows / scale[:, None]), -127, 127).astype(np.int8).reshape(weights.shape)
    cast = ir.node("Cast", [add_constant(graph, f"{base}.W_quantized", q)], attributes={"to": ir.DataType.FLOAT},
                   name=f"{base}/W/Cast")
    mul = ir.node("Mul", [cast.outputs[0], add_constant(graph, f"{base}.W_scale", scale.reshape(weights.shape[:2] + (1,)))],
                  name=f"{base}/W/dequantize")
    graph.insert_before(node, [cast, mul])
    old = node.inputs[1]
    node.replace_input_with(1, mul.outputs[0])
    _drop_if_unused(graph, old)
    return None


def _drop_if_unused(graph: ir.Graph, value: ir.Value) -> None:
    """Remove the f32 weight the int8 one replaced, unless something else still reads it."""
    if value.uses() or value.is_graph_input() or value.is_graph_output():
        return
    if value.is_initializer():
        graph.initializers.pop(value.name)
    elif value.producer() is not None and value.producer().op_type == "Constant":
        graph.remove(value.producer(), safe=True)


def check_options(**options) -> None:
    """Refuse, before any work, an option that only static quantization has (given as name=value, None: unset)."""
    given = [name for name, value in options.items() if value not in (None, False)]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise QuantizationError(f"--dynamic (dynamic=True) measures activation ranges at run time: {flags} "
                                "(static calibration only) cannot be combined with it")


def integer_agreement(model: ir.Model, plan, feeds: dict[str, np.ndarray], *, local: bool = False) -> list:
    """Every integer tensor of the dynamic `model` (DynamicQuantizeLinear's u8 output and zero point,
    ConvInteger's and MatMulInteger's int32 accumulators) on lpt's `plan` vs onnxruntime, in LSBs.

    crosscheck's figure follows quantize nodes back to an FQ model's f32 tensors; a dynamic model
    has none, so its integers are compared directly. End to end (default), the f32 ops between them
    (onnxruntime regions in lpt's plan, another session's graph in the reference) can move a value
    across a rounding boundary, and an accumulator then differs by a weight column's sum. With `local`,
    each step reads the reference's values of the quantized ops' inputs, so each figure is what its own
    op adds."""
    from lpt.crosscheck import TensorAgreement, _run_steps, run_onnxruntime

    quantized_ops = [node for node in model.graph
                     if node.op_type in ("DynamicQuantizeLinear", "MatMulInteger", "ConvInteger")]
    names = [v.name for node in quantized_ops for v in node.outputs
             if v.name and v.dtype is not None and v.dtype.is_integer()]
    if not names:
        return []
    sources = [node.inputs[0].name for node in quantized_ops if node.op_type == "DynamicQuantizeLinear"
               and node.inputs[0].name not in feeds and node.inputs[0].name not in plan.constants]
    theirs = run_onnxruntime(model, feeds, names + sources)
    if local:
        ours = _run_steps(plan, feeds, theirs, keep=set(names))
    else:
        ours = plan.run(feeds, keep=True)
    result = []
    for name in names:
        if name not in ours:  # fused away inside a step: not materialized
            continue
        difference = np.abs(ours[name].astype(np.int64) - theirs[name].astype(np.int64))
        result.append(TensorAgreement(name, int(difference.max(initial=0)), float((difference == 0).mean()),
                                      int(difference.size)))
    return result
