"""The offline stage: calibrate an fp32 model on sample data and insert FakeQuantize nodes.

    result = calibrate("models/digits_cnn.onnx", "models/digits_cnn.npz")
    lpt.save(result.model, "digits_cnn.fq.onnx")        # standard QDQ ONNX
    print(result.report.fake_quantizes, result.report.left_f32)

In two halves, as NNCF's MinMax does: *which statistics, where* (placement.place picks the
tensors; statistics.collect streams the data through onnxruntime into fixed-size collectors),
then *apply them* (estimators turn statistics into ranges, insertion turns ranges into FQs,
bias_correction shifts biases by the mean error the FQs introduce).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import NameFixPass

from lpt.calibration import bias_correction as _bias_correction
from lpt.calibration.config import (
    DEFAULT_ESTIMATOR,
    DEFAULT_PRESET,
    ActivationScheme,
    CalibrationConfig,
    Estimator,
    Preset,
    WeightScheme,
)
from lpt.calibration.data import CalibrationData, InputSpec, input_specs
from lpt.calibration.estimators import HistogramCollector, collector, estimate, mean_error
from lpt.calibration.insertion import fake_quantizes, insert
from lpt.calibration.placement import ACTIVATION, Placement, QuantizationPoint, Skipped, place
from lpt.calibration.statistics import collect
from lpt.errors import ModelError
from lpt.graph.fake_quantize_op import FakeQuantize
from lpt.graph.ops import PRECISION_PRESERVING_OPS, QUANTIZED_OPS
from lpt.model_io import prepare, read_model, to_proto

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class FakeQuantizedTensor:
    tensor: str
    kind: str  # "activation" or "weight"
    dtype: str  # "u8" or "i8"
    granularity: str  # "per-tensor" or "per-channel (axis N)"
    low: float
    high: float


@dataclass(frozen=True)
class CalibrationReport:
    preset: str
    estimator: str
    tensors: tuple[FakeQuantizedTensor, ...]
    left_f32: tuple[Skipped, ...]  # (node, op_type, reason)
    samples: int
    skipped_samples: int  # dropped for NaN/Inf
    bias_corrected: tuple[str, ...]  # layers whose bias was shifted
    seconds: float

    @property
    def fake_quantizes(self) -> dict[str, int]:
        """FQs inserted by kind: {"activation u8": 3, "weight i8 per-channel": 4, ...}."""
        counts = Counter(f"{t.kind} {t.dtype}" + (" per-channel" if t.granularity != "per-tensor" else "")
                         for t in self.tensors)
        return dict(sorted(counts.items()))


@dataclass(frozen=True, eq=False)
class CalibrationResult:
    model: ir.Model  # a new model with lpt::FakeQuantize nodes (QDQ semantics); the input is untouched
    report: CalibrationReport
    placement: Placement


def calibrate(model: ir.Model | str | os.PathLike, data, *, preset: Preset | str = DEFAULT_PRESET,
              estimator: Estimator | str = DEFAULT_ESTIMATOR, subset_size: int = 300, ignore=(),
              bias_correction: bool = True, skip_nonfinite: bool = False, quiet: bool = False,
              config: CalibrationConfig | None = None, batch_axes: dict[str, int | None] | None = None
              ) -> CalibrationResult:
    """Fake-quantize an fp32 `model` with ranges calibrated on `data`; the model given is not modified.

    `data`: a .npz/.npy path or a folder of them, a dict of arrays, an iterable of such dicts, or
    a callable returning one (see lpt.calibration.data). `preset`: "mixed" (asymmetric u8
    activations, the default) or "performance" (symmetric); `estimator`: minmax (default),
    mean_minmax, percentile, mse or kl; `ignore`: node names, ``re:REGEX`` or op types to leave
    in f32; `subset_size`: at most that many samples; `quiet`: no progress bar. `config` (a
    CalibrationConfig) replaces all of these at once. `batch_axes` ({input name: axis, or None for
    a fixed input fed whole with every batch}) overrides the batch axes guessed from the model's
    input shapes (state [2, N, 128] → 1, a scalar → None). Bad data raises DataError, a model that
    cannot be calibrated ModelError, a bad option QuantizationError.
    """
    start = time.perf_counter()
    if config is None:
        config = CalibrationConfig(preset=preset, estimator=estimator, subset_size=subset_size,
                                   ignore=tuple([ignore] if isinstance(ignore, str) else ignore),
                                   bias_correction=bias_correction, skip_nonfinite=skip_nonfinite)
    working = _working_copy(model)
    dataset = CalibrationData(data, input_specs(working), subset_size=config.subset_size,
                              batch_size=config.batch_size, skip_nonfinite=config.skip_nonfinite,
                              batch_axes=batch_axes)
    placement = place(working, config.ignore)
    scheme = config.activations

    # which statistics, where: one range collector per activation FQ, one input mean per layer to correct
    collectors: dict[str, list] = defaultdict(list)
    stats = {}
    for p in placement.activations:
        stats[p.name] = collector(config.estimator, config.histogram_bins)
        collectors[p.name].append(stats[p.name])
    targets = _bias_correction.bias_targets(placement.layers) if config.bias_correction else []
    means = {}
    for t in targets:
        means[t.layer.name] = _bias_correction.InputMean(t.per_element)
        collectors[t.input.name].append(means[t.layer.name])
    collect(working, collectors, dataset, quiet=quiet)

    # apply them
    ranges = {}
    for name, s in stats.items():
        if s.empty:
            logger.warning("%s: no finite values in its statistics; left in f32", name)
            continue
        ranges[name] = estimate(config.estimator, s, scheme, config.percentile)
    fqs = fake_quantizes(placement, ranges, scheme, config.weights)
    left_f32 = list(placement.skipped)
    left_f32 += [Skipped(p.name, "tensor", "no finite statistics") for p in placement.activations if p not in fqs]
    shifts = _bias_shifts(targets, means, fqs, stats) if targets else {}
    insert(working, fqs)
    corrected = _bias_correction.apply_shifts(working, targets, shifts) if targets else []

    report = CalibrationReport(
        preset=config.preset.value, estimator=config.estimator.value,
        tensors=tuple(_describe(p, fq) for p, fq in fqs.items()), left_f32=tuple(left_f32),
        samples=dataset.count, skipped_samples=dataset.skipped, bias_corrected=tuple(corrected),
        seconds=time.perf_counter() - start,
    )
    logger.info("calibrated on %d samples: %s in %.2f s", dataset.count, report.fake_quantizes, report.seconds)
    return CalibrationResult(working, report, placement)


def _bias_shifts(targets, means, fqs: dict[QuantizationPoint, FakeQuantize], stats) -> dict[str, np.ndarray]:
    """Fast bias correction's shift per layer, from its input mean, weight FQ and input FQ."""
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
        hist = stats.get(point.name)
        input_errors[t.layer.name] = mean_error(hist, fq) if isinstance(hist, HistogramCollector) else 0.0
    return _bias_correction.compute_shifts(targets, means, weight_fqs, input_errors)


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


def _working_copy(model) -> ir.Model:
    """A private copy to insert FQs into (never the caller's model or file), with every node named."""
    if isinstance(model, ir.Model):
        working = ir.serde.deserialize_model(prepare(to_proto(model)))
    elif isinstance(model, (str, os.PathLike)):
        working = read_model(model)
    else:
        raise ModelError(f"calibrate needs an onnx_ir Model or a path, got {type(model).__name__}")
    quantized = sorted({n.op_type for n in working.graph if n.op_type in QUANTIZED_OPS})
    if quantized:
        raise ModelError(f"the model is already quantized (it has {', '.join(quantized)}): calibrate an fp32 model")
    NameFixPass()(working)
    return working


def _describe(point: QuantizationPoint, fq: FakeQuantize) -> FakeQuantizedTensor:
    axis = fq.per_channel_axis
    return FakeQuantizedTensor(
        point.name, point.kind, "i8" if fq.signed else "u8",
        "per-tensor" if axis is None else f"per-channel (axis {axis})",
        float(np.min(fq.output_low)), float(np.max(fq.output_high)),
    )


__all__ = [
    "ACTIVATION", "ActivationScheme", "CalibrationConfig", "CalibrationData", "CalibrationReport",
    "CalibrationResult", "DEFAULT_ESTIMATOR", "DEFAULT_PRESET", "Estimator", "FakeQuantizedTensor", "InputSpec",
    "Placement", "Preset", "QuantizationPoint", "Skipped", "WeightScheme", "calibrate", "input_specs", "place",
]
