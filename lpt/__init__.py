"""lpt: OpenVINO-style low-precision (int8) transformations for ONNX models.

    import lpt
    result = lpt.quantize("models/digits_cnn.onnx")       # the whole job, see lpt.pipeline

    model = lpt.load("models/digits_cnn.ort_qdq.onnx")   # every FQ-equivalent form → lpt::FakeQuantize
    print(lpt.summarize(model))
    lpt.transform(model)                                  # the runtime stage: the int8 graph
    lpt.save(model, "digits_cnn.int8.onnx")
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import onnx_ir as ir

from lpt import model_io
from lpt.backend import compile_model
from lpt.calibration import CalibrationResult, calibrate
from lpt.calibration.accuracy_control import AccuracyControlReport, control_accuracy
from lpt.compare import Comparison, compare
from lpt.data import AudioOptions, Dataset, ImageOptions, open_data
from lpt.errors import DataError, LptError, ModelError, QuantizationError
from lpt.execute import RunResult, run
from lpt.export.int8 import ExportReport
from lpt.export.int8 import to_standard_int8 as export_int8
from lpt.export.portable import to_portable
from lpt.graph.fake_quantize_op import FakeQuantize, read_fake_quantize
from lpt.model_io import clone, read_model, write_model
from lpt.normalize import normalize
from lpt.pipeline import QuantizeResult, quantize
from lpt.reference import run_reference
from lpt.summary import ModelSummary, OpPrecision, op_precisions, summarize
from lpt.transformations.pipeline import DECOMPOSITION, INT8_GRAPH_KEY, INT8_GRAPH_VALUE, MAIN, TransformResult
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


def transform(model: ir.Model, transformations=DECOMPOSITION + MAIN) -> TransformResult:
    """The runtime stage, in place: FakeQuantize → quantize + dequantize, dequantizations moved down,
    weights quantized, Conv/MatMul/Gemm on integers. Pass some of lpt.transformations.pipeline's
    classes to run only those."""
    return _transform(model, tuple(transformations))


def save(model: ir.Model, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write `model` as standard ONNX (QDQ where exact, OpenVINO FakeQuantize otherwise), atomically."""
    return write_model(to_portable(model), path, overwrite=overwrite)


__all__ = [
    "CalibrationResult", "Comparison", "DataError", "ExportReport", "FakeQuantize", "LptError", "ModelError",
    "ModelSummary", "OpPrecision", "QuantizationError", "QuantizeResult", "RunResult", "TransformResult",
    "__version__", "calibrate", "clone", "compare", "compile_model", "export_int8", "load", "model_io",
    "normalize", "op_precisions", "quantize", "read_fake_quantize", "read_model", "run", "run_reference", "save",
    "summarize", "to_portable", "transform", "write_model",
    "AudioOptions", "Dataset", "ImageOptions", "open_data",
    "AccuracyControlReport", "control_accuracy",
]
