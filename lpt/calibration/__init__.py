"""The offline stage: calibrate an fp32 model on sample data and insert FakeQuantize nodes.

    result = calibrate("models/digits_cnn.onnx", "models/digits_cnn.npz")
    lpt.save(result.model, "digits_cnn.fq.onnx")        # standard QDQ ONNX
    print(result.report.fake_quantizes, result.report.left_f32)

In two halves, as NNCF's MinMax does: *which statistics, where*, then *apply them*; calibrate()
runs the steps in order, each usable on its own:

    place               placement: which tensors get an FQ
    collect_statistics  steps: one pass over the data into fixed-size collectors (Statistics)
    estimate_ranges     steps: the estimator's [low, high] per tensor, or search_ranges
                        (range_search, --estimator auto): a second pass scoring candidates
    to_scans            recurrent (--int8-recurrent, before placement): each LSTM/GRU as
                        projection MatMuls and a Scan whose MatMuls h·R_gᵀ quantize_scans
                        gives FQs after the data pass (h's range: the states it took)
    smoothing_plan      smooth_quant (--smooth-quant ALPHA, before placement): per-channel
                        max|X| of MatMul/Gemm inputs, one pass; apply_smoothing moves
                        the outliers into the weights (the fp32 function unchanged)
    fake_quantizes      insertion: ranges → FQ values;  insert puts them in the graph
    bias_shifts         bias_correction: the mean error the FQs introduce;  apply_shifts
                        moves it into the biases
    calibrate_branches  branches (last): the layers inside an If's branches, each branch
                        calibrated as a model of its own on the batches that take it

Statistics and ranges are keyed by names, so the steps after the data pass can run again on a
fresh copy of the model (fewer FQs, say) without calibrating again.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import NameFixPass

from lpt.calibration.bias_correction import apply_shifts, bias_shifts, bias_targets
from lpt.calibration.branches import calibrate_branches
from lpt.calibration.config import (
    DEFAULT_ESTIMATOR,
    DEFAULT_OVERFLOW_FIX,
    DEFAULT_PRESET,
    ActivationScheme,
    CalibrationConfig,
    Estimator,
    OverflowFix,
    Preset,
    WeightScheme,
)
from lpt.calibration.data import CalibrationData, InputSpec, input_specs
from lpt.calibration.insertion import fake_quantizes, insert
from lpt.calibration.overflow_fix import (MAX_ROUNDS, NarrowedLayer, channel_masks, describe, merge, narrow,
                                          saturating_channels)
from lpt.calibration.placement import ACTIVATION, IgnoreRules, Placement, QuantizationPoint, Skipped, place
from lpt.calibration.range_search import search_ranges
from lpt.calibration.recurrent import AUTO_HIDDEN, QuantizedRecurrence, hidden_state_names, quantize_scans, to_scans
from lpt.calibration.smooth_quant import Smoothing, apply_smoothing, smoothing_plan
from lpt.calibration.steps import Statistics, collect_statistics, estimate_ranges
from lpt.data.sources import open_data, record_preprocess
from lpt.errors import ModelError
from lpt.graph.fake_quantize_op import FakeQuantize
from lpt.graph.ops import QUANTIZED_OPS
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
    overflow_fix: str = "none"
    narrowed: tuple[NarrowedLayer, ...] = ()  # weights whose channels the overflow fix narrowed, and the cost
    smooth_quant: float | None = None  # SmoothQuant's alpha, None: off
    smoothed: tuple[dict, ...] = ()  # SmoothedTensor.describe() of each activation smoothed
    recurrent: tuple[QuantizedRecurrence, ...] = ()  # LSTM/GRU directions whose gate MatMuls are int8

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
    statistics: Statistics  # what the data pass collected, by tensor and layer name: enough to apply again
    ranges: dict[str, tuple[float, float]]  # the activation ranges chosen, by tensor name (before Concat groups)
    config: CalibrationConfig | None = None  # what the steps after the data pass were run with
    # The overflow fix's narrowed weights by name (True: 7 bits; else qmax per channel):
    # overflow_fix.narrow(fake_quantizes(...), narrowed) gives the FQs calibrate inserted.
    narrowed: dict | None = None
    # SmoothQuant's scales by tensor and node names (None: off); apply_smoothing(fresh copy, smoothing)
    # gives the fp32 model the FQs were placed on (what accuracy control must revert FQs from).
    smoothing: Smoothing | None = None


def calibrate(model: ir.Model | str | os.PathLike, data, *, preset: Preset | str = DEFAULT_PRESET,
              estimator: Estimator | str = DEFAULT_ESTIMATOR, subset_size: int = 300, ignore=(),
              bias_correction: bool = True, skip_nonfinite: bool = False, quiet: bool = False,
              config: CalibrationConfig | None = None, batch_axes: dict[str, int | None] | None = None,
              overflow_fix: OverflowFix | str = DEFAULT_OVERFLOW_FIX,
              smooth_quant: float | None = None, int8_recurrent: bool | None = None, ray: str | None = None,
              ray_workers: int | None = None) -> CalibrationResult:
    """Fake-quantize an fp32 `model` with ranges calibrated on `data`; the model given is not modified.

    `data`: a .npz/.npy path or a folder of them, a dict of arrays, an iterable of such dicts, or
    a callable returning one (see lpt.calibration.data). `preset`: "mixed" (asymmetric u8
    activations, the default) or "performance" (symmetric); `estimator`: minmax (default),
    mean_minmax, percentile, mse, kl or auto (range_search: per tensor, the candidate with the least
    error at its readers' outputs, a second pass over the data); `ignore`: node names, ``re:REGEX`` or op types to leave
    in f32; `subset_size`: at most that many samples; `quiet`: no progress bar; `overflow_fix`: auto
    (default), none, first or all, which weights get a coarser grid so that AVX2's int16 pair sums do
    not saturate (lpt.calibration.overflow_fix; auto runs the int8 graph on the data as such a CPU
    does, one to three more passes); `smooth_quant`: SmoothQuant's alpha in [0, 1] (None: off), which
    moves activation outliers into the weights of the MatMul/Gemm reading them before the FQs are
    placed (lpt.calibration.smooth_quant; one more pass); `int8_recurrent`: LSTM/GRU become
    projection MatMuls and a Scan whose recurrent MatMuls read an int8 h, its range calibrated on the
    states h took (lpt.calibration.recurrent): True every one it takes, False none (they stay f32
    ops), None (the default) those of hidden size 256 or more (recurrent.AUTO_HIDDEN). `config` (a
    CalibrationConfig) replaces all of these at once. `batch_axes` ({input name: axis, or None for
    a fixed input fed whole with every batch}) overrides the batch axes guessed from the model's
    input shapes (state [2, N, 128] → 1, a scalar → None). `ray` ("local" or a Ray address): the
    statistics pass runs on `ray_workers` Ray workers (default: one per CPU), its statistics merged
    to the ranges one process gets (lpt.distributed); later passes run here. Bad data raises DataError, a model that
    cannot be calibrated ModelError, a bad option QuantizationError.
    """
    start = time.perf_counter()
    if config is None:
        config = CalibrationConfig(preset=preset, estimator=estimator, subset_size=subset_size,
                                   ignore=tuple([ignore] if isinstance(ignore, str) else ignore),
                                   bias_correction=bias_correction, skip_nonfinite=skip_nonfinite,
                                   overflow_fix=overflow_fix, smooth_quant=smooth_quant,
                                   int8_recurrent=int8_recurrent)
    working = _working_copy(model)
    data = open_data(data, working, batch_axes=batch_axes)  # a folder of images or audio: see lpt.data
    dataset = CalibrationData(data, input_specs(working), subset_size=config.subset_size,
                              batch_size=config.batch_size, skip_nonfinite=config.skip_nonfinite,
                              batch_axes=batch_axes)
    scans, recurrent_left = _scans(working, config)  # before placement: the projections are MatMuls to place
    smoothing = None
    if config.smooth_quant is not None:  # before placement: an inserted Mul moves where the FQ goes
        smoothing = smoothing_plan(working, dataset, config.smooth_quant, config.ignore, quiet=quiet)
        apply_smoothing(working, smoothing)
    placement = place(working, config.ignore)  # which tensors get an FQ
    collect = {} if ray is None else {"collect": _on_ray(ray, ray_workers)}  # the pass shared among Ray workers
    statistics = collect_statistics(working, placement, dataset, config, quiet=quiet,
                                    hidden_states=hidden_state_names(scans), **collect)  # one pass over the data
    if config.estimator == Estimator.AUTO:  # a second pass: each candidate's error at the layers' outputs
        ranges = search_ranges(working, placement, statistics, dataset, config, quiet=quiet)
    else:
        ranges = estimate_ranges(statistics, config)
    calibrated = fake_quantizes(placement, ranges, config.activations, config.weights)
    masks = channel_masks(config.overflow_fix, placement)  # 7-bit weight channels; auto: from the data, below
    fqs, corrected = _apply(working, placement, narrow(calibrated, masks), statistics, config)
    recurrent = quantize_scans(scans, statistics, config.activations, _recurrent_weights(config))
    for _ in range(MAX_ROUNDS if config.overflow_fix == OverflowFix.AUTO else 0):
        masks, grew = merge(masks, saturating_channels(working, placement, dataset, masks, fqs, quiet=quiet))
        if not grew:
            break
        working = _working_copy(model)  # narrowed from a fresh copy: the steps after the data pass again
        scans, _ = _scans(working, config)
        if smoothing is not None:
            apply_smoothing(working, smoothing)
        placement = place(working, config.ignore)
        calibrated = fake_quantizes(placement, ranges, config.activations, config.weights)
        fqs, corrected = _apply(working, placement, narrow(calibrated, masks), statistics, config)
        recurrent = quantize_scans(scans, statistics, config.activations, _recurrent_weights(config))
    branches, branches_left = calibrate_branches(working, lambda: _working_copy(model), dataset, config,
                                                 calibrate=calibrate, quiet=quiet)
    record_preprocess(working, data)  # a folder's preprocessing, so the FQ model is evaluated the same way
    left_f32 = list(placement.skipped) + recurrent_left + branches_left
    left_f32 += [Skipped(p.name, "tensor", "no finite statistics") for p in placement.activations if p not in fqs]
    tensors = [_describe(p, fq) for p, fq in fqs.items()]
    for branch in branches:  # what each branch's own calibration did
        tensors += branch.result.report.tensors
        left_f32 += branch.result.report.left_f32
        corrected += branch.result.report.bias_corrected

    report = CalibrationReport(
        preset=config.preset.value, estimator=config.estimator.value,
        tensors=tuple(tensors), left_f32=tuple(left_f32),
        samples=dataset.count, skipped_samples=dataset.skipped, bias_corrected=tuple(corrected),
        seconds=time.perf_counter() - start,
        overflow_fix=config.overflow_fix.value, narrowed=describe(calibrated, fqs, masks),
        smooth_quant=config.smooth_quant,
        smoothed=() if smoothing is None else tuple(t.describe() for t in smoothing.tensors),
        recurrent=tuple(recurrent),
    )
    logger.info("calibrated on %d samples: %s in %.2f s", dataset.count, report.fake_quantizes, report.seconds)
    return CalibrationResult(working, report, placement, statistics, ranges, config, masks, smoothing)


def _apply(working: ir.Model, placement: Placement, fqs: dict, statistics: Statistics, config: CalibrationConfig):
    """The steps after the data pass, in place on `working`: bias shifts for `fqs`, insert, shift. (fqs, corrected)"""
    targets = bias_targets(placement.layers) if config.bias_correction else []
    shifts = bias_shifts(targets, statistics.input_means, fqs, statistics.activations)  # before insert rewires inputs
    insert(working, fqs)
    return fqs, apply_shifts(working, targets, shifts)


def _scans(working: ir.Model, config: CalibrationConfig):
    """The LSTM/GRU of `working` that config.int8_recurrent takes (True: all; None: of hidden size
    AUTO_HIDDEN or more) rewritten into their Scan form, in place.
    (scans, ops left as they are with the reason)"""
    if config.int8_recurrent is False:
        return [], []
    return to_scans(working, IgnoreRules(config.ignore), min_hidden=0 if config.int8_recurrent else AUTO_HIDDEN)


def _recurrent_weights(config: CalibrationConfig) -> WeightScheme:
    """R's weights: 7 bits with --overflow-fix all, as every other weight then; else 8 (auto's emulation and
    first do not reach into the Scan bodies: README, "int8 on AVX2 CPUs")."""
    if config.overflow_fix == OverflowFix.ALL:
        return WeightScheme(levels=127, per_channel=config.weights.per_channel)
    return config.weights


def _on_ray(address: str, workers: int | None):
    """statistics.collect's Ray twin, bound to `address` and `workers` (lpt.distributed: Ray is optional)."""
    from functools import partial

    from lpt.distributed import collect

    return partial(collect, address=address, workers=workers)


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
    "CalibrationResult", "DEFAULT_ESTIMATOR", "DEFAULT_OVERFLOW_FIX", "DEFAULT_PRESET", "Estimator",
    "FakeQuantizedTensor", "InputSpec", "NarrowedLayer", "OverflowFix", "Placement", "Preset", "QuantizationPoint",
    "Skipped", "WeightScheme", "calibrate", "input_specs", "place",
]
