"""SmoothQuant (Xiao et al., 2023): move activation outliers into the weights of the MatMul/Gemm/Conv reading them.

A few input channels of a transformer's MatMul carry values 10-100x the others; one per-tensor
activation range then leaves the other channels a handful of levels. For X·W, scaling input
channel j of X by 1/s_j and row j of W by s_j gives the same product, and with

    s_j = max|X_j|^α / max|W_j|^(1−α)        (max|W_j| over the row, over every layer reading X)

the activation's channels come closer together while the weights, quantized per output column,
take the spread (their per-channel grid absorbs a row scale far better than a per-tensor
activation grid absorbs a channel outlier). α = 0.5 splits the difficulty evenly; higher α
moves more of it into the weights.

A Conv reading X is the same product over its input channels (axis 1 of X): W[:, j] takes s_j, or
for a depthwise Conv the filters of channel j. A Conv's output channel spans every input channel and
kernel position on one weight grid, so row scales cost it more than a MatMul: lpt smooths a Conv's
input only where its largest channel is at least CONV_OUTLIER_RATIO times the median channel's.
Measured with α 0.5 (worst output's SQNR, the MatMuls smoothed alike), smoothing the Conv inputs whose
ratio is at least 1 (all) / 3 / 5 / 10 / 30, against none: PaddleOCR's detector (80 Conv inputs)
15.9 / 15.7 / 19.7 / 18.9 (10 inputs) / 18.0 dB against 17.6; its recognizer 17.4 (all) / 17.6 (≥ 5) /
23.4 (≥ 10, 4 inputs) against 19.6. 10 is the threshold where both gain. A larger α moves more into
the Conv's weights than their grid holds: on the recognizer α 0.8 gave 16.8 dB and 0.95 10.2 dB when
the Convs took it as well, so a Conv's inputs take at most α = CONV_MAX_ALPHA.

Where X/s comes from (the fp32 model computes the same function afterwards):

    LayerNormalization   gamma and beta divided by s (the paper's choice: free at run time)
    MatMul/Gemm(+Add)    the producer's weight columns and bias divided by s (also free)
    Conv(+Relu)          the producer's filters and bias divided by s (Relu(y)/s = Relu(y/s), s > 0)
    Mul/Div by constant  that constant divided (multiplied) by s, per channel (GELU's final × 0.5)
    anything else        a Mul by the constant 1/s inserted before the layers (NNCF's choice for
                         activations with no such producer): one f32 Mul at run time

The absorbing forms need every use of X to be a smoothed layer (a residual Add reading the same
LayerNorm output would see X/s); otherwise the Mul is inserted and the other uses keep X.

Two steps, as the other calibration steps: smoothing_plan() collects per-channel max|X_j| (one
pass over the data on the fp32 model, lpt.calibration.statistics) and returns the scales by
tensor and node names; apply_smoothing() applies them to any fresh copy of the same model (the
overflow fix and accuracy control place FQs again on new copies).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from lpt.calibration.data import CalibrationData
from lpt.calibration.placement import IgnoreRules
from lpt.calibration.statistics import collect
from lpt.errors import QuantizationError
from lpt.graph.constants import add_constant, const_array
from lpt.graph.ops import attribute

logger = logging.getLogger(__name__)

# s is kept within [1/MAX_SCALE, MAX_SCALE]: a dead channel (max|X_j| ≈ 0) must not blow its weight row up.
MAX_SCALE = 1e4
CONV_OUTLIER_RATIO = 10.0  # a Conv's input is smoothed from this max/median of its channels' ranges: see above
CONV_MAX_ALPHA = 0.5  # and at most half the difficulty moves into its weights: see above

LAYER_NORM, PRODUCER, SCALE, MUL = "LayerNormalization", "producer weights", "producer's constant", "inserted Mul"


def check_alpha(alpha) -> float | None:
    """`alpha` as a float in [0, 1], or None (off); anything else is a QuantizationError."""
    if alpha is None:
        return None
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise QuantizationError(f"smooth_quant must be a number in [0, 1], got {alpha!r}") from None
    if not 0.0 <= value <= 1.0:
        raise QuantizationError(f"smooth_quant (SmoothQuant's alpha) must be in [0, 1], got {alpha!r}")
    return value


@dataclass(frozen=True)
class SmoothedTensor:
    """One smoothed activation: `tensor` is divided by `scales` per channel (last axis) before `layers`."""

    tensor: str
    layers: tuple[str, ...]  # the MatMul/Gemm nodes whose weight rows were multiplied
    scales: np.ndarray  # s_j, float32 [K]
    absorbed_by: str  # LAYER_NORM, PRODUCER, SCALE or MUL
    outlier_ratio: float  # max_j max|X_j| / median_j max|X_j|, before
    outlier_ratio_after: float  # the same after dividing by s

    def describe(self) -> dict:
        return {"tensor": self.tensor, "layers": list(self.layers), "absorbed_by": self.absorbed_by,
                "outlier_ratio": round(self.outlier_ratio, 2),
                "outlier_ratio_after": round(self.outlier_ratio_after, 2),
                "scale_min": float(self.scales.min()), "scale_max": float(self.scales.max())}


@dataclass(frozen=True)
class Smoothing:
    alpha: float
    tensors: tuple[SmoothedTensor, ...]


class ChannelAbsMax:
    """Running max|x| per channel of `axis` (the last: MatMul's; 1: Conv's), over the finite values
    (a statistics collector)."""

    def __init__(self, axis: int = -1):
        self.axis = axis
        self.values: np.ndarray | None = None
        self.nonfinite = 0

    def update(self, x: np.ndarray) -> None:
        x = np.abs(np.asarray(x, dtype=np.float32))
        if x.ndim <= max(self.axis, 0) or x.size == 0:
            return
        x = np.moveaxis(x, self.axis, -1)
        finite = np.isfinite(x)
        if not finite.all():
            self.nonfinite += int(x.size - finite.sum())
            x = np.where(finite, x, 0.0)
        channel_max = x.reshape(-1, x.shape[-1]).max(axis=0)
        if self.values is None:
            self.values = channel_max
        elif self.values.shape == channel_max.shape:
            np.maximum(self.values, channel_max, out=self.values)
        else:  # the channel count changed between batches: not a channel axis; left unsmoothed
            self.values = np.zeros(0, np.float32)


@dataclass(frozen=True, eq=False)
class _Group:
    """An activation and the layers reading it that can take a row scale of their weight."""

    value: ir.Value
    layers: tuple[ir.Node, ...]

    @property
    def axis(self) -> int:
        return _channel_axis(self.layers[0])


def smoothing_plan(model: ir.Model, data: CalibrationData, alpha: float, ignore=(), *,
                   quiet: bool = False) -> Smoothing:
    """The scales SmoothQuant gives `model` (fp32, every node named): one pass over `data`."""
    alpha = check_alpha(alpha)
    groups = _groups(model, IgnoreRules(ignore))
    collectors = {g.value.name: [ChannelAbsMax(g.axis)] for g in groups}
    if groups:
        collect(model, collectors, data, quiet=quiet)
    tensors = []
    for g in groups:
        x_max = collectors[g.value.name][0].values
        w_max = np.max([_row_absmax(layer) for layer in g.layers], axis=0)
        if x_max is None or x_max.shape != w_max.shape:
            logger.info("smooth quant: %s: channel statistics do not match the weights; not smoothed", g.value.name)
            continue
        if g.axis == 1 and _outlier_ratio(x_max) < CONV_OUTLIER_RATIO:
            continue
        scales = _scales(x_max, w_max, min(alpha, CONV_MAX_ALPHA) if g.axis == 1 else alpha)
        tensors.append(SmoothedTensor(g.value.name, tuple(n.name for n in g.layers), scales, _absorber(g),
                                      _outlier_ratio(x_max), _outlier_ratio(x_max / scales)))
    return Smoothing(alpha, tuple(tensors))


def apply_smoothing(model: ir.Model, smoothing: Smoothing) -> None:
    """Divide each planned activation by its scales and multiply its layers' weight rows by them, in place."""
    nodes = {n.name: n for n in model.graph}
    values = {v.name: v for n in model.graph for v in n.outputs} | {v.name: v for v in model.graph.inputs}
    for t in smoothing.tensors:
        value, layers = values.get(t.tensor), [nodes.get(name) for name in t.layers]
        if value is None or any(layer is None for layer in layers):
            raise QuantizationError(f"smooth quant: {t.tensor!r} or its layers are not in the model it was planned on")
        for layer in layers:
            _scale_rows(model.graph, layer, t.scales)
        if t.absorbed_by == LAYER_NORM:
            _divide_layer_norm(model.graph, _source(value).producer(), t.scales)
        elif t.absorbed_by in (PRODUCER, SCALE):
            _divide_producer(model.graph, _source(value), t.scales)
        else:
            _insert_mul(model.graph, value, layers, t.scales, _channel_axis(layers[0]))


def smoothed_copy(model: ir.Model, smoothing: Smoothing) -> ir.Model:
    """A smoothed copy of the fp32 `model` (nodes named as calibrate() names them); `model` is untouched."""
    from lpt.calibration import _working_copy  # the package imports this module

    working = _working_copy(model)
    apply_smoothing(working, smoothing)
    return working


# -- which activations


def _groups(model: ir.Model, rules: IgnoreRules) -> list[_Group]:
    """Per activation tensor, the MatMul/Gemm reading it as their data input (A) with a constant 2-D+ weight,
    or the Convs (one group or depthwise) reading it with a constant weight; not both kinds."""
    readers: dict[ir.Value, list[ir.Node]] = {}
    for node in model.graph:
        if _smoothable(node) and rules.match(node) is None:
            readers.setdefault(node.inputs[0], []).append(node)
    groups = []
    for value, layers in readers.items():
        rows = {_row_absmax(layer).shape for layer in layers}
        if len(rows) == 1 and len({_channel_axis(layer) for layer in layers}) == 1:  # the same K, the same axis
            groups.append(_Group(value, tuple(layers)))
    return groups


def _channel_axis(layer: ir.Node) -> int:
    """The axis of X whose channels meet the weight's rows: Conv's 1, MatMul/Gemm's last."""
    return 1 if layer.op_type == "Conv" else -1


def _smoothable(node: ir.Node) -> bool:
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("MatMul", "Gemm", "Conv") or len(node.inputs) < 2:
        return False
    a, b = node.inputs[0], node.inputs[1]
    if a is None or b is None or const_array(a) is not None or a.dtype not in (None, ir.DataType.FLOAT):
        return False
    weight = const_array(b)
    if weight is None or weight.ndim < 2 or weight.dtype != np.float32:
        return False
    if node.op_type == "Gemm" and attribute(node, "transA", 0):
        return False  # A is [K, M]: its channels are rows, not the last axis
    if node.op_type == "Conv":
        group = attribute(node, "group", 1)
        return weight.ndim >= 3 and (group == 1 or weight.shape[1] == 1)  # grouped ones: channels meet a slice
    return True


def _row_absmax(layer: ir.Node) -> np.ndarray:
    """max|W_j| over each row j of the weight (the input channel that meets X's channel j)."""
    w = np.abs(const_array(layer.inputs[1]))
    if layer.op_type == "Conv":
        return _conv_rows(layer, w).max(axis=1)
    if layer.op_type == "Gemm" and attribute(layer, "transB", 0):
        return w.max(axis=0)  # B is [N, K]
    w = np.moveaxis(w, -2, 0)  # MatMul [..., K, N], Gemm [K, N]
    return w.reshape(w.shape[0], -1).max(axis=1)


def _scales(x_max: np.ndarray, w_max: np.ndarray, alpha: float) -> np.ndarray:
    valid = (x_max > 0) & (w_max > 0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = np.where(valid, np.power(x_max, alpha) / np.power(w_max, 1.0 - alpha), 1.0)
    return np.clip(s, 1.0 / MAX_SCALE, MAX_SCALE).astype(np.float32)


def _outlier_ratio(x_max: np.ndarray) -> float:
    median = float(np.median(x_max))
    return float(x_max.max()) / median if median > 0 else float("inf")


def _absorber(group: _Group) -> str:
    """Where X/s can come from without an extra op: see the module docstring."""
    value = group.value
    uses = {(u.node, u.idx) for u in value.uses()}
    if value.is_graph_output() or uses != {(layer, 0) for layer in group.layers}:
        return MUL  # someone else reads X, or X is reused as the weight of a layer
    value = _source(value)
    producer = value.producer()
    if producer is None:
        return MUL
    if group.axis == 1:  # a Conv's channels: a producing Conv's filters take them, or a Mul
        return PRODUCER if _conv_producer(value) is not None else MUL
    if producer.op_type == "LayerNormalization" and producer.domain in ("", "ai.onnx") \
            and all(not o.uses() and not o.is_graph_output() for o in producer.outputs[1:]) \
            and all(v is None or const_array(v) is not None for v in producer.inputs[1:]):
        return LAYER_NORM
    linear = _linear_producer(value)
    if linear is not None:
        return SCALE if linear[0].op_type in ("Mul", "Div") else PRODUCER
    return MUL


def _source(value: ir.Value) -> ir.Value:
    """`value`, or what an Identity (an exported Dropout) copies into it when nothing else reads that."""
    node = value.producer()
    while node is not None and node.op_type == "Identity" and node.inputs and node.inputs[0] is not None \
            and len(node.inputs[0].uses()) == 1 and not node.inputs[0].is_graph_output() \
            and not node.inputs[0].is_graph_input():
        value = node.inputs[0]
        node = value.producer()
    return value


def _conv_producer(value: ir.Value) -> ir.Node | None:
    """The Conv computing `value` per output channel, directly or through a Relu/LeakyRelu that only
    it feeds, with a constant weight and bias: dividing its filters by s divides `value` by s."""
    node = value.producer()
    if node is not None and node.op_type in ("Relu", "LeakyRelu") and node.domain in ("", "ai.onnx"):
        data = node.inputs[0]
        if len(data.uses()) != 1 or data.is_graph_output():
            return None
        node = data.producer()
    if node is None or node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return None
    if const_array(node.inputs[1]) is None:
        return None
    if len(node.inputs) > 2 and node.inputs[2] is not None and const_array(node.inputs[2]) is None:
        return None
    return node


def _linear_producer(value: ir.Value) -> tuple[ir.Node, ir.Node | None] | None:
    """(node, its bias Add or None) computing `value` per output channel from constants: a MatMul/Gemm with a
    constant weight (its columns), or x · c / x ÷ c (c made per channel; a decomposed LayerNorm's γ, GELU's ½)."""
    node = value.producer()
    bias = None
    if node is not None and node.op_type == "Add" and len(node.inputs) == 2:
        constant = [const_array(v) is not None for v in node.inputs]
        if constant.count(True) != 1:
            return None
        data = node.inputs[constant.index(False)]
        if len(data.uses()) != 1 or data.is_graph_output():
            return None
        bias, node = node, data.producer()
    if node is None or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return None
    if node.op_type in ("Mul", "Div"):
        return (node, bias) if [const_array(v) is not None for v in node.inputs] == [False, True] else None
    if node.op_type not in ("MatMul", "Gemm"):
        return None
    if const_array(node.inputs[0]) is not None or const_array(node.inputs[1]) is None:
        return None
    if const_array(node.inputs[1]).ndim < 2:
        return None
    if node.op_type == "Gemm" and len(node.inputs) > 2 and node.inputs[2] is not None \
            and const_array(node.inputs[2]) is None:
        return None
    return node, bias


# -- applying the scales


def _replace_constant(graph: ir.Graph, node: ir.Node, index: int, array: np.ndarray, suffix: str) -> None:
    """`node` reads `array` at `index` from now on, a new initializer (the old one may be shared)."""
    old = node.inputs[index]
    node.replace_input_with(index, add_constant(graph, f"{old.name}/{suffix}", array.astype(np.float32)))
    if old.is_initializer() and not old.uses() and not old.is_graph_input():
        graph.initializers.pop(old.name, None)


def _conv_rows(layer: ir.Node, w: np.ndarray) -> np.ndarray:
    """A Conv's weight as [input channel j, what meets it]: W[:, j] (one group), or the filters of
    channel j (depthwise, W [C·m, 1, ...]: filters j·m … j·m + m − 1)."""
    if attribute(layer, "group", 1) == 1:
        return np.moveaxis(w, 1, 0).reshape(w.shape[1], -1)
    return w.reshape(attribute(layer, "group", 1), -1)


def _scale_rows(graph: ir.Graph, layer: ir.Node, s: np.ndarray) -> None:
    w = const_array(layer.inputs[1])
    if layer.op_type == "Conv":
        shape = [1] * w.ndim
        if attribute(layer, "group", 1) == 1:
            shape[1] = -1
            w = w * s.reshape(shape)
        else:  # depthwise: channel j's m filters
            w = (w.reshape(s.size, -1) * s[:, None]).reshape(w.shape)
    elif layer.op_type == "Gemm" and attribute(layer, "transB", 0):
        w = w * s  # [N, K]: K is the last axis
    else:
        w = w * s[:, None]  # [..., K, N]
    _replace_constant(graph, layer, 1, w, "smoothed")


def _divide_layer_norm(graph: ir.Graph, ln: ir.Node, s: np.ndarray) -> None:
    for index in (1, 2):
        if len(ln.inputs) > index and ln.inputs[index] is not None:
            _replace_constant(graph, ln, index, const_array(ln.inputs[index]) / s, "smoothed")


def _divide_producer(graph: ir.Graph, value: ir.Value, s: np.ndarray) -> None:
    conv = _conv_producer(value)
    if conv is not None:  # its output channels (the filters' axis 0) and bias
        w = const_array(conv.inputs[1])
        _replace_constant(graph, conv, 1, w / s.reshape((-1,) + (1,) * (w.ndim - 1)), "smoothed")
        if len(conv.inputs) > 2 and conv.inputs[2] is not None:
            _replace_constant(graph, conv, 2, const_array(conv.inputs[2]) / s, "smoothed")
        return
    node, bias = _linear_producer(value)
    if node.op_type in ("Mul", "Div"):  # x · c → x · (c / s); x ÷ c → x ÷ (c · s), c now per channel
        c = const_array(node.inputs[1]).astype(np.float32)
        _replace_constant(graph, node, 1, c / s if node.op_type == "Mul" else c * s, "smoothed")
    else:
        _divide_weight_columns(graph, node, s)
    if bias is not None:
        index = 0 if const_array(bias.inputs[0]) is not None else 1
        _replace_constant(graph, bias, index, const_array(bias.inputs[index]) / s, "smoothed")


def _divide_weight_columns(graph: ir.Graph, node: ir.Node, s: np.ndarray) -> None:
    w = const_array(node.inputs[1])
    if node.op_type == "Gemm" and attribute(node, "transB", 0):
        w = w / s[:, None]  # B is [K_out, K_in]: output channels are rows
    else:
        w = w / s  # output channels are the last axis
    _replace_constant(graph, node, 1, w, "smoothed")
    if node.op_type == "Gemm" and len(node.inputs) > 2 and node.inputs[2] is not None:
        _replace_constant(graph, node, 2, const_array(node.inputs[2]) / s, "smoothed")


def _insert_mul(graph: ir.Graph, value: ir.Value, layers: list[ir.Node], s: np.ndarray, axis: int) -> None:
    """X · (1/s) before `layers` (only: other readers of X keep X), s along X's channel `axis`."""
    inverse = (1.0 / s).astype(np.float32)
    if axis == 1:  # [C, 1, ...] broadcasts over [N, C, spatial...]
        rank = len(value.shape) if value.shape is not None else 4
        inverse = inverse.reshape((-1,) + (1,) * (rank - 2))
    inverse = add_constant(graph, f"{value.name}/smooth_quant/inverse_scale", inverse)
    first = min(layers, key=list(graph).index)
    mul = ir.node("Mul", [value, inverse], name=f"{value.name}/smooth_quant/Mul")
    mul.outputs[0].name = f"{value.name}/smoothed"
    mul.outputs[0].dtype, mul.outputs[0].shape = value.dtype, value.shape
    graph.insert_before(first, mul)
    for layer in layers:
        layer.replace_input_with(0, mul.outputs[0])

