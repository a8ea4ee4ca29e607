"""How much accuracy moved: a reference model against a candidate, per output and per layer.

The candidate (an FQ or int8 model, lpt's or another tool's) runs on lpt's backend or on
onnxruntime (with its default optimizations: the int8 kernels a user of onnxruntime gets).
Per layer, tensors are matched by name: a tensor lpt quantizes is compared, dequantized, to
the reference tensor it was quantized from, so a layer's number is the error that has built
up by the time its output is quantized.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from lpt.calibration.data import CalibrationData, input_specs
from lpt.crosscheck import run_onnxruntime
from lpt.errors import DataError
from lpt.graph.constants import const_array
from lpt.metrics import Agreement, TopOne, is_classifier_output
from lpt.numerics.levels import level_range

BACKENDS = ("lpt", "onnxruntime")


@dataclass(frozen=True)
class LayerComparison:
    name: str
    op: str
    sqnr_db: float
    precision: str  # "int8", "f32" or "input": how the candidate computed the tensor


@dataclass
class Comparison:
    backend: str
    outputs: dict[str, Agreement]
    top1: TopOne | None = None
    has_labels: bool = False
    layers: list[LayerComparison] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The stable JSON form (README documents the keys)."""
        out = {"backend": self.backend, "outputs": {k: v.to_dict() for k, v in self.outputs.items()}}
        if self.top1 is not None and self.has_labels:
            out["accuracy"] = {"reference": self.top1.reference_accuracy, "candidate": self.top1.candidate_accuracy,
                               "drop": self.top1.reference_accuracy - self.top1.candidate_accuracy}
        elif self.top1 is not None:
            out["agreement"] = self.top1.agreement
        if self.layers:
            out["layers"] = [{"name": l.name, "op": l.op, "sqnr_db": l.sqnr_db, "precision": l.precision}
                             for l in self.layers]
        return out


def _split_labels(data, labels: str | None):
    """(inputs source, labels array or None): labels travel in the same .npz or dict under `labels`."""
    if labels is None:
        return data, None
    if isinstance(data, (str, os.PathLike)):
        with np.load(data, allow_pickle=False) as archive:
            data = {k: archive[k] for k in archive.files}
    if not isinstance(data, dict) or labels not in data:
        raise DataError(f"no labels under key {labels!r} in the data")
    rest = {k: v for k, v in data.items() if k != labels}
    return rest, np.asarray(data[labels])


def _dequantize_function(node: ir.Node):
    """Integers of a quantize node → the float values they stand for."""
    if node.domain == "lpt":
        il, ih = const_array(node.inputs[1]), const_array(node.inputs[2])
        levels = node.attributes["levels"].as_int()
        qmin, _ = level_range(levels, ir.DataType(node.attributes["to"].as_int()) == ir.DataType.INT8)
        scale = (ih - il) / np.float32(levels - 1)
        return lambda q: (q.astype(np.float32) - (qmin - il / scale)) * scale
    scale = const_array(node.inputs[1])
    zero_point = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else 0
    if scale.size > 1:
        return None
    return lambda q: (q.astype(np.int32) - np.int32(zero_point)).astype(np.float32) * scale


def compare(reference, candidate, data, *, labels: str | None = None, backend: str = "lpt",
            per_layer: bool = False, batch_size: int = 32) -> Comparison:
    """Compare `candidate` with `reference` (paths or ir.Models) on `data`; see Comparison.to_dict."""
    import lpt

    if backend not in BACKENDS:
        raise DataError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    reference = lpt.read_model(reference) if isinstance(reference, (str, os.PathLike)) else reference
    candidate = lpt.load(candidate) if isinstance(candidate, (str, os.PathLike)) else candidate
    inputs, label_array = _split_labels(data, labels)
    dataset = CalibrationData(inputs, input_specs(reference), batch_size=batch_size)
    output_names = [v.name for v in reference.graph.outputs]

    plan, probes = None, {}
    if backend == "lpt":
        int8 = lpt.clone(candidate)
        lpt.transform(int8)
        plan = lpt.compile_model(int8)
        if per_layer:
            names = {v.name for n in reference.graph for v in n.outputs} | {v.name for v in reference.graph.inputs}
            probes = _quantized_probes(int8, plan, names)
    elif per_layer:
        candidate_names = {v.name for n in candidate.graph for v in n.outputs}
        probes = {n.outputs[0].name: (n.outputs[0].name, None, "f32") for n in reference.graph
                  if n.outputs[0].name in candidate_names and n.outputs[0].name not in output_names}

    outputs = {name: Agreement() for name in output_names}
    layers = {name: Agreement() for name in probes}
    top1, seen = TopOne(), 0
    for batch in dataset.batches():
        expected = run_onnxruntime(reference, batch, output_names + list(probes))
        if plan is not None:
            got = plan.run(batch, keep=per_layer)
        else:
            got = run_onnxruntime(candidate, batch, output_names + [p[0] for p in probes.values()], optimize=True)
        for name in output_names:
            outputs[name].add(expected[name], got[name])
        for name, (tensor, dequantize, _) in probes.items():
            layers[name].add(expected[name], dequantize(got[tensor]) if dequantize else got[tensor])
        first = output_names[0]
        if is_classifier_output(expected[first]):
            rows = len(expected[first])
            batch_labels = None if label_array is None else label_array[seen:seen + rows]
            top1.add(expected[first], got[first], batch_labels)
            seen += rows
    producers = {n.outputs[0].name: n.op_type for n in reference.graph}
    result = Comparison(backend, outputs, top1 if top1.count else None, label_array is not None)
    result.layers = sorted((LayerComparison(name, producers.get(name, "input"), layers[name].sqnr_db, probes[name][2])
                            for name in probes), key=lambda l: l.sqnr_db)
    return result


def _quantized_probes(int8: ir.Model, plan, reference_names: set[str]) -> dict:
    """Reference tensor name → (lpt tensor holding its quantized form, dequantize, precision)."""
    step_of = {name: step for step in plan.steps for name in step.outputs}
    inputs = set(plan.inputs)
    probes = {}
    for node in int8.graph:
        if (node.op_type, node.domain) not in (("QuantizeLinear", ""), ("Quantize", "lpt")):
            continue
        source, quantized = node.inputs[0].name, node.outputs[0].name
        dequantize = _dequantize_function(node)
        if source in reference_names and quantized in step_of and dequantize is not None:
            # Computed inside an int8 step (fused, never materialized) or by one: int8; else f32.
            producer = step_of.get(source)
            precision = ("input" if source in inputs else
                         "int8" if producer is None or producer.backend == "int8 kernel" else "f32")
            probes[source] = (quantized, dequantize, precision)
    return probes
