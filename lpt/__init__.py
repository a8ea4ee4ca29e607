"""lpt: OpenVINO-style low-precision (int8) transformations for ONNX models.

    import lpt
    model = lpt.load("models/digits_cnn.ort_qdq.onnx")   # every FQ-equivalent form → lpt::FakeQuantize
    print(lpt.summarize(model))
    lpt.save(model, "normalized.onnx")                    # standard ONNX again (QDQ where exact)
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
from lpt.summary import ModelSummary, summarize

try:
    __version__ = version("lpt")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"


def load(path: str | os.PathLike) -> ir.Model:
    """Read an ONNX model and normalize every FakeQuantize-equivalent pattern in it."""
    model = read_model(path)
    normalize(model)
    return model


def save(model: ir.Model, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write `model` as standard ONNX (QDQ where exact, OpenVINO FakeQuantize otherwise), atomically."""
    return write_model(to_portable(model), path, overwrite=overwrite)


__all__ = [
    "DataError", "FakeQuantize", "LptError", "ModelError", "ModelSummary", "QuantizationError",
    "load", "normalize", "read_fake_quantize", "read_model", "run_reference", "save", "summarize",
    "to_portable", "write_model", "__version__",
]
