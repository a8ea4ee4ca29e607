"""Fast bias correction (NNCF's FastBiasCorrection idea): each quantized layer's bias absorbs the
mean output error that quantizing its weights and input introduces.

    shift[c] = mean(layer(x, w))[c] − mean(layer(x̂, ŵ))[c]        ŵ = FQ(w), x̂ = FQ(x)
    bias[c] += shift[c]                                            (Gemm: shift[c] / beta)

Conv, ConvTranspose, Gemm and MatMul are linear in x, so the mean over samples goes inside:
mean(layer(x, w)) = layer(mean x, w). The statistics pass keeps the running mean of each layer's
input (per element for convolutions, per feature for Gemm/MatMul: one sample's worth of
state); `E[x̂] ≈ mean x + δ`, with δ the mean FQ error of the input tensor read off its histogram
(0 for the min/max estimators, whose ranges clip nothing). The two means per layer then go
through one small onnxruntime graph holding a bias-free copy of each layer with fp32 weights
and one with ŵ. The correction is exact for the weights' part, uses every calibration sample,
and costs no second pass over the data.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir

from lpt.calibration.estimators import HistogramCollector, mean_error
from lpt.calibration.placement import ACTIVATION, QuantizationPoint
from lpt.calibration.statistics import session
from lpt.graph.constants import add_constant, const_array
from lpt.graph.fake_quantize_op import FakeQuantize
from lpt.graph.ops import PRECISION_PRESERVING_OPS

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class BiasTarget:
    """A layer `output = layer(input, weight) + bias`, the bias per channel of `channel_axis`."""

    layer: ir.Node
    bias_node: ir.Node  # the node reading the bias: the layer, or the Add after a MatMul
    bias_index: int
    channel_axis: int  # of the layer's output (a MatMul's, before its bias Add)
    beta: float = 1.0

    @property
    def input(self) -> ir.Value:
        return self.layer.inputs[0]

    @property
    def weight(self) -> ir.Value:
        return self.layer.inputs[1]

    @property
    def per_element(self) -> bool:
        """Convolutions need the input's mean at every position; Gemm/MatMul only per input feature."""
        return self.layer.op_type in ("Conv", "ConvTranspose")


def bias_targets(layers) -> list[BiasTarget]:
    """The layers among `layers` whose constant weight (input 1) and bias can be corrected."""
    targets = []
    for layer in layers:
        target = _bias_target(layer)
        if target is not None and const_array(target.weight) is not None and const_array(target.input) is None:
            targets.append(target)
    return targets


def _bias_target(layer: ir.Node) -> BiasTarget | None:
    out = layer.outputs[0]
    bias = layer.inputs[2] if len(layer.inputs) > 2 else None
    array = const_array(bias)
    if layer.op_type in ("Conv", "ConvTranspose"):
        if array is not None and array.ndim == 1:
            return BiasTarget(layer, layer, 2, 1)
    elif layer.op_type == "Gemm":
        beta = layer.attributes["beta"].as_float() if "beta" in layer.attributes else 1.0
        trans_a = layer.attributes["transA"].as_int() if "transA" in layer.attributes else 0
        row_vector = array is not None and (array.ndim == 1 or array.ndim == 2 and array.shape[0] == 1)
        if row_vector and beta != 0 and not trans_a:
            return BiasTarget(layer, layer, 2, 1, beta)
    elif layer.op_type == "MatMul":
        weight = const_array(layer.inputs[1])
        uses = list(out.uses())
        if weight is not None and weight.ndim == 2 and len(uses) == 1 and uses[0].node.op_type == "Add" \
                and not out.is_graph_output():
            add, index = uses[0].node, 1 - uses[0].idx
            array = const_array(add.inputs[index])
            if array is not None and array.ndim >= 1 and array.size == array.shape[-1] == weight.shape[1]:
                return BiasTarget(layer, add, index, -1)
    return None


class InputMean:
    """Running mean of a layer's input over the samples: per element (shape of one sample) or per
    feature (the last axis, averaged over every other)."""

    def __init__(self, per_element: bool):
        self.per_element = per_element
        self.sum: np.ndarray | None = None
        self.count = 0  # -1: given up (the input's shape varies)
        self.nonfinite = 0

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x)
        rows = x if self.per_element else x.reshape(-1, x.shape[-1])
        total = rows.sum(axis=0, dtype=np.float64)
        if self.sum is not None and self.sum.shape != total.shape:  # e.g. images of several sizes
            logger.warning("an input's shape changes between batches: its layer's bias is not corrected")
            self.count = -1
        if self.count < 0:
            return
        self.sum = total if self.sum is None else self.sum + total
        self.count += len(rows)

    @property
    def state_nbytes(self) -> int:
        return 0 if self.sum is None else self.sum.nbytes

    def merge(self, other: InputMean) -> InputMean:
        """Fold in `other`'s sum and count (other samples; lpt.distributed): the mean to float64 rounding."""
        if other.count == 0 or self.count < 0:
            return self
        if other.count < 0 or (self.sum is not None and self.sum.shape != other.sum.shape):
            self.count = -1
            return self
        self.sum = other.sum.copy() if self.sum is None else self.sum + other.sum
        self.count += other.count
        return self

    def seeded(self) -> InputMean:
        return InputMean(self.per_element)

    @property
    def mean(self) -> np.ndarray:
        return (self.sum / self.count).astype(np.float32)


def bias_shifts(targets: list[BiasTarget], means: dict[str, InputMean], fqs: dict[QuantizationPoint, FakeQuantize],
                activations: dict) -> dict[str, np.ndarray]:
    """Each target layer's shift (by name), from its input mean, its weight FQ and its input FQ, whose
    mean error δ comes from that tensor's histogram in `activations` (0 without one). Call it before
    insertion.insert: it finds a layer's input FQ by the value the layer reads."""
    weight_fqs, input_errors = {}, {}
    by_value = {p.value: (p, fq) for p, fq in fqs.items() if p.kind == ACTIVATION}
    for point, fq in fqs.items():
        for consumer, index in point.uses:
            if point.kind != ACTIVATION and index == 1:
                weight_fqs[consumer.name] = fq
    for t in targets:
        found = _serving_fq(t.layer, by_value)
        if found is None:
            weight_fqs.pop(t.layer.name, None)  # its input is not quantized: not a quantized layer
            continue
        point, fq = found
        hist = activations.get(point.name)
        input_errors[t.layer.name] = mean_error(hist, fq) if isinstance(hist, HistogramCollector) else 0.0
    return compute_shifts(targets, means, weight_fqs, input_errors)


def _serving_fq(layer: ir.Node, by_value):
    """(point, FQ) of the activation FQ that `layer`'s data input reads, up through precision-preserving
    ops (for a Concat, its first input's), or None if that input is not fake-quantized."""
    use, value = (layer, 0), layer.inputs[0]
    while value is not None:
        if value in by_value:
            point, fq = by_value[value]
            return (point, fq) if use in point.uses else None
        node = value.producer()
        if node is None or node.op_type not in PRECISION_PRESERVING_OPS + ("Concat",) or not node.inputs:
            return None
        use, value = (node, 0), node.inputs[0]
    return None


def compute_shifts(targets: list[BiasTarget], means: dict[str, InputMean], weight_fqs: dict[str, FakeQuantize],
                   input_errors: dict[str, float]) -> dict[str, np.ndarray]:
    """Per-channel shift of each target layer (by name): layer(m, w) − layer(m + δ, ŵ), averaged over
    every output axis but the channel axis. `weight_fqs` and `input_errors` (δ) are keyed by layer name."""
    targets = [t for t in targets if t.layer.name in weight_fqs and means[t.layer.name].count > 0]
    if not targets:
        return {}
    graph = onnx.helper.make_graph([], "bias_correction", [], [])
    feeds, pairs = {}, []
    for i, t in enumerate(targets):
        m = means[t.layer.name].mean[None]  # one "sample" of the mean input
        w = const_array(t.weight)
        w_hat = weight_fqs[t.layer.name].apply(w).astype(np.float32)
        feeds[f"m{i}"] = m
        feeds[f"mq{i}"] = (m + np.float32(input_errors.get(t.layer.name, 0.0))).astype(np.float32)
        for tag, x, weight in (("fp", f"m{i}", w), ("q", f"mq{i}", w_hat)):
            graph.initializer.append(onnx.numpy_helper.from_array(weight.astype(np.float32), f"{tag}{i}/w"))
            node = onnx.helper.make_node(t.layer.op_type, [x, f"{tag}{i}/w"], [f"{tag}{i}/y"], name=f"{tag}{i}")
            node.attribute.extend(onnx.helper.make_attribute(a.name, a.value) for a in t.layer.attributes.values()
                                  if not (t.layer.op_type == "Gemm" and a.name == "beta"))
            graph.node.append(node)
            graph.output.append(onnx.helper.make_tensor_value_info(f"{tag}{i}/y", onnx.TensorProto.FLOAT, None))
        graph.input.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, feeds[name].shape)
                           for name in (f"m{i}", f"mq{i}"))
        pairs.append(t)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    outputs = session(model).run(None, feeds)
    shifts = {}
    for i, t in enumerate(pairs):
        diff = outputs[2 * i].astype(np.float64) - outputs[2 * i + 1]
        axis = t.channel_axis % diff.ndim
        shifts[t.layer.name] = np.moveaxis(diff, axis, 0).reshape(diff.shape[axis], -1).mean(axis=1)
    return shifts


def apply_shifts(model: ir.Model, targets: list[BiasTarget], shifts: dict[str, np.ndarray]) -> list[str]:
    """Add each layer's shift to its bias constant (a private copy if the constant is shared). Returns the layers."""
    corrected = []
    for target in targets:
        shift = shifts.get(target.layer.name)
        bias_value = target.bias_node.inputs[target.bias_index]
        bias = const_array(bias_value)
        if shift is None or bias is None or not np.all(np.isfinite(shift)):
            continue
        if bias.shape[-1] != shift.size:
            logger.warning("%s: bias of shape %s does not match %d channels; not corrected",
                           target.layer.name, bias.shape, shift.size)
            continue
        new = (bias.astype(np.float64) + (shift / target.beta).reshape(bias.shape[-1:])).astype(bias.dtype)
        if len(bias_value.uses()) == 1 and bias_value.is_initializer():
            bias_value.const_value = ir.Tensor(new, name=bias_value.name)
        else:  # shared with another node, or a Constant node's output: give this layer its own
            value = add_constant(model.graph, f"{bias_value.name}/corrected", new)
            target.bias_node.replace_input_with(target.bias_index, value)
        logger.debug("%s: bias shifted by up to %g", target.layer.name, float(np.abs(shift).max()))
        corrected.append(target.layer.name)
    return corrected
