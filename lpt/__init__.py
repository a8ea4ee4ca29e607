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

from lpt.errors import DataError, LptError, ModelError, QuantizationError
from lpt.export.portable import to_portable
from lpt.graph.fake_quantize_op import FakeQuantize, read_fake_quantize
from lpt.model_io import read_model, write_model
from lpt.normalize import normalize
from lpt.reference import run_reference
from lpt.summary import ModelSummary, OpPrecision, op_precisions, summarize
from lpt.transformations.pipeline import TransformResult
from lpt.transformations.pipeline import transform as _transform

try:
    __version__ = version("lpt")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"


def load(path: str | os.PathLike) -> ir.Model:
    """Read an ONNX model and normalize every FakeQuantize-equivalent pattern in it."""
    model = read_model(path)
    normalize(model)
    return model


def transform(model: ir.Model, transformations=None) -> TransformResult:
    """The runtime stage, in place: FakeQuantize → quantize + dequantize, dequantizations moved down,
    weights quantized, Conv/MatMul/Gemm on integers. `transformations` runs a subset (see
    lpt.transformations.pipeline for the list)."""
    if transformations is None:
        return _transform(model)
    return _transform(model, tuple(transformations))


def save(model: ir.Model, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write `model` as standard ONNX (QDQ where exact, OpenVINO FakeQuantize otherwise), atomically."""
    return write_model(to_portable(model), path, overwrite=overwrite)


__all__ = [
    "DataError", "FakeQuantize", "LptError", "ModelError", "ModelSummary", "OpPrecision", "QuantizationError",
    "TransformResult", "load", "normalize", "op_precisions", "read_fake_quantize", "read_model", "run_reference",
    "save", "summarize", "to_portable", "transform", "write_model", "__version__",
]
