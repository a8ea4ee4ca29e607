"""Reading and writing ONNX files safely: clear errors, no escaping external data, atomic writes."""

from __future__ import annotations

import io
import logging
import math
import mmap
import os
import stat
import tempfile
from collections import ChainMap
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from lpt import limits, paths
from lpt.errors import ModelError, OutputError, size_text

logger = logging.getLogger(__name__)


def read_model_proto(path: str | os.PathLike) -> onnx.ModelProto:
    """Parse and check an ONNX file; every failure is a ModelError with a one-line message."""
    path = Path(path)
    check_model_file(path)
    paths.note_read(path, "the model")
    try:
        proto = onnx.load_model(str(path), load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError) as err:
        raise ModelError(f"{path}: not an ONNX model, or a truncated one ({_first_line(err)})") from None
    if not proto.graph.node and not proto.graph.output:
        # protobuf parses many non-ONNX byte strings into an empty message
        raise ModelError(f"{path}: not an ONNX model (no graph found)")
    check_node_count(proto, str(path))  # before the checker, whose time grows with the nodes too
    _load_external_data(proto, path)
    check_model(proto, str(path))
    return prepare(proto, str(path))


# Protobuf cannot parse a message of 2 GiB or more: a larger model keeps its weights in external data.
MAX_MODEL_BYTES = (2 << 30) - 1
# A ModelProto's fields: number → wire type (2: length-delimited, 0: varint).
_MODEL_FIELDS = {f.number: 2 if f.type in (f.TYPE_MESSAGE, f.TYPE_STRING, f.TYPE_BYTES) else 0
                 for f in onnx.ModelProto.DESCRIPTOR.fields}
_GRAPH_FIELD = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_FIELDS_WALKED = 100_000  # top-level fields checked; a model has a dozen


def check_model_file(path: str | os.PathLike) -> int:
    """The size of the file at `path`, once it is known to be a plausible ONNX model, before it is read.

    Refused with a ModelError: a missing file, anything but a regular file (a FIFO would block the
    read forever), an empty file, one of 2 GiB or more (what protobuf can parse), and one whose
    top-level fields cannot be a ModelProto's: the tags and lengths are walked without reading the
    contents (a file of zeros fails at its first byte, a truncated one where a field overruns the
    end), and a graph must be among them.
    """
    path = Path(path)
    info = paths.stat_of(path, ModelError, "no such file")
    if stat.S_ISDIR(info.st_mode):
        raise ModelError(f"{path}: not a file (a folder)")
    if not stat.S_ISREG(info.st_mode):
        raise ModelError(f"{path}: not a regular file ({paths.kind(info.st_mode)}); lpt reads models from files")
    if info.st_size == 0:
        raise ModelError(f"{path}: an empty file, not an ONNX model")
    if info.st_size > MAX_MODEL_BYTES:
        raise ModelError(f"{path}: {size_text(info.st_size)}, more than the 2 GiB an ONNX file can hold (protobuf's "
                         "limit); a larger model keeps its weights in external data files")
    try:
        with open(path, "rb") as f:
            _walk_model_fields(f, info.st_size, path)
    except OSError as err:
        raise ModelError(f"{path}: cannot read ({err.strerror})") from None
    return info.st_size


def _walk_model_fields(f, size: int, path: Path) -> None:
    offset, graph = 0, False
    for count in range(_FIELDS_WALKED):
        if offset >= size:
            break
        start = offset
        tag, offset = _varint(f, offset, size)
        number, wire = (tag >> 3, tag & 7) if tag is not None else (0, 0)
        if number == 0 or wire not in (0, 1, 2, 5) or _MODEL_FIELDS.get(number, wire) != wire:
            if count == 0:
                raise ModelError(f"{path}: not an ONNX model (its first bytes cannot start one)")
            raise ModelError(f"{path}: not an ONNX model, or a corrupt one (no valid field at byte {start})")
        if wire == 0:
            value, offset = _varint(f, offset, size)
            if value is None:
                raise ModelError(f"{path}: not an ONNX model, or a truncated one (field {number} at byte {start} "
                                 "is cut off)")
        else:
            if wire == 2:
                length, offset = _varint(f, offset, size)
                if length is None:
                    raise ModelError(f"{path}: not an ONNX model, or a truncated one (field {number} at byte "
                                     f"{start} is cut off)")
            else:
                length = 8 if wire == 1 else 4
            offset += length
            if offset > size:
                name = "the graph" if number == _GRAPH_FIELD else f"field {number}"
                raise ModelError(f"{path}: not an ONNX model, or a truncated one ({name} at byte {start} runs "
                                 f"{offset - size} bytes past the end of the file)")
            f.seek(offset)
        graph = graph or number == _GRAPH_FIELD
    else:
        return  # a file of that many fields: left to the parser
    if not graph:
        raise ModelError(f"{path}: not an ONNX model (no graph found)")


def _varint(f, offset: int, size: int) -> tuple[int | None, int]:
    """A protobuf varint at `offset` (None if cut off by the end of the file, or longer than 10 bytes)."""
    value = 0
    for shift in range(0, 70, 7):
        byte = f.read(1)
        if not byte:
            return None, size
        offset += 1
        value |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return value, offset
    return None, offset


def model_files(path: str | os.PathLike) -> list[Path]:
    """The model file, then the external data files it names, checked as `read_model` checks them
    (check_model_file; external data inside the model's folder, regular files, sizes that fit the
    tensors), without loading any tensor. The model is parsed only if it can hold external data."""
    path = Path(path)
    check_model_file(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
        external = view.find(b"location") >= 0  # every external tensor names its file under this key
    if not external:
        return [path]
    try:
        proto = onnx.load_model(str(path), load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError) as err:
        raise ModelError(f"{path}: not an ONNX model, or a truncated one ({_first_line(err)})") from None
    return [path, *sorted({target for _, target in _external_tensors(proto, path)})]


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
    check_node_count(proto, label)
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
        proto = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception as err:  # noqa: BLE001 - a model onnxruntime runs can still trip the inference
        logger.warning("%s: shape inference failed (%s); going on with the types the model declares",
                       label, _first_line(err))
    check_shapes(proto, label)
    return proto


# What lpt holds per node as it works (the graph, its copies, a plan): the peak memory of
# `lpt quantize` on a 20k-node chain of Adds, over the node count, was 33 KiB.
BYTES_PER_NODE = 32 << 10


# onnx's shape inference takes time growing with the square of the subgraph count (each sees every
# value of its outer scopes): 8k took 1.3 s, 40k 80 s.
MAX_SUBGRAPHS = 10_000


def check_node_count(proto: onnx.ModelProto, label: str = "model") -> None:
    """Refuse a graph (subgraphs included) whose nodes alone would take lpt past limits.max_memory(),
    or with more than MAX_SUBGRAPHS subgraphs."""
    count, subgraphs, graphs = 0, -1, [proto.graph]
    while graphs:
        graph = graphs.pop()
        count, subgraphs = count + len(graph.node), subgraphs + 1
        graphs.extend(g for n in graph.node for a in n.attribute for g in [*([a.g] if a.HasField("g") else []),
                                                                             *a.graphs])
    if subgraphs > MAX_SUBGRAPHS:
        raise ModelError(f"{label}: {subgraphs} subgraphs (If, Loop and Scan bodies), more than the {MAX_SUBGRAPHS} "
                         "lpt takes: the time to infer their shapes grows with their square")
    budget = limits.max_memory()
    if count * BYTES_PER_NODE > budget:
        raise ModelError(f"{label}: {count} nodes; lpt holds about {BYTES_PER_NODE >> 10} KiB per node as it works "
                         f"({size_text(count * BYTES_PER_NODE)}), more than the memory budget of {size_text(budget)} "
                         "(--max-memory raises it)")


# Conv-like ops: (input index of x, of the weight).
_CONVS = {"Conv": (0, 1), "ConvTranspose": (0, 1), "ConvInteger": (0, 1), "QLinearConv": (0, 3)}


def check_shapes(proto: onnx.ModelProto, label: str = "model") -> None:
    """Refuse, naming the node, what shape inference knows is wrong before anything runs:

    - a value whose known dims take more than limits.max_memory() (a ConstantOfShape, Expand, Tile or
      Reshape of constant shapes asking for gigabytes); unknown dims count as 1, so the size is a
      lower bound and a refusal is never a false alarm;
    - a Conv-like node whose weight's rank is not its input's, or disagrees with its kernel_shape
      (onnx's inference trusts kernel_shape, and onnxruntime fails only when the node runs).
    """
    budget = limits.max_memory()
    for graph, types in _graphs(proto.graph, {}):
        for node in graph.node:
            for name in node.output:
                size = _known_bytes(types.get(name))
                if size is not None and size > budget:
                    raise ModelError(f"{label}: node {node.name!r} ({node.op_type}) makes {name!r}, "
                                     f"{_type_text(types[name])}: {size_text(size)}, more than the memory budget "
                                     f"of {size_text(budget)} (--max-memory raises it)")
            if node.op_type in _CONVS and node.domain in ("", "ai.onnx"):
                _check_conv(node, types, label)


def _graphs(graph: onnx.GraphProto, outer: Mapping[str, onnx.TypeProto]):
    """(graph, its value types, the outer scopes' included) of `graph` and every subgraph in it."""
    types = ChainMap({}, outer)  # not a copy of the outer types per subgraph: 10k Ifs would copy 10k times
    for info in [*graph.input, *graph.value_info, *graph.output]:
        if info.type.HasField("tensor_type"):
            types[info.name] = info.type
    for tensor in graph.initializer:
        types[tensor.name] = onnx.helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims))
    yield graph, types
    for node in graph.node:
        for attribute in node.attribute:
            for sub in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                yield from _graphs(sub, types)


def _dims(type_proto: onnx.TypeProto | None) -> list[int | str] | None:
    """A tensor type's dims (a name or "?" for an unknown one), or None when its rank is unknown."""
    if type_proto is None or not type_proto.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in type_proto.tensor_type.shape.dim]


def _known_bytes(type_proto: onnx.TypeProto | None) -> int | None:
    dims = _dims(type_proto)
    if dims is None:
        return None
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(type_proto.tensor_type.elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    return math.prod(d for d in dims if isinstance(d, int)) * itemsize


def _type_text(type_proto: onnx.TypeProto) -> str:
    dtype = onnx.helper.tensor_dtype_to_np_dtype(type_proto.tensor_type.elem_type)
    return f"{np.dtype(dtype).name} [{', '.join(map(str, _dims(type_proto)))}]"


def _check_conv(node: onnx.NodeProto, types: dict[str, onnx.TypeProto], label: str) -> None:
    x_index, w_index = _CONVS[node.op_type]
    if len(node.input) <= w_index:
        return  # onnx.checker has said so already
    x, w = node.input[x_index], node.input[w_index]
    x_dims, w_dims = _dims(types.get(x)), _dims(types.get(w))
    where = f"{label}: node {node.name!r} ({node.op_type})"
    if w_dims is None:
        return
    if len(w_dims) < 3:
        raise ModelError(f"{where}: weight {w!r} is {w_dims} (rank {len(w_dims)}); a convolution's weight has "
                         "rank 3 or more ([out, in, *kernel])")
    if x_dims is not None and len(x_dims) != len(w_dims):
        raise ModelError(f"{where}: weight {w!r} is {w_dims} (rank {len(w_dims)}), but input {x!r} has rank "
                         f"{len(x_dims)}; the weight has its input's rank")
    kernel = next((list(a.ints) for a in node.attribute if a.name == "kernel_shape"), None)
    if kernel is not None and (len(kernel) != len(w_dims) - 2 or any(
            isinstance(d, int) and d != k for d, k in zip(w_dims[2:], kernel))):
        raise ModelError(f"{where}: kernel_shape {kernel} does not match weight {w!r} {w_dims}")


def check_model(proto: onnx.ModelProto, label: str = "model") -> None:
    """onnx.checker, with its verdict as a ModelError. Custom domains are allowed."""
    try:
        onnx.checker.check_model(proto)
    except (onnx.checker.ValidationError, ValueError) as err:
        raise ModelError(f"{label}: fails onnx.checker: {_first_line(err)}") from None


def _load_external_data(proto: onnx.ModelProto, path: Path) -> None:
    """Load external tensors, checked by _external_tensors, only from files inside the model's own folder."""
    found = _external_tensors(proto, path)
    for _, target in found:
        paths.note_read(target, f"external data of the model {path}")
    if found:
        try:
            onnx.external_data_helper.load_external_data_for_model(proto, str(path.parent.resolve()))
        except (OSError, ValueError, onnx.checker.ValidationError) as err:
            raise ModelError(f"{path}: cannot read its external data ({_first_line(err)})") from None


def _external_tensors(proto: onnx.ModelProto, path: Path) -> list[tuple[onnx.TensorProto, Path]]:
    """(tensor, file) of every tensor kept in external data, each checked before anything is read:
    the file lies inside the model's folder and is a regular file, the declared length is what the
    tensor's dims and type take, that many bytes lie in the file from the offset (the length is set
    where the model leaves it out, so no more is ever read), and all of them fit this machine's memory."""
    base_dir = path.parent.resolve()
    found, total = [], 0
    for tensor in onnx.external_data_helper._get_all_tensors(proto):
        if not onnx.external_data_helper.uses_external_data(tensor):
            continue
        name = tensor.name
        try:
            info = onnx.external_data_helper.ExternalDataInfo(tensor)
        except ValueError as err:
            raise ModelError(f"{path}: tensor {name!r}: {_first_line(err)}") from None
        location = Path(info.location)
        target = (base_dir / location).resolve()
        # Checked before anything is opened: a model must not make lpt read /etc/passwd.
        if not info.location or location.is_absolute() or not target.is_relative_to(base_dir):
            raise ModelError(
                f"tensor {name!r}: external data path {info.location!r} points outside "
                f"the model's folder {base_dir}; refusing to read it"
            )
        try:
            mode = os.stat(target)
        except OSError:
            raise ModelError(f"tensor {name!r}: external data file {info.location!r} is missing") from None
        if not stat.S_ISREG(mode.st_mode):
            raise ModelError(f"tensor {name!r}: external data file {info.location!r} is not a regular file "
                             f"({paths.kind(mode.st_mode)})")
        offset, needed = info.offset or 0, _tensor_bytes(tensor, path)
        if needed is not None:
            if info.length is not None and info.length != needed:
                raise ModelError(f"{path}: tensor {name!r} declares {info.length} bytes of external data, but its "
                                 f"dims {list(tensor.dims)} take {needed}")
            if offset + needed > mode.st_size:
                raise ModelError(f"{path}: tensor {name!r} takes {size_text(needed)} from byte {offset} of "
                                 f"{info.location!r}, which holds {size_text(mode.st_size)}")
            if info.length is None:
                tensor.external_data.add(key="length", value=str(needed))
            total += needed
        found.append((tensor, target))
    memory = limits.machine_memory()
    if memory is not None and total > memory:
        raise ModelError(f"{path}: its external tensors take {size_text(total)}, more than this machine's memory "
                         f"({size_text(memory)})")
    return found


# Bits per element of the packed ONNX types (two or four values to a byte).
_PACKED_BITS = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2}


def _tensor_bytes(tensor: onnx.TensorProto, path: Path) -> int | None:
    """The bytes a tensor's dims and type take as raw data (None for a type of no fixed size)."""
    if any(d < 0 for d in tensor.dims):
        raise ModelError(f"{path}: tensor {tensor.name!r} has a negative dim {list(tensor.dims)}")
    if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return None
    count = math.prod(tensor.dims)
    type_name = onnx.TensorProto.DataType.Name(tensor.data_type) if tensor.data_type in \
        onnx.TensorProto.DataType.values() else None
    if type_name in _PACKED_BITS:
        return (count * _PACKED_BITS[type_name] + 7) // 8
    try:
        return count * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None


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
    """Write atomically (temp file + rename), never over an existing file unless asked, and only a
    model that passes onnx.checker with full shape inference (checked_bytes)."""
    return write_models([(model, path)], overwrite=overwrite)[0]


def write_models(models: list[tuple[ir.Model | onnx.ModelProto, str | os.PathLike]], *,
                 overwrite: bool = False) -> list[Path]:
    """write_model for each (model, path), every model checked before the first is written: one
    invalid model leaves no file at all."""
    contents = [(checked_bytes(model, path), path) for model, path in models]
    return [write_bytes(data, path, overwrite=overwrite) for data, path in contents]


def checked_bytes(model: ir.Model | onnx.ModelProto, path: str | os.PathLike) -> bytes:
    """The serialized model, once onnx.checker with full shape inference (strict: every node's
    inference must succeed and agree with the types the model states) accepts it; else a ModelError
    naming `path` and the checker's first message. Shape hints (value_info) that contradict the
    inference, as some tools leave them, are dropped rather than refused: they are hints."""
    proto = model if isinstance(model, onnx.ModelProto) else to_proto(model)
    try:
        onnx.checker.check_model(proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ValueError) as err:
        if not proto.graph.value_info:
            raise ModelError(f"{path}: not written, the model fails onnx.checker: {_first_line(err)}") from None
        hinted = proto
        proto = onnx.ModelProto()
        proto.CopyFrom(hinted)
        del proto.graph.value_info[:]
        try:
            onnx.checker.check_model(proto, full_check=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ValueError):
            raise ModelError(f"{path}: not written, the model fails onnx.checker: {_first_line(err)}") from None
        logger.info("%s: shape hints dropped (%s)", path, _first_line(err))
    return proto.SerializeToString()


def write_arrays(arrays: dict[str, np.ndarray], path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Save arrays as an .npz (no pickles), atomically."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return write_bytes(buffer.getvalue(), path, overwrite=overwrite)


def write_bytes(data: bytes, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write `data` to a temp file beside `path`, then rename it over: readers never see half a file.

    Never over a file the running command reads (lpt.paths.check_write), nor over an existing file
    unless asked. The temp file's name is short (.lpt-XXXXXXXX.tmp), so any name the folder takes
    can be written; a failed write (read-only or full disk) is an OutputError naming the file.
    """
    if os.fspath(path) == "":
        raise OutputError("the output path is empty")
    path = Path(path)
    paths.check_write(path)
    if os.path.isdir(path):
        raise OutputError(f"{path}: is a folder; give a file path")
    if os.path.exists(path) and not overwrite:
        raise ModelError(f"{path}: already exists (pass --force / overwrite=True to replace it)")
    if not os.path.isdir(path.parent):
        raise ModelError(f"{path.parent}: no such folder")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".lpt-", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise OutputError(f"{path}: cannot write in folder {path.parent} ({err.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise OutputError(f"{path}: cannot write ({err.strerror or _first_line(err)})") from None
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
