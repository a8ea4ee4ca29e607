"""How much accuracy moved: a reference model against a candidate, per output and per layer.

The candidate (an FQ or int8 model, lpt's or another tool's) runs on lpt's backend or on
onnxruntime (with its default optimizations: the int8 kernels a user of onnxruntime gets).
Per layer, each fake-quantized activation of the candidate is matched by name to the reference
tensor it quantizes. Two numbers: what that quantization alone costs (the candidate's
FakeQuantize applied to the reference tensor: this ranks the culprits), and the error the
candidate has built up by then (its own tensor, dequantized, against the reference).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import onnx_ir as ir

from lpt.backend.chains import is_quantize, read_quantization
from lpt.calibration.data import CalibrationData, input_specs, split_labels
from lpt.crosscheck import run_fake_quantized, run_onnxruntime
from lpt.data.preprocess import METADATA_KEY
from lpt.data.sources import open_data
from lpt.errors import DataError
from lpt.graph.constants import const_array
from lpt.graph.fake_quantize_op import is_fake_quantize, read_fake_quantize
from lpt.metrics import Agreement, TopOne, is_classifier_output

BACKENDS = ("lpt", "onnxruntime")


@dataclass(frozen=True)
class LayerComparison:
    """One quantized tensor. `sqnr_db` is what its own quantization costs (its FakeQuantize applied to
    the reference tensor): it singles out the layer that loses accuracy. `accumulated_sqnr_db` is
    the candidate's tensor against the reference: the error built up by then."""

    name: str
    op: str
    sqnr_db: float
    accumulated_sqnr_db: float
    precision: str  # "int8", "f32", "input" (lpt) or "onnxruntime": how the candidate computed the tensor


@dataclass
class Comparison:
    backend: str
    outputs: dict[str, Agreement]
    top1: TopOne | None = None
    has_labels: bool = False
    layers: list[LayerComparison] = field(default_factory=list)
    emulate: str | None = None  # the CPU lpt's backend emulated ("avx2"), or None: exact
    saturation: list = field(default_factory=list)  # lpt.backend.emulation.SaturatedLayer per emulated layer

    def to_dict(self) -> dict:
        """The stable JSON form (README documents the keys)."""
        out = {"backend": self.backend, "outputs": {k: v.to_dict() for k, v in self.outputs.items()}}
        if self.top1 is not None and self.has_labels:
            out["accuracy"] = {"reference": self.top1.reference_accuracy, "candidate": self.top1.candidate_accuracy,
                               "drop": self.top1.reference_accuracy - self.top1.candidate_accuracy}
            if self.top1.top5:  # five classes or more
                out["accuracy"]["top5"] = {"reference": self.top1.reference_top5, "candidate": self.top1.candidate_top5,
                                           "drop": self.top1.reference_top5 - self.top1.candidate_top5}
        elif self.top1 is not None:
            out["agreement"] = self.top1.agreement
        if self.emulate is not None:
            out["emulate"] = self.emulate
            out["saturation"] = [layer.to_dict() for layer in self.saturation]
        if self.layers:
            out["layers"] = [{"name": layer.name, "op": layer.op, "sqnr_db": layer.sqnr_db,
                              "accumulated_sqnr_db": layer.accumulated_sqnr_db, "precision": layer.precision}
                             for layer in self.layers]
        return out


def compare(reference, candidate, data, *, labels: str | None = None, backend: str = "lpt",
            per_layer: bool = False, batch_size: int = 32,
            batch_axes: dict[str, int | None] | None = None, emulate: str | None = None,
            ray: str | None = None, ray_workers: int | None = None) -> Comparison:
    """Compare `candidate` with `reference` (paths or ir.Models) on `data`; see Comparison.to_dict.
    `batch_axes` ({input name: axis, or None for a fixed input}) overrides the guessed batch axes.
    `emulate="avx2"`: lpt's backend computes the int8 layers as onnxruntime's u8×s8 kernels do on a CPU
    without VNNI (int16 pair saturation, lpt.backend.emulation); `saturation` then says, per layer, how
    many output channels saturated on the data and what it cost in SQNR.
    `labels`: the key of the labels in a .npz or dict, a CSV `file,label` for a folder, or the labels
    themselves; a folder with class subfolders (or lpt.Dataset with `label`) brings its own. A folder
    of images or audio is preprocessed as the candidate's metadata records (else the reference's,
    else as the input shapes suggest: lpt.data.open_data).
    `ray`: "local" (ray.init() on this machine) or a Ray address: the batches are evaluated on
    `ray_workers` Ray workers (default: one per CPU of the cluster) and their tallies merged
    (lpt.distributed)."""
    import lpt

    if backend not in BACKENDS:
        raise DataError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if emulate is not None and backend != "lpt":
        raise DataError(f"emulate={emulate!r} runs the candidate on lpt's backend, not on {backend}")
    reference = lpt.read_model(reference) if isinstance(reference, (str, os.PathLike)) else reference
    candidate = lpt.load(candidate) if isinstance(candidate, (str, os.PathLike)) else candidate
    specs = input_specs(reference)
    csv = labels if isinstance(labels, (str, os.PathLike)) and str(labels).lower().endswith(".csv") else None
    recorded = candidate if METADATA_KEY in candidate.metadata_props else reference
    data = open_data(data, recorded, labels=csv, batch_axes=batch_axes)
    inputs, label_array = split_labels(data, None if csv else labels, [s.name for s in specs])
    dataset = CalibrationData(inputs, specs, batch_size=batch_size, batch_axes=batch_axes)
    if ray is not None:
        if emulate is not None:
            raise DataError("emulate and ray: the saturation report is per process; run --emulate without --ray")
        from lpt.distributed import evaluate

        tallies, precisions = evaluate(reference, candidate, dataset, label_array, address=ray, workers=ray_workers,
                                       backend=backend, per_layer=per_layer)
        return _comparison(backend, reference, tallies, precisions, label_array is not None)
    evaluator = Evaluator(reference, candidate, backend=backend, per_layer=per_layer, emulate=emulate)
    seen = 0
    for batch in dataset.batches():
        rows = dataset.samples_in(batch)
        evaluator.add(batch, None if label_array is None else label_array[seen:seen + rows])
        seen += rows
    result = _comparison(backend, reference, evaluator.tallies, evaluator.precisions, label_array is not None)
    if emulate is not None:
        from lpt.backend.emulation import saturation_report

        result.emulate, result.saturation = emulate, saturation_report(evaluator.plan)
    return result


@dataclass
class Tallies:
    """What evaluating batches accumulates: per output, per probed layer (accumulated and introduced
    error), top-1. `merge` folds in another's (other batches: lpt.distributed's workers)."""

    outputs: dict[str, Agreement]
    accumulated: dict[str, Agreement]
    introduced: dict[str, Agreement]
    top1: TopOne = field(default_factory=TopOne)

    def merge(self, other: Tallies) -> Tallies:
        for mine, theirs in ((self.outputs, other.outputs), (self.accumulated, other.accumulated),
                             (self.introduced, other.introduced)):
            for name, agreement in mine.items():
                agreement.merge(theirs[name])
        self.top1.merge(other.top1)
        return self


class Evaluator:
    """The candidate compiled (lpt) or not (onnxruntime) once; `add(batch, labels)` runs both models on
    a batch and updates `tallies`."""

    def __init__(self, reference: ir.Model, candidate: ir.Model, *, backend: str = "lpt", per_layer: bool = False,
                 emulate: str | None = None):
        import lpt

        self.reference, self.candidate, self.per_layer = reference, candidate, per_layer
        self.output_names = [v.name for v in reference.graph.outputs]
        self.plan, probes = None, {}
        reference_names = ({v.name for n in reference.graph for v in n.outputs}
                           | {v.name for v in reference.graph.inputs})
        self.local = _fake_quantize_points(candidate, reference_names) if per_layer else {}
        if backend == "lpt":
            int8 = lpt.clone(candidate)
            lpt.transform(int8)
            self.plan = lpt.compile_model(int8, emulate=emulate)
            if per_layer:
                probes = _quantized_probes(int8, self.plan, set(self.local))
        elif per_layer:  # onnxruntime: each FakeQuantize's output, which keeps its name in the saved QDQ model
            probes = {source: (output, None, "onnxruntime") for source, (output, _) in self.local.items()}
        self.probes = probes
        self.precisions = {name: probe[2] for name, probe in probes.items()}
        self.tallies = Tallies({name: Agreement() for name in self.output_names},
                               {name: Agreement() for name in probes}, {name: Agreement() for name in probes})

    def add(self, batch: dict, labels=None) -> None:
        """Run reference and candidate on `batch` (with its `labels`, or None) and update the tallies."""
        probes, tallies = self.probes, self.tallies
        expected, _ = run_fake_quantized(self.reference, batch, self.output_names + list(probes))
        if self.plan is not None:
            got = self.plan.run(batch, keep=self.per_layer)
        else:
            got = _run_candidate_in_onnxruntime(self.candidate, batch,
                                                self.output_names + [p[0] for p in probes.values()])
        for name in self.output_names:
            tallies.outputs[name].add(expected[name], got[name])
        for name, (tensor, dequantize, _) in probes.items():
            tallies.accumulated[name].add(expected[name], dequantize(got[tensor]) if dequantize else got[tensor])
            tallies.introduced[name].add(expected[name], self.local[name][1].apply(expected[name]))
        first = self.output_names[0]
        if is_classifier_output(expected[first]):
            tallies.top1.add(expected[first], got[first], labels)


def _comparison(backend: str, reference: ir.Model, tallies: Tallies, precisions: dict[str, str],
                has_labels: bool) -> Comparison:
    """The Comparison of the tallies: layers ranked by the SQNR their own quantization costs."""
    producers = {n.outputs[0].name: n.op_type for n in reference.graph}
    result = Comparison(backend, tallies.outputs, tallies.top1 if tallies.top1.count else None, has_labels)
    result.layers = sorted((LayerComparison(name, producers.get(name, "input"), tallies.introduced[name].sqnr_db,
                                            tallies.accumulated[name].sqnr_db, precisions[name])
                            for name in precisions), key=lambda layer: layer.sqnr_db)
    return result


def _run_candidate_in_onnxruntime(candidate: ir.Model, batch: dict, names: list[str]) -> dict:
    try:
        return run_onnxruntime(candidate, batch, names, optimize=True)
    except Exception as err:  # noqa: BLE001 - e.g. OpenVINO's FakeQuantize op: say so in one line
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(f"onnxruntime cannot run the candidate ({first}); use --backend lpt") from None


def _fake_quantize_points(candidate: ir.Model, reference_names: set[str]) -> dict:
    """Activation FakeQuantizes of the candidate on tensors the reference has: source → (FQ output name, FakeQuantize)."""
    points = {}
    for node in candidate.graph:
        if is_fake_quantize(node) and node.inputs[0].name in reference_names and const_array(node.inputs[0]) is None:
            fq = read_fake_quantize(node)
            if fq is not None:
                points[node.inputs[0].name] = (node.outputs[0].name, fq)
    return points


def _quantized_probes(int8: ir.Model, plan, reference_names: set[str]) -> dict:
    """Reference tensor name → (lpt tensor holding its quantized form, dequantize, precision)."""
    step_of = {name: step for step in plan.steps for name in step.outputs}
    inputs = set(plan.inputs)
    probes = {}
    for node in int8.graph:
        quantization = read_quantization(node) if is_quantize(node) else None
        if quantization is None:
            continue
        source, quantized = node.inputs[0].name, node.outputs[0].name
        if source in reference_names and quantized in step_of:
            # Computed inside an int8 step (fused, never materialized) or by one: int8; else f32.
            producer = step_of.get(source)
            precision = ("input" if source in inputs else
                         "int8" if producer is None or producer.backend == "int8 kernel" else "f32")
            probes[source] = (quantized, quantization.dequantize, precision)
    return probes
