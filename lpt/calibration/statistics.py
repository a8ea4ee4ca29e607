"""Activation statistics: onnxruntime runs the fp32 model with the target tensors as extra outputs,
one batch at a time, and each tensor's collector folds the batch into its fixed-size state."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import onnx
import onnx_ir as ir
import onnxruntime as ort

from lpt.calibration.data import CalibrationData
from lpt.calibration.progress import sample_progress
from lpt.errors import ModelError
from lpt.model_io import to_proto

logger = logging.getLogger(__name__)

# Bytes of fetched activations one onnxruntime run may hold: a batch past it runs in parts.
ACTIVATION_BUDGET = 1 << 30


def session(proto: onnx.ModelProto) -> ort.InferenceSession:
    """A CPU session with graph optimizations off: every tensor stays as the fp32 graph computes it."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own exception types
        line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelError(f"onnxruntime cannot run the model: {line}") from None


def with_outputs(model: ir.Model, names: Iterable[str]) -> onnx.ModelProto:
    """`model` as a proto whose graph also outputs the tensors `names` (those not inputs or outputs already)."""
    proto = to_proto(model)
    present = {o.name for o in proto.graph.output} | {i.name for i in proto.graph.input}
    for name in dict.fromkeys(names):
        if name not in present:
            proto.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return proto


def collect(model: ir.Model, collectors: dict[str, list], data: CalibrationData, *, quiet: bool = False) -> int:
    """Update the collectors of each tensor (by name) with every batch of `data`, streamed.

    Returns the bytes the fetched tensors take per sample, which sized the parts a batch ran in."""
    inputs = set(data.specs)
    fetched = [n for n in collectors if n not in inputs]
    sess = session(with_outputs(model, fetched)) if fetched else None
    return stream(sess, fetched, collectors, data, quiet=quiet)


def stream(sess: ort.InferenceSession | None, fetched: list[str], collectors: dict[str, list], data: CalibrationData,
           *, quiet: bool = False, per_sample: int = 0, description: str = "calibrating") -> int:
    """Run `sess` on every batch of `data` and update the collectors with the `fetched` outputs (and inputs).

    A batch runs in parts of ACTIVATION_BUDGET // `per_sample` samples; `per_sample` = 0: measured on
    the first sample (the bytes of the fetched outputs). Returns `per_sample`."""
    with sample_progress(description, data.total, quiet) as advance:
        for batch in data.batches():
            per_sample = fold(sess, fetched, collectors, data, batch, per_sample, advance)
    warn_nonfinite(collectors)
    return per_sample


def fold(sess: ort.InferenceSession | None, fetched: list[str], collectors: dict[str, list], data: CalibrationData,
         batch: dict, per_sample: int = 0, advance=lambda samples: None) -> int:
    """Update the collectors with one batch, run in parts of ACTIVATION_BUDGET // `per_sample` samples
    (`data` says how to split it: samples_in, part, fixed_batch); returns `per_sample` (measured if 0).
    lpt.distributed calls it on each worker's batches."""
    total, start = data.samples_in(batch), 0
    if sess is not None and not per_sample and not data.fixed_batch:
        per_sample = max(1, sum(v.nbytes for v in sess.run(fetched, data.part(batch, 0, 1))))
    # A batch of large activations (a detector at 640×640) runs in parts that fit the budget.
    size = total if data.fixed_batch or not per_sample else max(1, ACTIVATION_BUDGET // per_sample)
    while start < total:
        part = batch if size >= total else data.part(batch, start, min(total, start + size))
        values = dict(zip(fetched, sess.run(fetched, part))) if sess is not None else {}
        for name, tensor_collectors in collectors.items():
            for collector in tensor_collectors:
                collector.update(values[name] if name in values else part[name])
        del values
        samples = data.samples_in(part)
        start += samples
        advance(samples)
    return per_sample


def warn_nonfinite(collectors: dict[str, list]) -> None:
    """One warning per tensor whose activations held NaN/Inf (left out of its statistics)."""
    for name, tensor_collectors in collectors.items():
        nonfinite = max(c.nonfinite for c in tensor_collectors)
        if nonfinite:
            logger.warning("%s: %d NaN/Inf values in the activations were left out of its statistics", name, nonfinite)
