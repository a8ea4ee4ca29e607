"""Reading and writing ONNX files safely: clear errors, no escaping external data, atomic writes."""

from __future__ import annotations

import io
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from lpt.errors import ModelError

logger = logging.getLogger(__name__)


def read_model_proto(path: str | os.PathLike) -> onnx.ModelProto:
    """Parse and check an ONNX file; every failure is a ModelError with a one-line message."""
    path = Path(path)
    if not path.exists():
        raise ModelError(f"{path}: no such file")
    if not path.is_file():
        raise ModelError(f"{path}: not a file")
    try:
        proto = onnx.load_model(str(path), load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError) as err:
        raise ModelError(f"{path}: not an ONNX model, or a truncated one ({_first_line(err)})") from None
    if not proto.graph.node and not proto.graph.output:
        # protobuf parses many non-ONNX byte strings into an empty message
        raise ModelError(f"{path}: not an ONNX model (no graph found)")
    _load_external_data(proto, path.parent.resolve())
    check_model(proto, str(path))
    return prepare(proto, str(path))


def read_model(path: str | os.PathLike) -> ir.Model:
    """The model at `path` as an onnx_ir Model (checked, external data loaded safely, prepared)."""
    return ir.serde.deserialize_model(read_model_proto(path))


# QuantizeLinear/DequantizeLinear take `axis` (per-channel scales) from opset 13 on.
MIN_OPSET = 13


def prepare(proto: onnx.ModelProto, label: str = "model") -> onnx.ModelProto:
    """The model at an opset that can say what lpt writes, with every value's type and shape inferred.

    Below MIN_OPSET the model is converted by onnx's version converter (the same computation, newer
    op versions); a conversion that fails is a ModelError. Shape inference is not strict: a value
    it cannot type stays untyped, and lpt's passes treat its rank as unknown.
    """
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is not None and opset < MIN_OPSET:
        try:
            proto = onnx.version_converter.convert_version(proto, MIN_OPSET)
            onnx.checker.check_model(proto)
        except Exception as err:  # noqa: BLE001 - the converter raises many kinds; all mean the same here
            raise ModelError(f"{label}: opset {opset} is older than {MIN_OPSET}, which lpt needs to write per-channel "
                             f"quantization, and onnx's version converter failed: {_first_line(err)}") from None
        logger.info("%s: converted from opset %d to %d", label, opset, MIN_OPSET)
    try:
        return onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception as err:  # noqa: BLE001 - a model onnxruntime runs can still trip the inference
        logger.warning("%s: shape inference failed (%s); going on with the types the model declares",
                       label, _first_line(err))
        return proto


def check_model(proto: onnx.ModelProto, label: str = "model") -> None:
    """onnx.checker, with its verdict as a ModelError. Custom domains are allowed."""
    try:
        onnx.checker.check_model(proto)
    except (onnx.checker.ValidationError, ValueError) as err:
        raise ModelError(f"{label}: fails onnx.checker: {_first_line(err)}") from None


def _load_external_data(proto: onnx.ModelProto, base_dir: Path) -> None:
    """Load external tensors only from files inside the model's own folder."""
    tensors = [
        t
        for t in onnx.external_data_helper._get_all_tensors(proto)
        if onnx.external_data_helper.uses_external_data(t)
    ]
    for tensor in tensors:
        info = onnx.external_data_helper.ExternalDataInfo(tensor)
        location = Path(info.location)
        target = (base_dir / location).resolve()
        # Checked before anything is opened: a model must not make lpt read /etc/passwd.
        if location.is_absolute() or not target.is_relative_to(base_dir):
            raise ModelError(
                f"tensor {tensor.name!r}: external data path {info.location!r} points outside "
                f"the model's folder {base_dir}; refusing to read it"
            )
        if not target.is_file():
            raise ModelError(f"tensor {tensor.name!r}: external data file {info.location!r} is missing")
    if tensors:
        onnx.external_data_helper.load_external_data_for_model(proto, str(base_dir))


def to_proto(model: ir.Model) -> onnx.ModelProto:
    """Serialize with an IR version that onnxruntime accepts (the lowest the opsets allow)."""
    proto = ir.serde.serialize_model(model)
    # A type without a shape is invalid in value_info (onnx.checker); such hints are dropped.
    known = [v for v in proto.graph.value_info if v.type.tensor_type.HasField("shape")]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(known)
    imported = {op.domain for op in proto.opset_import}
    for domain in sorted(used_domains(model) - imported):  # lpt's own ops, added by passes that import nothing
        proto.opset_import.append(onnx.helper.make_opsetid(domain, 1))
    standard = [op for op in proto.opset_import if op.domain in ("", "ai.onnx", "ai.onnx.ml")]
    proto.ir_version = max(7, onnx.helper.find_min_ir_version_for(standard, ignore_unknown=True))
    return proto


def used_domains(model: ir.Model) -> set[str]:
    """The op domains of every node, subgraphs included ("" for the standard one)."""
    return {"" if n.domain == "ai.onnx" else n.domain for n in ir.traversal.RecursiveGraphIterator(model.graph)}


def write_model(model: ir.Model | onnx.ModelProto, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write atomically (temp file + rename), never over an existing file unless asked."""
    proto = model if isinstance(model, onnx.ModelProto) else to_proto(model)
    return write_bytes(proto.SerializeToString(), path, overwrite=overwrite)


def write_arrays(arrays: dict[str, np.ndarray], path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Save arrays as an .npz (no pickles), atomically."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return write_bytes(buffer.getvalue(), path, overwrite=overwrite)


def write_bytes(data: bytes, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write `data` to a temp file beside `path`, then rename it over: readers never see half a file."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise ModelError(f"{path}: already exists (pass --force / overwrite=True to replace it)")
    if not path.parent.is_dir():
        raise ModelError(f"{path.parent}: no such folder")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    logger.info("wrote %s (%d bytes)", path, len(data))
    return path


def clone(model: ir.Model) -> ir.Model:
    """An independent graph to rewrite (passes work in place); tensors are shared, never written to."""
    return model.clone()


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
