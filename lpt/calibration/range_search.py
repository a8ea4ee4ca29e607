"""--estimator auto: each activation's range is the candidate whose quantization error, measured where
the model reads the tensor, is least (NNCF's range search, OpenVINO POT's "best of" estimators).

    candidates  minmax, percentile 99.9 / 99.99 / 99.999, mse, kl: all read off the tensor's histogram
    error(k)    Σ over samples and readers of ‖layer₀(FQ_k(y) − y)‖²  (= ‖layer(FQ_k(y)) − layer(y)‖²)
                layer₀: the reading Conv/ConvTranspose/MatMul/Gemm without its bias, fp32 weights;
                y: what it reads, the tensor after precision-preserving ops, which FQ commutes with
                a tensor with any other reader (Add, Concat, a model output): ‖FQ_k(x) − x‖² on itself

Layer outputs, not the tensor, are the measure because a layer weighs the error: clipping a few
outliers that meet small weights costs less than rounding all of a tensor coarsely.

A second pass over the data runs one onnxruntime graph, the fp32 model plus per FQ, candidate and
reader QuantizeLinear → DequantizeLinear → Sub → layer₀ → ReduceSumSquare; it fetches only those
sums, and runs in the parts the statistics pass ran in. onnxruntime's own arena is not bounded by
that: on a large audio model (dnsmos) the process peaked far above the statistics pass.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace

import numpy as np
import onnx
import onnx_ir as ir

from lpt.calibration.config import ActivationScheme, CalibrationConfig, Estimator
from lpt.calibration.data import CalibrationData
from lpt.calibration.estimators import HistogramCollector, kl_range, mse_range, percentile_range
from lpt.calibration.insertion import activation_params
from lpt.calibration.placement import Placement, QuantizationPoint, Use, _data_inputs
from lpt.calibration.statistics import session, stream
from lpt.calibration.steps import Statistics, estimate_ranges
from lpt.graph.ops import QUANTIZABLE_OPS
from lpt.model_io import to_proto

logger = logging.getLogger(__name__)

PERCENTILES = (99.9, 99.99, 99.999)


def candidates(hist: HistogramCollector, scheme: ActivationScheme) -> dict[str, tuple[float, float]]:
    """Candidate ranges by name, minmax first (it wins ties); ranges that quantize alike are kept once."""
    found = {"minmax": (hist.min, hist.max)}
    if hist.width == 0.0:  # only zeros: nothing to choose
        return found
    for p in PERCENTILES:
        found[f"percentile {p}"] = percentile_range(hist, p)
    found["mse"] = mse_range(hist, scheme)
    found["kl"] = kl_range(hist, scheme)
    distinct, seen = {}, set()
    for name, (low, high) in found.items():
        scale, zero_point, _, _ = activation_params([low], [high], scheme)
        if (scale[0], zero_point[0]) not in seen:
            seen.add((scale[0], zero_point[0]))
            distinct[name] = (low, high)
    return distinct


def readers(point: QuantizationPoint) -> list[Use] | None:
    """The (layer, input index) pairs that `point`'s FQ feeds, through precision-preserving ops; None
    when a use reaches anything else (an Add, a Concat, a model output)."""
    found, pending = [], list(point.uses)
    while pending:
        node, index = pending.pop()
        if node.op_type in QUANTIZABLE_OPS and node.domain in ("", "ai.onnx"):
            found.append((node, index))
        elif node.op_type != "Concat" and index in _data_inputs(node):
            for out in node.outputs:
                if out.is_graph_output():
                    return None
                pending += [(u.node, u.idx) for u in out.uses()]
        else:
            return None
    return found


def search_ranges(model: ir.Model, placement: Placement, statistics: Statistics, data: CalibrationData,
                  config: CalibrationConfig, *, quiet: bool = False) -> dict[str, tuple[float, float]]:
    """[low, high] per activation tensor: the candidate with the least error at its readers' outputs."""
    opset = model.opset_imports.get("", 1)
    if opset < 10:  # the error graph needs QuantizeLinear
        logger.warning("opset %d has no QuantizeLinear: the auto estimator falls back to mse", opset)
        return estimate_ranges(statistics, replace(config, estimator=Estimator.MSE))
    scheme = config.activations
    options: dict[str, dict[str, tuple[float, float]]] = {}
    for p in placement.activations:
        hist = statistics.activations[p.name]
        if hist.empty:
            logger.warning("%s: no finite values in its statistics; left in f32", p.name)
        else:
            options[p.name] = candidates(hist, scheme)
    searched = [p for p in placement.activations if len(options.get(p.name, ())) > 1]
    errors = _errors(model, searched, options, scheme, statistics, data, quiet)
    ranges, chosen = {}, Counter()
    for name, ranges_by_candidate in options.items():
        names = list(ranges_by_candidate)
        best = names[0]
        if name in errors:
            e = np.array([errors[name][c] for c in names])
            best = names[int(np.argmin(np.where(np.isfinite(e), e, np.inf)))]  # the first of equal ones
            logger.debug("%s: %s", name, ", ".join(f"{c} {v:.4g}" for c, v in zip(names, e)))
        ranges[name] = ranges_by_candidate[best]
        chosen[best] += 1
    logger.info("auto ranges: %s", ", ".join(f"{n} {c}" for c, n in chosen.most_common()))
    return ranges


class _Sum:
    """Adds up the scalar error sums of every run."""

    nonfinite = 0

    def __init__(self):
        self.total = 0.0

    def update(self, x) -> None:
        self.total += float(x)


def _errors(model, points, options, scheme, statistics, data, quiet) -> dict[str, dict[str, float]]:
    """{tensor: {candidate: error}} from one pass of the error graph over `data`."""
    if not points:
        return {}
    proto = to_proto(model)
    outputs = _add_error_branches(proto, points, options, scheme)
    sums = {name: [_Sum()] for name in outputs}
    stream(session(proto), list(outputs), sums, data, quiet=quiet, per_sample=statistics.bytes_per_sample,
           description="searching ranges")
    errors: dict[str, dict[str, float]] = {}
    for output, (tensor, candidate) in outputs.items():
        errors.setdefault(tensor, {})[candidate] = sums[output][0].total
    return errors


def _add_error_branches(proto: onnx.ModelProto, points, options, scheme) -> dict[str, tuple[str, str]]:
    """Append each (point, candidate)'s error sum to `proto` as an output; returns {output: (tensor, candidate)}."""
    graph = proto.graph
    layers = {n.name: n for n in graph.node}
    outputs = {}
    for i, point in enumerate(points):
        reads = readers(point)
        targets = [(layer.name, index, layer.inputs[index].name) for layer, index in reads] if reads else \
            [(None, None, point.name)]
        for k, (candidate, (low, high)) in enumerate(options[point.name].items()):
            prefix = f"lpt.auto/{i}/{k}"
            scale, zero_point, qmin, _ = activation_params([low], [high], scheme)
            zp_type = np.int8 if qmin < 0 else np.uint8
            graph.initializer.extend([onnx.numpy_helper.from_array(np.float32(scale[0]), f"{prefix}/scale"),
                                      onnx.numpy_helper.from_array(zp_type(zero_point[0]), f"{prefix}/zp")])
            qparams = [f"{prefix}/scale", f"{prefix}/zp"]
            error_of: dict[str, str] = {}  # what a layer reads → FQ_k(y) − y, made once
            sums = []
            for j, (layer, index, y) in enumerate(targets):
                if y not in error_of:
                    error_of[y] = f"{prefix}/{j}/e"
                    graph.node.extend([
                        onnx.helper.make_node("QuantizeLinear", [y] + qparams, [f"{prefix}/{j}/q"]),
                        onnx.helper.make_node("DequantizeLinear", [f"{prefix}/{j}/q"] + qparams, [f"{prefix}/{j}/dq"]),
                        onnx.helper.make_node("Sub", [f"{prefix}/{j}/dq", y], [error_of[y]]),
                    ])
                seen = error_of[y] if layer is None else _unbiased_copy(graph, layers[layer], index, error_of[y],
                                                                         f"{prefix}/{j}/y")
                sums.append(f"{prefix}/{j}/sum")
                graph.node.append(onnx.helper.make_node("ReduceSumSquare", [seen], [sums[-1]], keepdims=0))
            graph.node.append(onnx.helper.make_node("Sum", sums, [prefix]))
            graph.output.append(onnx.helper.make_tensor_value_info(prefix, onnx.TensorProto.FLOAT, None))
            outputs[prefix] = (point.name, candidate)
    return outputs


def _unbiased_copy(graph: onnx.GraphProto, layer: onnx.NodeProto, index: int, x: str, out: str) -> str:
    """A copy of `layer` reading `x` at `index`, without its bias: linear in x, so it maps an input error
    to the output error."""
    node = onnx.NodeProto()
    node.CopyFrom(layer)
    node.name = out
    node.input[index] = x
    del node.output[:]
    node.output.append(out)
    if node.op_type in ("Conv", "ConvTranspose"):
        del node.input[2:]
    elif node.op_type == "Gemm":
        del node.attribute[:]
        node.attribute.extend(a for a in layer.attribute if a.name != "beta")
        node.attribute.append(onnx.helper.make_attribute("beta", 0.0))  # C is required before opset 11
    graph.node.append(node)
    return out
