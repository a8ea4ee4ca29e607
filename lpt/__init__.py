"""lpt: OpenVINO-style low-precision (int8) transformations for ONNX models.

    import lpt
    model = lpt.load("models/digits_cnn.ort_qdq.onnx")   # every FQ-equivalent form → lpt::FakeQuantize
    print(lpt.summarize(model))
    lpt.save(model, "normalized.onnx")                    # standard ONNX again (QDQ where exact)
    lpt.transform(model)                                  # the int8 graph (runtime stage)
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import onnx_ir as ir

from lpt.backend import compile_model
from lpt.calibration import CalibrationResult, calibrate
from lpt.compare import Comparison, compare
from lpt.pipeline import QuantizeResult, quantize
from lpt.errors import DataError, LptError, ModelError, QuantizationError
from lpt.export.portable import to_portable
from lpt.graph.fake_quantize_op import FakeQuantize, read_fake_quantize
from lpt import model_io
from lpt.export.int8 import ExportReport, to_standard_int8 as export_int8
from lpt.model_io import clone, read_model, write_model
from lpt.normalize import normalize
from lpt.reference import run_reference
from lpt.summary import ModelSummary, OpPrecision, op_precisions, summarize
from lpt.transformations.pipeline import INT8_GRAPH_KEY, INT8_GRAPH_VALUE, TransformResult
from lpt.transformations.pipeline import transform as _transform

try:
    __version__ = version("lpt")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"


def load(path: str | os.PathLike) -> ir.Model:
    """Read an ONNX model and normalize every FakeQuantize-equivalent pattern in it (an int8
    graph lpt saved is read as it is)."""
    model = read_model(path)
    if model.metadata_props.get(INT8_GRAPH_KEY) != INT8_GRAPH_VALUE:
        normalize(model)
    return model


def transform(model: ir.Model, transformations=None) -> TransformResult:
    """The runtime stage, in place: FakeQuantize → quantize + dequantize, dequantizations moved down,
    weights quantized, Conv/MatMul/Gemm on integers. `transformations` runs a subset (see
    lpt.transformations.pipeline for the list)."""
    if transformations is None:
        return _transform(model)
    return _transform(model, tuple(transformations))


def run(model: str | os.PathLike | ir.Model, data, *, batch_size: int = 32, check: bool = False, threads: int = 0):
    """Run a fake-quantized or int8 `model` on lpt's backend over `data` (path, arrays, or iterable of dicts).

    Returns a RunResult: outputs by name (concatenated over the data), the compiled plan (its
    int8/f32 split) and, with `check`, the cross-check against onnxruntime on the first batch.
    """
    from lpt.calibration.data import CalibrationData, input_specs, split_labels
    from lpt.execute import RunResult, cross_check, run_plan

    fq_model = load(model) if isinstance(model, (str, os.PathLike)) else model
    int8_model = clone(fq_model)
    transform(int8_model)
    plan = compile_model(int8_model, threads=threads)
    specs = input_specs(int8_model)
    inputs, _ = split_labels(data, None, [s.name for s in specs])  # a test file's labels are not inputs
    dataset = CalibrationData(inputs, specs, batch_size=batch_size)
    outputs, seconds = run_plan(plan, dataset.batches())
    result = RunResult(outputs, plan, seconds)
    if check:
        first = next(iter(dataset.batches()))
        result.check = cross_check(fq_model, int8_model, plan, first)
    return result


def save(model: ir.Model, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write `model` as standard ONNX (QDQ where exact, OpenVINO FakeQuantize otherwise), atomically."""
    return write_model(to_portable(model), path, overwrite=overwrite)


__all__ = [
    "DataError", "FakeQuantize", "LptError", "ModelError", "ModelSummary", "OpPrecision", "QuantizationError",
    "CalibrationResult", "calibrate", "Comparison", "QuantizeResult", "compare", "quantize", "ExportReport", "TransformResult", "clone", "compile_model", "export_int8", "load", "model_io", "run", "normalize", "op_precisions", "read_fake_quantize", "read_model", "run_reference",
    "save", "summarize", "to_portable", "transform", "write_model", "__version__",
]
