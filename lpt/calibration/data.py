"""Calibration samples, streamed in batches and checked against the model's inputs.

A data source is any of:

* a path: a ``.npz`` keyed by input name, a ``.npy`` (single-input models), or a folder of
  such files, read in sorted order and concatenated along the batch axis. Files are read
  without pickles and one batch of rows at a time (``.npy`` memory-mapped, ``.npz`` members
  streamed out of the zip), so a large file never sits in memory whole;
* a dict ``{input name: array}``, or one array for a single-input model;
* an iterable of such dicts (each a batch, or one sample without the batch axis);
* a callable returning any of the above.

Every problem is a one-line `DataError`: keys that are not the model's inputs (naming the
expected ones), a dtype that cannot be cast safely (float data for an integer input), a shape
that does not fit, an empty dataset, NaN/Inf (refused, or those samples skipped with a warning
when `skip_nonfinite`).
"""

from __future__ import annotations

import logging
import os
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir

from lpt.errors import DataError

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class InputSpec:
    """One model input: name, numpy dtype, shape (None for a symbolic dim; None if unknown)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...] | None

    @property
    def batch_size(self) -> int | None:
        """The batch dim when the model fixes it."""
        return self.shape[0] if self.shape else None

    def describe(self) -> str:
        dims = "?" if self.shape is None else ",".join("N" if d is None else str(d) for d in self.shape)
        return f"{self.dtype.name} [{dims}]"


def data_beside(model: str | os.PathLike) -> Path:
    """The samples that sit beside a model (models/NAME.onnx → models/NAME.npz), or a DataError saying what to pass."""
    model = Path(model)
    data = model.with_suffix(".npz")
    if model.suffix == ".onnx" and data.is_file():
        return data
    raise DataError(f"no --data given and no {data.name} beside {model}: pass --data DATA (a .npz keyed by "
                    "input name, a .npy for a single-input model, or a folder of them)")


def split_labels(data, labels: str | None, input_names: list[str]):
    """(inputs, labels or None). Labels travel in the same .npz or dict as the inputs, under
    `labels`; a key named "labels" that is not an input (a test file's, when none are asked
    for) is left out. An .npz without labels stays a path, read a batch at a time."""
    if isinstance(data, (str, os.PathLike)) and str(data).endswith(".npz") and Path(data).is_file():
        with np.load(data, allow_pickle=False) as archive:
            if labels is None and ("labels" not in archive.files or "labels" in input_names):
                return data, None
            data = {k: archive[k] for k in archive.files}
    if labels is not None and (not isinstance(data, dict) or labels not in data):
        raise DataError(f"no labels under key {labels!r} in the data")
    if not isinstance(data, dict):
        return data, None
    inputs = {k: v for k, v in data.items() if k in input_names or k not in (labels, "labels")}
    return inputs, None if labels is None else np.asarray(data[labels])


def input_specs(model: ir.Model) -> list[InputSpec]:
    """The inputs a caller must feed (initializers listed as inputs are not among them)."""
    specs = []
    for value in model.graph.inputs:
        if value.const_value is not None or value.is_initializer():
            continue
        dtype = np.dtype(value.dtype.numpy()) if value.dtype is not None else np.dtype(np.float32)
        shape = None
        if value.shape is not None:
            shape = tuple(d if isinstance(d, int) else None for d in value.shape)
        specs.append(InputSpec(value.name, dtype, shape))
    return specs


class CalibrationData:
    """Batches of checked samples from `source`, at most `subset_size` of them, streamed.

    Iterate `batches()` as often as needed (a one-shot iterator source yields once).
    `count` is how many samples the last full pass yielded, `skipped` how many it dropped.
    """

    def __init__(self, source, specs: list[InputSpec], *, subset_size: int | None = None, batch_size: int = 32,
                 skip_nonfinite: bool = False):
        if not specs:
            raise DataError("the model has no inputs to feed")
        self.specs = {s.name: s for s in specs}
        self.subset_size = subset_size
        fixed = {s.batch_size for s in specs if s.batch_size is not None}
        if len(fixed) > 1:
            raise DataError(f"the model's inputs fix different batch sizes {sorted(fixed)}: cannot batch samples")
        self.batch_size = fixed.pop() if fixed else batch_size
        self.skip_nonfinite = skip_nonfinite
        self.source = source() if callable(source) and not isinstance(source, (str, os.PathLike)) else source
        self.label = _label(self.source)
        self.count = 0
        self.skipped = 0

    @property
    def total(self) -> int | None:
        """The number of samples a pass will yield, when known in advance (before NaN skipping)."""
        n = _known_length(self.source, self.specs)
        if n is None:
            return self.subset_size
        return n if self.subset_size is None else min(n, self.subset_size)

    def batches(self) -> Iterator[dict[str, np.ndarray]]:
        """Checked batches of `batch_size` samples (the last may be shorter), cast to the input dtypes."""
        count = skipped = 0
        pending: list[dict[str, np.ndarray]] = []
        pending_rows = 0
        limit = self.subset_size
        for chunk in self._checked_chunks():
            chunk, dropped = self._finite(chunk, count + skipped)
            skipped += dropped
            rows = _rows(chunk)
            if limit is not None:
                rows = min(rows, limit - count - pending_rows)
                chunk = {k: v[:rows] for k, v in chunk.items()}
            if rows == 0:
                if limit is not None and count + pending_rows >= limit:
                    break
                continue
            pending.append(chunk)
            pending_rows += rows
            while pending_rows >= self.batch_size:
                batch, pending, pending_rows = _take(pending, self.batch_size)
                count += self.batch_size
                yield batch
            if limit is not None and count + pending_rows >= limit:
                break
        if pending_rows:
            fixed = any(s.batch_size is not None for s in self.specs.values())
            if fixed:
                logger.warning("%d samples left over: the model's fixed batch size is %d; they are not used",
                               pending_rows, self.batch_size)
            else:
                batch, _, _ = _take(pending, pending_rows)
                count += pending_rows
                yield batch
        self.count, self.skipped = count, skipped
        if skipped:
            logger.warning("skipped %d samples holding NaN or Inf", skipped)
        if count == 0:
            why = f" ({skipped} samples skipped for NaN/Inf)" if skipped else ""
            raise DataError(f"empty dataset: {self.label} holds no samples{why}")

    # -- internals

    def _checked_chunks(self) -> Iterator[dict[str, np.ndarray]]:
        for chunk in _chunks(self.source, self.specs, self.batch_size):
            yield self._check(chunk)

    def _check(self, chunk) -> dict[str, np.ndarray]:
        if not isinstance(chunk, Mapping):
            raise DataError(f"{self.label}: expected a dict of arrays keyed by input name, got {type(chunk).__name__}")
        expected = ", ".join(self.specs)
        missing = [k for k in self.specs if k not in chunk]
        extra = [str(k) for k in chunk if k not in self.specs]
        if extra:
            raise DataError(f"{self.label}: key(s) {', '.join(extra)} match no model input; the model expects "
                            f"inputs: {expected}")
        if missing:
            raise DataError(f"{self.label}: no data for input(s) {', '.join(missing)}; the model expects "
                            f"inputs: {expected}")
        out = {name: self._cast(self.specs[name], chunk[name]) for name in self.specs}
        rows = {name: len(a) for name, a in out.items()}
        if len(set(rows.values())) > 1:
            raise DataError(f"{self.label}: inputs hold different numbers of samples {rows}")
        return out

    def _cast(self, spec: InputSpec, array) -> np.ndarray:
        try:
            array = np.asarray(array)
        except (ValueError, TypeError) as err:
            raise DataError(f"input {spec.name!r}: not an array ({err})") from None
        if array.dtype.kind not in "biuf":
            raise DataError(f"input {spec.name!r}: data of dtype {array.dtype} cannot feed a {spec.dtype.name} input")
        if not np.can_cast(array.dtype, spec.dtype, casting="same_kind") or (
            array.dtype.kind == "f" and spec.dtype.kind != "f"
        ):
            raise DataError(f"input {spec.name!r}: {array.dtype} data cannot be cast safely to the model's "
                            f"{spec.dtype.name} (pass {spec.dtype.name} values)")
        if spec.shape is not None:
            if array.ndim == len(spec.shape) - 1:
                array = array[None]  # one sample without its batch axis
            if array.ndim != len(spec.shape) or any(
                d is not None and d != a for d, a in zip(spec.shape[1:], array.shape[1:])
            ):
                raise DataError(f"input {spec.name!r}: data of shape {list(array.shape)} does not fit the "
                                f"model's {spec.describe()} (batch dim first)")
        elif array.ndim == 0:
            raise DataError(f"input {spec.name!r}: a scalar is not a batch of samples")
        if spec.dtype.kind in "iu" and array.dtype != spec.dtype and array.size:
            info = np.iinfo(spec.dtype)
            if array.min() < info.min or array.max() > info.max:
                raise DataError(f"input {spec.name!r}: values outside {spec.dtype.name}'s range")
        return np.ascontiguousarray(array, dtype=spec.dtype)

    def _finite(self, chunk: dict[str, np.ndarray], first: int) -> tuple[dict[str, np.ndarray], int]:
        """Refuse (or drop, when skipping) the samples that hold NaN or Inf."""
        bad = None
        for name, array in chunk.items():
            if array.dtype.kind != "f" or not array.size:
                continue
            rows = ~np.isfinite(array.reshape(len(array), -1)).all(axis=1)
            if rows.any():
                if not self.skip_nonfinite:
                    i = int(np.flatnonzero(rows)[0])
                    raise DataError(f"input {name!r}: sample {first + i} holds NaN or Inf; clean the data or "
                                    "skip such samples (--skip-nonfinite, skip_nonfinite=True)")
                bad = rows if bad is None else bad | rows
        if bad is None:
            return chunk, 0
        return {k: v[~bad] for k, v in chunk.items()}, int(bad.sum())


def _rows(chunk: dict[str, np.ndarray]) -> int:
    return len(next(iter(chunk.values())))


def _take(pending: list[dict[str, np.ndarray]], n: int):
    """The first `n` rows of the pending chunks as one batch, and what is left."""
    parts, rest, need = [], [], n
    for chunk in pending:
        rows = _rows(chunk)
        if need >= rows:
            parts.append(chunk)
            need -= rows
        elif need > 0:
            parts.append({k: v[:need] for k, v in chunk.items()})
            rest.append({k: v[need:] for k, v in chunk.items()})
            need = 0
        else:
            rest.append(chunk)
    batch = parts[0] if len(parts) == 1 else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return batch, rest, sum(_rows(c) for c in rest)


# -- sources


def _chunks(source, specs: dict[str, InputSpec], rows: int) -> Iterator:
    if isinstance(source, (str, os.PathLike)):
        yield from _path_chunks(Path(source), specs, rows)
    elif isinstance(source, np.ndarray):
        yield _single_input(source, specs, "the array")
    elif isinstance(source, Mapping):
        yield source
    elif isinstance(source, Iterable):
        for item in source:
            yield _single_input(item, specs, "a batch") if isinstance(item, np.ndarray) else item
    else:
        raise DataError(f"cannot read calibration data from a {type(source).__name__}: pass a .npz/.npy path, a "
                        "folder, a dict of arrays, an iterable of dicts or a callable returning one")


def _single_input(array: np.ndarray, specs: dict[str, InputSpec], what: str) -> dict[str, np.ndarray]:
    if len(specs) != 1:
        raise DataError(f"{what} has one array but the model has inputs {', '.join(specs)}: key the data by input "
                        "name (a .npz or a dict)")
    return {next(iter(specs)): array}


def _path_chunks(path: Path, specs: dict[str, InputSpec], rows: int) -> Iterator[dict[str, np.ndarray]]:
    if path.is_dir():
        files = _data_files(path)
        for file in files:
            yield from _file_chunks(file, specs, rows)
    elif path.is_file():
        yield from _file_chunks(path, specs, rows)
    else:
        raise DataError(f"{path}: no such file or folder")


def _data_files(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.iterdir() if p.suffix in (".npz", ".npy") and p.is_file())
    if not files:
        raise DataError(f"{folder}: no .npz or .npy files in this folder")
    return files


def _file_chunks(path: Path, specs: dict[str, InputSpec], rows: int) -> Iterator[dict[str, np.ndarray]]:
    """The file's samples, `rows` at a time (one batch: memory does not grow with the file)."""
    if path.suffix == ".npy":
        array = _open_npy(path)
        for start in range(0, max(len(array), 1), rows):
            yield _single_input(np.asarray(array[start:start + rows]), specs, str(path))
    elif path.suffix == ".npz":
        yield from _npz_chunks(path, rows)
    else:
        raise DataError(f"{path}: not a .npz or .npy file")


def _open_npy(path: Path) -> np.ndarray:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise DataError(f"{path}: not a readable .npy file ({_first_line(err)})") from None
    if array.ndim == 0:
        raise DataError(f"{path}: holds a scalar, not a batch of samples")
    return array


def _npz_chunks(path: Path, rows: int) -> Iterator[dict[str, np.ndarray]]:
    """Every array in the .npz, `rows` rows at a time, read straight from the zip members."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as err:
        raise DataError(f"{path}: not a readable .npz file ({_first_line(err)})") from None
    with archive:
        members = [m for m in archive.namelist() if m.endswith(".npy")]
        if not members:
            raise DataError(f"empty dataset: {path} holds no arrays")
        readers = {m[:-4]: _NpyMember(archive, m, path) for m in members}
        try:
            n = max(r.rows for r in readers.values())
            for start in range(0, n, rows):
                yield {k: r.read(min(rows, r.rows - start)) if start < r.rows else r.read(0)
                       for k, r in readers.items()}
        finally:
            for r in readers.values():
                r.close()


class _NpyMember:
    """A .npy inside a zip, read a few rows at a time (no pickles: object arrays are refused)."""

    def __init__(self, archive: zipfile.ZipFile, member: str, path: Path):
        self.where = f"{path}[{member[:-4]}]"
        self.file = archive.open(member)
        try:
            shape, fortran, dtype = _read_header(self.file)
        except (ValueError, OSError, EOFError) as err:
            raise DataError(f"{self.where}: not a readable array ({_first_line(err)})") from None
        if dtype.hasobject:
            raise DataError(f"{self.where}: holds Python objects; only numeric arrays are read (no pickles)")
        if not shape:
            raise DataError(f"{self.where}: holds a scalar, not a batch of samples")
        self.shape, self.dtype = shape, dtype
        self.rows = shape[0]
        self.whole = None
        if fortran and len(shape) > 1:  # column-major: rows are not contiguous, read it whole
            self.whole = np.frombuffer(self._read_bytes(int(np.prod(shape)) * dtype.itemsize), dtype)
            self.whole = self.whole.reshape(shape[::-1]).T
        self.done = 0

    def _read_bytes(self, n: int) -> bytes:
        data = self.file.read(n)
        if len(data) != n:
            raise DataError(f"{self.where}: truncated array")
        return data

    def read(self, n: int) -> np.ndarray:
        n = max(0, min(n, self.rows - self.done))
        if self.whole is not None:
            out = self.whole[self.done:self.done + n]
        else:
            row = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
            out = np.frombuffer(self._read_bytes(n * row), self.dtype).reshape((n, *self.shape[1:]))
        self.done += n
        return out

    def close(self) -> None:
        self.file.close()


def _read_header(f) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran_order, dtype) of the .npy that `f` is positioned at the start of."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    return np.lib.format.read_array_header_2_0(f)


def _known_length(source, specs: dict[str, InputSpec]) -> int | None:
    """How many samples a source holds, if that can be known without reading it."""
    try:
        if isinstance(source, (str, os.PathLike)):
            path = Path(source)
            files = _data_files(path) if path.is_dir() else [path]
            return sum(_file_length(f) for f in files)
        if isinstance(source, np.ndarray):
            return len(source) if source.ndim else None
        if isinstance(source, Mapping):
            arrays = [np.asarray(v) for v in source.values()]
            spec = next(iter(specs.values()))
            first = np.asarray(source.get(spec.name, arrays[0] if arrays else None))
            if spec.shape is not None and first.ndim == len(spec.shape) - 1:
                return 1
            return len(first) if first.ndim else None
    except (DataError, OSError, ValueError, TypeError, zipfile.BadZipFile):
        return None
    return None


def _file_length(path: Path) -> int:
    if path.suffix == ".npy":
        return len(_open_npy(path))
    with zipfile.ZipFile(path) as archive:
        rows = []
        for member in archive.namelist():
            if member.endswith(".npy"):
                with archive.open(member) as f:
                    shape, _, _ = _read_header(f)
                    rows.append(shape[0] if shape else 0)
        return max(rows, default=0)


def _label(source) -> str:
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    return "the data"


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
