"""`lpt.quantize`: the whole job in one call, and the object holding everything it made.

    result = lpt.quantize("models/digits_cnn.onnx")          # data: digits_cnn.npz beside it
    result.save("digits_cnn")                                # digits_cnn.fq.onnx, digits_cnn.int8.onnx
    outputs = result.run("models/digits_cnn.test.npz")       # on lpt's int8 backend
    print(result.compare("models/digits_cnn.test.npz", labels="labels").to_dict())

The stages, each also callable on its own: load (normalize any FQ form) → calibrate (fp32
models only) → transform → compile → run on the data → cross-check with onnxruntime.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedOpsetsPass

from lpt.backend import Plan, compile_model
from lpt.calibration import CalibrationReport, calibrate
from lpt.calibration.accuracy_control import (
    DEFAULT_MAX_TIME,
    AccuracyControlReport,
    check_options,
    control_accuracy,
)
from lpt.calibration.data import CalibrationData, data_beside, input_specs, split_labels
from lpt.calibration.dynamic import DynamicReport, integer_agreement, quantize_dynamic
from lpt.calibration.dynamic import check_options as check_dynamic_options
from lpt.calibration.smooth_quant import smoothed_copy
from lpt.compare import Comparison, compare
from lpt.data.sources import FolderSource, open_data, record_preprocess
from lpt.errors import DataError, ModelError, QuantizationError
from lpt.execute import CrossCheck, check_samples, cross_check, run_plan
from lpt.export.int8 import ExportReport, to_standard_int8
from lpt.graph.fake_quantize_op import is_fake_quantize
from lpt.graph.rewrite import replace_value
from lpt.model_io import clone, prepare, read_model, to_proto
from lpt.normalize import normalize
from lpt.summary import OpPrecision, is_quantized, op_precisions
from lpt.transformations.pipeline import transform

logger = logging.getLogger(__name__)


@dataclass
class QuantizeReport:
    calibration: CalibrationReport | None  # None: the model came fake-quantized
    precisions: list[OpPrecision]
    check: CrossCheck
    agreement: Comparison  # the reference (fp32, or the FQ model) vs lpt's int8 run on the data
    seconds: dict[str, float] = field(default_factory=dict)
    accuracy_control: AccuracyControlReport | None = None  # with max_drop / min_sqnr: what was reverted
    data: dict | None = None  # a folder of images or audio: its files, preprocessing and files skipped as bad
    dynamic: DynamicReport | None = None  # with dynamic=True: which ops were quantized dynamically, which not

    @property
    def int8_ops(self) -> int:
        return sum(p.precision == "int8" for p in self.precisions)

    def to_dict(self) -> dict:
        calibration = None
        if self.calibration is not None:
            c = self.calibration
            calibration = {"preset": c.preset, "estimator": c.estimator, "fake_quantizes": c.fake_quantizes,
                           "left_f32": [{"node": s.node, "op": s.op_type, "reason": s.reason} for s in c.left_f32],
                           "samples": c.samples, "bias_corrected": list(c.bias_corrected),
                           "overflow_fix": c.overflow_fix, "narrowed": [dict(n.__dict__) for n in c.narrowed],
                           "smooth_quant": c.smooth_quant, "smoothed": list(c.smoothed),
                           "recurrent": [dict(r.__dict__) for r in c.recurrent]}
        return {
            "calibration": calibration,
            "ops": {k: sum(p.precision == k for p in self.precisions)
                    for k in ("int8", "quantize", "dequantize", "fused", "f32")},
            "f32_ops": [{"node": p.node, "op": p.op_type, "reason": p.reason}
                        for p in self.precisions if p.precision == "f32"],
            "cross_check": {"max_lsb": self.check.max_lsb, "share_exact": self.check.share_exact,
                            "max_lsb_per_layer": self.check.max_local_lsb,
                            "tensors": [t.__dict__ for t in self.check.tensors],
                            "outputs": [o.__dict__ for o in self.check.outputs]},
            "agreement": self.agreement.to_dict(),
            "seconds": self.seconds,
            "accuracy_control": None if self.accuracy_control is None else self.accuracy_control.to_dict(),
            "data": self.data,
            "dynamic": None if self.dynamic is None else self.dynamic.to_dict(),
        }


@dataclass
class QuantizeResult:
    fq_model: ir.Model
    int8_model: ir.Model
    plan: Plan
    report: QuantizeReport
    reference: ir.Model  # what the int8 model was compared with: the fp32 model, or the FQ model
    batch_axes: dict[str, int | None] | None = None  # as given to quantize: the default of run and compare

    def run(self, data, batch_size: int = 32, *, batch_axes=None) -> dict[str, np.ndarray]:
        """Outputs of the int8 model on lpt's backend over `data`."""
        dataset = CalibrationData(data, input_specs(self.int8_model), batch_size=batch_size,
                                  batch_axes=self.batch_axes if batch_axes is None else batch_axes)
        return run_plan(self.plan, dataset.batches())[0]

    def export(self) -> tuple[ir.Model, ExportReport]:
        """Standard ONNX int8 (QLinearConv, ...) for onnxruntime."""
        return to_standard_int8(self.int8_model)

    def compare(self, data, *, labels: str | None = None, per_layer: bool = False, batch_axes=None) -> Comparison:
        return compare(self.reference, self.fq_model, data, labels=labels, per_layer=per_layer,
                       batch_axes=self.batch_axes if batch_axes is None else batch_axes)

    def save(self, prefix: str | os.PathLike, *, overwrite: bool = False) -> tuple[Path, Path]:
        """PREFIX.fq.onnx (portable QDQ) and PREFIX.int8.onnx (lpt's int8 graph), atomically."""
        from lpt.export.portable import to_portable
        from lpt.model_io import write_models

        fq_path, int8_path = Path(f"{prefix}.fq.onnx"), Path(f"{prefix}.int8.onnx")
        for path in (fq_path, int8_path):  # check both before writing either
            if path.exists() and not overwrite:
                raise ModelError(f"{path}: already exists (pass --force / overwrite=True to replace it)")
        written = write_models([(to_portable(self.fq_model), fq_path), (to_portable(self.int8_model), int8_path)],
                               overwrite=overwrite)  # both pass the checker before either is written
        return written[0], written[1]


def quantize(model: str | os.PathLike | ir.Model, data=None, *, preset: str | None = None,
             estimator: str | None = None, subset_size: int = 300, ignore=(), bias_correction: bool = True,
             recalibrate: bool = False, skip_nonfinite: bool = False, quiet: bool = True,
             on_stage=None, batch_axes: dict[str, int | None] | None = None, max_drop: float | None = None,
             min_sqnr: float | None = None, max_time: float | None = DEFAULT_MAX_TIME, labels: str | None = None,
             eval_data=None, overflow_fix: str | None = None, smooth_quant: float | None = None,
             int8_recurrent: bool | None = None, dynamic: bool = False, ray: str | None = None,
             ray_workers: int | None = None) -> QuantizeResult:
    """fp32 or fake-quantized `model` → FQ model, int8 graph, compiled plan and report.

    `data` (path, arrays, or iterable of dicts) calibrates an fp32 model and is what the int8
    graph runs on for the report; by default the .npz beside a model path. A model that already
    holds FakeQuantize-equivalent patterns skips calibration unless `recalibrate`; so does one
    quantized dynamically (DynamicQuantizeLinear + ConvInteger), which runs as it is. Samples holding
    NaN/Inf are refused, or skipped with `skip_nonfinite`. `batch_axes` ({input name: axis, or
    None for a fixed input}) overrides the batch axes guessed from the model (see
    lpt.calibration.data). `on_stage(name)` is called as each stage starts (the CLI shows it).
    `overflow_fix` (auto, none, first, all; default: calibrate's) says which weights go to 7 bits so
    that AVX2's int16 pair sums cannot saturate (lpt.calibration.overflow_fix). `smooth_quant` (alpha
    in [0, 1], default None: off) runs SmoothQuant before placement (lpt.calibration.smooth_quant).
    `int8_recurrent` quantizes LSTM/GRU statically, their recurrent MatMuls included, as a projection
    MatMul and a Scan (lpt.calibration.recurrent): True every one lpt takes, False none (f32 ops), None
    (the default) those of hidden size 256 or more, and none under accuracy control.

    Accuracy control (lpt.calibration.accuracy_control): with `max_drop` (top-1 points; `labels` is
    the key of the labels in the evaluation data) or `min_sqnr` (dB, the worst output against fp32),
    the layers whose quantization costs most are reverted to f32, the fewest that meet the target on
    every sample of `eval_data` (default: `data`, calibration samples included), within `max_time`
    seconds (None: no limit); the model is returned even when the target is missed, and
    report.accuracy_control says so.

    `dynamic` (lpt.calibration.dynamic): no calibration; MatMul/Gemm weights to 8 bits per channel,
    activations quantized at run time (DynamicQuantizeLinear), LSTM/GRU input weights int8; `data` only
    measures the agreement with fp32.

    `ray` ("local", or a Ray address) and `ray_workers`: calibration's statistics pass, accuracy
    control's evaluations and the final comparison run on Ray workers (lpt.distributed).
    """
    seconds: dict[str, float] = {}
    on_ray = {} if ray is None else {"ray": ray, "ray_workers": ray_workers}  # lpt.distributed
    stage = on_stage or (lambda name: None)

    def timed(name, function, *args, **kwargs):
        stage(name)
        start = time.perf_counter()
        value = function(*args, **kwargs)
        seconds[name] = time.perf_counter() - start
        return value

    if dynamic:  # before any work
        check_dynamic_options(preset=preset, estimator=estimator, max_drop=max_drop, min_sqnr=min_sqnr,
                              overflow_fix=overflow_fix, smooth_quant=smooth_quant, recalibrate=recalibrate,
                              int8_recurrent=int8_recurrent)
    if max_drop is not None or min_sqnr is not None:
        check_options(max_drop, min_sqnr, labels, max_time)  # before any work, not after calibrating
        if int8_recurrent:
            raise QuantizationError("--int8-recurrent cannot be combined with --max-drop/--min-sqnr: accuracy "
                                    "control reverts FQs on the fp32 model, which has no Scan form of its LSTM/GRU")
        int8_recurrent = False  # for the same reason, auto takes none
    if data is None:
        if not isinstance(model, (str, os.PathLike)):
            raise DataError("no data given: pass sample inputs (an .npz path, arrays, or an iterable of dicts)")
        data = data_beside(model)
    original = timed("load", _load, model)
    # a folder of images or audio: its preprocessing (given, recorded in the model, or inferred) and labels
    data = open_data(data, original, labels=labels if _is_csv(labels) else None, batch_axes=batch_axes)
    # what calibrates and runs, and the labels beside it (a .npz's key, a folder's classes), if any
    inputs, data_labels = _inputs_and_labels(data, labels, [v.name for v in original.graph.inputs], eval_data)
    fq_model = clone(original)
    normalize(fq_model)
    # Fake-quantized, or quantized in a form lpt runs as it is (DynamicQuantizeLinear + ConvInteger).
    already_quantized = is_quantized(fq_model)
    calibration = accuracy_control = dynamic_report = None
    if dynamic:
        if already_quantized:
            raise QuantizationError("--dynamic (dynamic=True) quantizes an fp32 model; this one is quantized already")
        result = timed("quantize dynamically", quantize_dynamic, original, ignore=ignore)
        fq_model, dynamic_report, reference = result.model, result.report, original
    elif not already_quantized or recalibrate:
        options = {k: v for k, v in (("preset", preset), ("estimator", estimator), ("overflow_fix", overflow_fix),
                                     ("smooth_quant", smooth_quant), ("int8_recurrent", int8_recurrent))
                   if v is not None}
        fp32 = original if not already_quantized else _without_fake_quantize(fq_model)
        result = timed("calibrate", calibrate, fp32, inputs, subset_size=subset_size, ignore=ignore,
                       skip_nonfinite=skip_nonfinite, batch_axes=batch_axes,
                       bias_correction=bias_correction, quiet=quiet, **options, **on_ray)
        fq_model, calibration, reference = result.model, result.report, fp32
        normalize(fq_model)
        if max_drop is not None or min_sqnr is not None:
            if eval_data is None:
                logger.warning("accuracy control evaluates on the calibration data: pass eval_data (--eval-data) "
                               "for held-out samples")
            # FQs are reverted on the model they were placed on: smoothed (same function as fp32) if asked
            placed_on = fp32 if result.smoothing is None else smoothed_copy(fp32, result.smoothing)
            control = timed("accuracy control", control_accuracy, placed_on, result,
                            data if eval_data is None else eval_data, max_drop=max_drop, min_sqnr=min_sqnr,
                            labels=labels, max_time=max_time, batch_axes=batch_axes, **on_ray)
            fq_model, accuracy_control = control.model, control.report
    elif max_drop is not None or min_sqnr is not None:
        raise QuantizationError("max_drop / min_sqnr revert the FQs lpt calibrated: give an fp32 model, or "
                                "recalibrate=True (--recalibrate)")
    else:
        reference = fq_model
    record_preprocess(fq_model, data)  # the FQ model remembers a folder's preprocessing
    int8_model = clone(fq_model)
    timed("transform", transform, int8_model)
    plan = timed("compile", compile_model, int8_model)
    dataset = CalibrationData(inputs, input_specs(int8_model), subset_size=subset_size, skip_nonfinite=skip_nonfinite,
                              batch_axes=batch_axes)
    samples = check_samples(dataset)
    check = timed("cross-check", cross_check, fq_model, int8_model, plan, samples)
    if dynamic_report is not None:  # its integer tensors vs onnxruntime's: cross_check follows FQs, it has none
        check.tensors = integer_agreement(fq_model, plan, samples)
        check.local = integer_agreement(fq_model, plan, samples, local=True)
    # compare reads the data once: the first `subset_size` samples, as one dict (with their labels, if any)
    collected = dataset.collect()
    agreement = timed("run", compare, reference, fq_model, collected, batch_axes=batch_axes, **on_ray,
                      labels=None if data_labels is None else np.asarray(list(data_labels[:dataset.count])))
    report = QuantizeReport(calibration, op_precisions(int8_model, plan), check, agreement, seconds,
                            accuracy_control, data.summary() if isinstance(data, FolderSource) else None,
                            dynamic_report)
    return QuantizeResult(fq_model, int8_model, plan, report, reference, batch_axes)


def _is_csv(labels) -> bool:
    return isinstance(labels, (str, os.PathLike)) and str(labels).lower().endswith(".csv")


def _inputs_and_labels(data, labels, input_names: list[str], eval_data):
    """(the inputs, their labels or None): split_labels, where `labels` may be the key of labels that
    only the evaluation data holds (accuracy control), and a folder brings its own."""
    try:
        return split_labels(data, None if _is_csv(labels) else labels, input_names)
    except DataError:
        if labels is None or eval_data is None:
            raise
        return split_labels(data, None, input_names)


def _load(model) -> ir.Model:
    if isinstance(model, (str, os.PathLike)):
        return read_model(model)
    return ir.serde.deserialize_model(prepare(to_proto(model)))


def _without_fake_quantize(model: ir.Model) -> ir.Model:
    """A copy with every FakeQuantize bypassed, to calibrate afresh (weights keep their old rounding)."""
    stripped = clone(model)
    for node in list(ir.traversal.RecursiveGraphIterator(stripped.graph)):
        if is_fake_quantize(node):
            replace_value(node.outputs[0], node.inputs[0])
            node.graph.remove(node, safe=True)
    RemoveUnusedOpsetsPass()(stripped)
    return stripped
