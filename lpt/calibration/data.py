"""Calibration samples, streamed in batches and checked against the model's inputs.

A data source is any of:

* a path: a ``.npz`` keyed by input name, a ``.npy`` (single-input models), or a folder of
  such files, read in sorted order and concatenated along the batch axis. Files are read
  without pickles and one batch of rows at a time (``.npy`` memory-mapped, ``.npz`` members
  streamed out of the zip), so a large file never sits in memory whole;
* a dict ``{input name: array}``, or one array for a single-input model;
* an iterable of such dicts (each a batch, or one sample without the batch axis);
* a callable returning any of the above.

Each input has a batch axis, or none. Samples are stacked along the batch axis (axis 0 of an
image, axis 1 of a state declared ``[2, B, 128]``); an input without one (a scalar such as a
sample rate ``sr``: a *fixed* input) takes exactly one value of its own shape, fed unchanged with
every batch. `input_specs` guesses the axes from the model (see `default_batch_axis`); the caller
overrides them with ``batch_axes={"state": 1, "sr": None}``.

Every problem is a one-line `DataError`: keys that are not the model's inputs (naming the
expected ones), a dtype that cannot be cast safely (float data for an integer input), a shape
that does not fit, inputs holding different numbers of samples, an empty dataset, NaN/Inf
(refused, or those samples skipped with a warning when `skip_nonfinite`).
"""

from __future__ import annotations

import logging
import math
import os
import stat
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx_ir as ir

from lpt import paths
from lpt.data.sources import DataSource, FolderSource, open_data
from lpt.errors import DataError, size_text

logger = logging.getLogger(__name__)

# A batch holds at most this many bytes of inputs: its activations are many times that, on every
# backend (one 3×640×640 image is 4.9 MB, so three per batch; small samples stay at batch_size).
BATCH_INPUT_BYTES = 16 << 20
# The most lpt reads of one array at once: an array read whole (a fixed input's value, labels, samples
# not on axis 0 of an .npz member), or one sample. A header claiming more is refused before the read.
MAX_READ_BYTES = 1 << 30
# What breaks while reading a zip member: a corrupt or truncated file, an unsupported compression.
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError, RuntimeError, NotImplementedError)

_GUESS = "guess"  # InputSpec's default batch axis: default_batch_axis(shape)


@dataclass(frozen=True)
class InputSpec:
    """One model input: name, numpy dtype, shape (None for a symbolic or unknown dim; None if the rank
    is unknown) and the axis its samples are stacked along: None for a fixed input (one value, fed
    with every batch). Left out, the batch axis is guessed from the shape (default_batch_axis)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...] | None
    batch_axis: int | None = _GUESS  # type: ignore[assignment]

    def __post_init__(self):
        axis = default_batch_axis(self.shape) if self.batch_axis is _GUESS else self.batch_axis
        object.__setattr__(self, "batch_axis", self._checked_axis(axis))

    @property
    def batch_size(self) -> int | None:
        """The batch dim when the model fixes it (None for a fixed input)."""
        return None if self.shape is None or self.batch_axis is None else self.shape[self.batch_axis]

    def describe(self) -> str:
        dims = "?" if self.shape is None else ",".join("N" if d is None else str(d) for d in self.shape)
        return f"{self.dtype.name} [{dims}]"

    def _checked_axis(self, axis) -> int | None:
        if axis is None:
            return None
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise DataError(f"input {self.name!r}: batch axis {axis!r} is not an integer or None")
        if self.shape is None:
            if axis < 0:
                raise DataError(f"input {self.name!r}: batch axis {axis} counts from the end, but the model does "
                                "not declare the input's rank")
            return int(axis)
        if not -len(self.shape) <= axis < len(self.shape):
            raise DataError(f"input {self.name!r}: its {self.describe()} has no axis {axis} to hold samples "
                            "(None: a fixed input)")
        return int(axis) % len(self.shape)


def default_batch_axis(shape: tuple[int | None, ...] | None) -> int | None:
    """The batch axis a shape suggests. Rank 0: None (a fixed input). Else axis 0, unless dim 0 is
    fixed above 1 and a later dim is not: then the first such dim (state [2, N, 128] → 1). A dim 0
    fixed at 1 is a batch of one ([1, 1, 64, W] → 0, not the symbolic width)."""
    if shape is None:
        return 0
    if not shape:
        return None
    if shape[0] is not None and shape[0] > 1:
        return next((i for i, d in enumerate(shape) if d is None), 0)
    return 0


def with_batch_axes(specs: Iterable[InputSpec], batch_axes: Mapping[str, int | None] | None) -> list[InputSpec]:
    """`specs` with the caller's batch axes ({input name: axis, or None for a fixed input}) for the guessed ones."""
    specs = list(specs)
    if not batch_axes:
        return specs
    names = [s.name for s in specs]
    unknown = [str(k) for k in batch_axes if k not in names]
    if unknown:
        raise DataError(f"a batch axis is given for {', '.join(unknown)}, not an input of the model; the model "
                        f"expects inputs: {', '.join(names)}")
    return [replace(s, batch_axis=batch_axes[s.name]) if s.name in batch_axes else s for s in specs]


def parse_batch_axes(items: Iterable[str]) -> dict[str, int | None]:
    """The CLI's --batch-axis NAME=AXIS options ("state=1", "sr=none") as {name: axis or None}."""
    axes: dict[str, int | None] = {}
    for item in items:
        name, sep, axis = item.partition("=")
        name, axis = name.strip(), axis.strip().lower()
        if not sep or not name or not axis:
            raise DataError(f"--batch-axis {item!r}: expected NAME=AXIS (AXIS an integer, or none for a fixed input)")
        if name in axes:
            raise DataError(f"--batch-axis: input {name!r} is given twice")
        if axis == "none":
            axes[name] = None
            continue
        try:
            axes[name] = int(axis)
        except ValueError:
            raise DataError(f"--batch-axis {item!r}: AXIS must be an integer, or none for a fixed input") from None
    return axes


def data_beside(model: str | os.PathLike) -> Path:
    """The samples that sit beside a model (models/NAME.onnx → models/NAME.npz), or a DataError saying what to pass."""
    model = Path(model)
    data = model.with_suffix(".npz")
    if model.suffix == ".onnx" and data.is_file():
        return data
    raise DataError(f"no --data given and no {data.name} beside {model}: pass --data DATA (a .npz keyed by "
                    "input name, a .npy for a single-input model, or a folder of them)")


@dataclass(frozen=True)
class NpzMembers:
    """An .npz read without some of its keys (the labels beside the inputs), streamed like a path."""

    path: Path
    without: frozenset[str]

    def __str__(self) -> str:
        return str(self.path)


def split_labels(data, labels: str | None, input_names: list[str]):
    """(inputs, labels or None). Labels travel in the same .npz or dict as the inputs, under
    `labels`; a key named "labels" that is not an input (a test file's, when none are asked
    for) is left out. An .npz stays on disk, read a batch at a time (NpzMembers when keys are left
    out); only the labels are read whole, after their header. There must be one label per sample:
    as many as the inputs hold on axis 0. A DataSource (lpt.data: a folder, lpt.Dataset) brings its
    own labels, filled as its samples are read; `labels` may also be the labels themselves (an array)."""
    if isinstance(data, DataSource):  # class subfolders, a CSV, or lpt.Dataset's label(item)
        if data.labels is None and isinstance(labels, str) and not labels.lower().endswith(".csv"):
            raise DataError(f"{_label(data)}: holds no labels (--labels {labels!r} is a key of a .npz)")
        return data, data.labels
    if labels is not None and not isinstance(labels, str):
        return split_labels(data, None, input_names)[0], np.asarray(labels)
    if isinstance(data, (str, os.PathLike)) and str(data).endswith(".npz") and Path(data).is_file():
        path = Path(data)
        keys = _npz_keys(path)
        if labels is None and ("labels" not in keys or "labels" in input_names):
            return data, None
        if labels is not None and labels not in keys:
            raise DataError(f"{path}: no labels under key {labels!r} (its keys: {', '.join(map(repr, keys))})")
        left_out = frozenset(k for k in keys if k not in input_names and k in (labels, "labels"))
        if labels is None:
            return NpzMembers(path, left_out), None
        label_array = _npz_array(path, labels)
        _check_label_count(str(path), labels, label_array, _npz_shapes(path, left_out), input_names)
        return NpzMembers(path, left_out), label_array
    if labels is not None and (not isinstance(data, dict) or labels not in data):
        raise DataError(f"no labels under key {labels!r} in the data")
    if not isinstance(data, dict):
        return data, None
    inputs = {k: v for k, v in data.items() if k in input_names or k not in (labels, "labels")}
    if labels is None:
        return inputs, None
    label_array = np.asarray(data[labels])
    _check_label_count("the data", labels, label_array, {k: np.shape(v) for k, v in inputs.items()}, input_names)
    return inputs, label_array


def _check_label_count(where: str, key: str, labels: np.ndarray, shapes: dict, input_names: list[str]) -> None:
    """One label per sample: as many labels as some input holds on axis 0 (a state [2, N, 128] beside
    an input [N, T] holds 2 there; the input N)."""
    if labels.ndim == 0:
        raise DataError(f"{where}: the labels under key {key!r} are one value, not one label per sample")
    counts = {k: shape[0] for k, shape in shapes.items() if len(shape)}
    if counts and len(labels) not in counts.values():
        name = next((k for k in input_names if k in counts), next(iter(counts)))
        raise DataError(f"{where}: {len(labels)} labels under key {key!r}, but input {name!r} holds "
                        f"{counts[name]} samples; give one label per sample")


def _npz_keys(path: Path) -> list[str]:
    """The keys of an .npz's arrays, from its zip directory."""
    with _open_zip(path) as archive:
        return [m[:-4] for m in archive.namelist() if m.endswith(".npy")]


def _npz_shapes(path: Path, without: frozenset[str]) -> dict[str, tuple[int, ...]]:
    """{key: shape} of an .npz's arrays but `without`, from their headers (nothing else is read)."""
    archive = _open_zip(path)
    with archive:
        shapes = {}
        for member in archive.namelist():
            if member.endswith(".npy") and member[:-4] not in without:
                reader = _NpyMember(archive, member, path, None, scalar_ok=True)
                shapes[member[:-4]] = reader.shape
                reader.close()
        return shapes


def _npz_array(path: Path, key: str) -> np.ndarray:
    """One array of an .npz, read whole once its header says it fits MAX_READ_BYTES."""
    archive = _open_zip(path)
    with archive:
        reader = _NpyMember(archive, f"{key}.npy", path, None)
        try:
            reader.refuse_above(reader.nbytes, "the array")
            return reader.read(reader.rows)
        finally:
            reader.close()


def _open_zip(path: Path) -> zipfile.ZipFile:
    paths.note_read(path, "the data")
    try:
        return zipfile.ZipFile(path)
    except _ZIP_ERRORS as err:
        raise DataError(f"{path}: not a readable .npz file ({_first_line(err)})") from None


def input_specs(model: ir.Model) -> list[InputSpec]:
    """The inputs a caller must feed (initializers listed as inputs are not among them), with their
    batch axes: the dim named like another input's batch dim where there is one (state
    [2, batch, 128] beside input [batch, T] → 1), else default_batch_axis. A dim that is
    symbolic, unknown or not positive (-1, 0) is None."""
    found = []
    for value in model.graph.inputs:
        if value.const_value is not None or value.is_initializer():
            continue
        dtype = np.dtype(value.dtype.numpy()) if value.dtype is not None else np.dtype(np.float32)
        shape = names = None
        if value.shape is not None:
            shape = tuple(d if isinstance(d, int) and d > 0 else None for d in value.shape)
            names = tuple(d.value if isinstance(d, ir.SymbolicDim) else None for d in value.shape)
        found.append((InputSpec(value.name, dtype, shape), names))
    batch_names = {spec.name: names[spec.batch_axis] for spec, names in found
                   if names is not None and spec.batch_axis is not None and names[spec.batch_axis]}
    specs = []
    for spec, names in found:
        shared = {n for other, n in batch_names.items() if other != spec.name}
        axis = next((i for i, n in enumerate(names or ()) if n in shared), spec.batch_axis)
        specs.append(spec if axis == spec.batch_axis else replace(spec, batch_axis=axis))
    return specs


class CalibrationData:
    """Batches of checked samples from `source`, at most `subset_size` of them, streamed.

    Iterate `batches()` as often as needed (a one-shot iterator source yields once).
    `count` is how many samples the last full pass yielded, `skipped` how many it dropped.
    `batch_axes` ({input name: axis, or None for a fixed input}) overrides the specs' batch axes.
    """

    def __init__(self, source, specs: list[InputSpec], *, subset_size: int | None = None, batch_size: int = 32,
                 skip_nonfinite: bool = False, batch_axes: Mapping[str, int | None] | None = None):
        if not specs:
            raise DataError("the model has no inputs to feed")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise DataError(f"batch size {batch_size!r}: must be a whole number of at least 1")
        if subset_size is not None and (isinstance(subset_size, bool) or not isinstance(subset_size, (int, np.integer))
                                        or subset_size < 1):
            raise DataError(f"subset size {subset_size!r}: must be a whole number of at least 1")
        specs = with_batch_axes(specs, batch_axes)
        self.specs = {s.name: s for s in specs}
        self.subset_size = subset_size
        fixed = {s.batch_size for s in specs if s.batch_size is not None}
        if len(fixed) > 1:
            raise DataError(f"the model's inputs fix different batch sizes {sorted(fixed)}: cannot batch samples")
        self.batch_size = fixed.pop() if fixed else batch_size
        self.skip_nonfinite = skip_nonfinite
        self.source = source() if callable(source) and not isinstance(source, (str, os.PathLike)) else source
        # a folder of images or audio (preprocessing inferred from the input shapes), an onnxruntime reader
        self.source = open_data(self.source, specs=self.specs)
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
        """Checked batches of `batch_size` samples (the last may be shorter), cast to the input dtypes:
        each batched input's samples on its batch axis, each fixed input's one value as given."""
        count = skipped = 0
        pending: list[dict[str, np.ndarray]] = []
        pending_rows = 0
        limit = self.subset_size
        fixed_values: dict[str, np.ndarray] = {}  # the fixed inputs', filled by the first chunk
        for chunk in self._checked_chunks(fixed_values):
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
            if not self.fixed_batch and chunk:  # large samples (640×640 images) make smaller batches
                per_sample = sum(v.nbytes for v in chunk.values()) / max(rows, 1)
                self.batch_size = max(1, min(self.batch_size, int(BATCH_INPUT_BYTES // max(per_sample, 1))))
            while pending_rows >= self.batch_size:
                batch, pending, pending_rows = _take(pending, self.batch_size)
                count += self.batch_size
                yield self._feeds(batch, fixed_values)
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
                yield self._feeds(batch, fixed_values)
        self.count, self.skipped = count, skipped
        if skipped:
            logger.warning("skipped %d samples holding NaN or Inf", skipped)
        if count == 0:
            why = f" ({skipped} samples skipped for NaN/Inf)" if skipped else ""
            raise DataError(f"empty dataset: {self.label} holds no samples{why}")

    def samples_in(self, batch: dict[str, np.ndarray]) -> int:
        """How many samples a batch of `batches()` holds (along the first batched input's axis; 1 if none)."""
        for name, spec in self.specs.items():
            if spec.batch_axis is not None:
                return batch[name].shape[spec.batch_axis]
        return 1

    def part(self, batch: dict[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
        """Samples start:stop of a batch of `batches()` (each batched input along its axis, fixed inputs whole)."""
        return {name: batch[name] if spec.batch_axis is None else _along(batch[name], spec.batch_axis, start, stop)
                for name, spec in self.specs.items()}

    @property
    def fixed_batch(self) -> bool:
        """Whether the model fixes its batch size, so that a batch cannot be run in parts."""
        return any(s.batch_size is not None for s in self.specs.values())

    def collect(self) -> dict[str, np.ndarray]:
        """Every batch as one dict (see `concatenate`)."""
        return concatenate(self.batches(), self.specs.values())

    # -- internals: a chunk holds the batched inputs only, their samples moved to axis 0

    def _checked_chunks(self, fixed: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        """Checked chunks; the fixed inputs' values go to `fixed` (the first chunk's; later ones must agree)."""
        for number, chunk in enumerate(_chunks(self.source, self.specs, self.batch_size)):
            rows, values = self._check(chunk)
            for name, value in values.items():
                if number == 0:
                    if value.dtype.kind == "f" and not np.isfinite(value).all():
                        raise DataError(f"input {name!r}: its fixed value holds NaN or Inf")
                    fixed[name] = value
                elif value is not fixed[name] and not np.array_equal(value, fixed[name]):
                    raise DataError(f"input {name!r}: a fixed input takes one value for all the data, but chunk "
                                    f"{number + 1} of {self.label} gives another")
            yield rows

    def _feeds(self, rows: dict[str, np.ndarray], fixed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A batch as the model takes it: samples back on each input's batch axis, fixed values added."""
        return {name: fixed[name] if spec.batch_axis is None else _on_axis(rows[name], spec.batch_axis)
                for name, spec in self.specs.items()}

    def _check(self, chunk) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(batched inputs with their samples moved to axis 0, fixed inputs' values), checked and cast."""
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
        axes = {name: s.batch_axis for name, s in self.specs.items() if s.batch_axis is not None}
        _same_counts(self.label, {name: out[name].shape[axis] for name, axis in axes.items()}, axes)
        rows = {name: np.moveaxis(out[name], axis, 0) for name, axis in axes.items()}
        return rows, {name: a for name, a in out.items() if name not in axes}

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
        axis = spec.batch_axis
        if spec.shape is not None:
            if axis is not None and array.ndim == len(spec.shape) - 1:
                array = np.expand_dims(array, axis)  # one sample without its batch axis
            if axis is None and array.ndim > len(spec.shape):
                more = array.ndim - len(spec.shape)
                raise DataError(f"input {spec.name!r} is fixed (no batch axis): it takes one {spec.describe()} value, "
                                f"but the data has shape {list(array.shape)} ({more} ax{'is' if more == 1 else 'es'} "
                                f"more); give one value, or its batch axis (--batch-axis {spec.name}=AXIS, "
                                f"batch_axes={{{spec.name!r}: AXIS}})")
            if array.ndim != len(spec.shape) or any(
                d is not None and d != a for i, (d, a) in enumerate(zip(spec.shape, array.shape)) if i != axis
            ):
                where = ("batch dim first" if axis == 0 else "a fixed input: one value, no batch axis" if axis is None
                         else f"batch on axis {axis}")
                raise DataError(f"input {spec.name!r}: data of shape {list(array.shape)} does not fit the "
                                f"model's {spec.describe()} ({where})")
        elif axis is not None and array.ndim <= axis:
            if array.ndim == 0:
                raise DataError(f"input {spec.name!r}: a scalar is not a batch of samples")
            raise DataError(f"input {spec.name!r}: data of shape {list(array.shape)} has no axis {axis} to hold "
                            "its samples")
        if spec.dtype.kind in "iu" and array.dtype != spec.dtype and array.size:
            info = np.iinfo(spec.dtype)
            if array.min() < info.min or array.max() > info.max:
                raise DataError(f"input {spec.name!r}: values outside {spec.dtype.name}'s range")
        return np.asarray(array, dtype=spec.dtype, order="C")  # (ascontiguousarray makes a scalar 1-d)

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


def concatenate(batches: Iterable[dict[str, np.ndarray]], specs: Iterable[InputSpec]) -> dict[str, np.ndarray]:
    """Batches of inputs back into one dict: each batched input concatenated along its batch axis, a
    fixed input's one value kept (a name without a spec: axis 0)."""
    batches = list(batches)
    axes = {s.name: s.batch_axis for s in specs}
    return {name: batches[0][name] if axes.get(name, 0) is None
            else np.concatenate([b[name] for b in batches], axis=axes.get(name, 0))
            for name in batches[0]}


def _same_counts(label: str, counts: dict[str, int], axes: dict[str, int]) -> None:
    """Every batched input holds as many samples (`counts`, along their batch `axes`) as the first."""
    if not counts:
        return
    first, n = next(iter(counts.items()))
    for name, count in counts.items():
        if count != n:
            raise DataError(f"{label}: input {name!r} holds {count} samples (on its batch axis {axes[name]}) but "
                            f"input {first!r} holds {n} (on axis {axes[first]}); check the batch axes "
                            "(--batch-axis NAME=AXIS, batch_axes={NAME: AXIS})")


def _on_axis(array: np.ndarray, axis: int) -> np.ndarray:
    """Samples from axis 0 back to `axis`."""
    return array if axis == 0 else np.ascontiguousarray(np.moveaxis(array, 0, axis))


def _along(array: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
    """Samples start:stop of `array` along `axis`."""
    return array[(slice(None),) * axis + (slice(start, stop),)]


def _rows(chunk: dict[str, np.ndarray]) -> int:
    """Samples in a chunk; a chunk without a batched input (every input fixed) is one sample."""
    return len(next(iter(chunk.values()))) if chunk else 1


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
    if isinstance(source, DataSource):  # lpt.data: folders of images or audio, lpt.Dataset, readers
        yield from source.chunks(specs, rows)
    elif isinstance(source, NpzMembers):
        yield from _npz_chunks(source.path, specs, rows, source.without)
    elif isinstance(source, (str, os.PathLike)):
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
        return
    info = paths.stat_of(path, DataError, "no such file or folder")
    if not stat.S_ISREG(info.st_mode):  # a FIFO would block the read forever
        raise DataError(f"{path}: not a regular file ({paths.kind(info.st_mode)}); give a .npz, a .npy or a folder")
    yield from _file_chunks(path, specs, rows)


def _data_files(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.iterdir() if p.suffix in (".npz", ".npy") and p.is_file())
    if not files:
        raise DataError(f"{folder}: no .npz or .npy files, images or audio files in this folder")
    return files


def _single_spec(specs: dict[str, InputSpec]) -> InputSpec | None:
    return next(iter(specs.values())) if len(specs) == 1 else None


def _stream_axis(shape: tuple[int, ...], spec: InputSpec | None) -> int | None:
    """The axis an array of `shape` feeding `spec` holds its samples on (0 for a key that is no input);
    None when the array is one value: a fixed input's, one sample without its batch axis, or an
    array lacking that axis (which _cast refuses)."""
    axis = 0 if spec is None else spec.batch_axis
    if axis is None or axis >= len(shape):
        return None
    if spec is not None and spec.shape is not None and len(shape) == len(spec.shape) - 1:
        return None
    return axis


def _samples(shape: tuple[int, ...], spec: InputSpec | None) -> int | None:
    """How many samples an array of `shape` holds for `spec`; None for a fixed input's value."""
    if spec is not None and spec.batch_axis is None:
        return None
    axis = _stream_axis(shape, spec)
    return 1 if axis is None else shape[axis]


def _file_chunks(path: Path, specs: dict[str, InputSpec], rows: int) -> Iterator[dict[str, np.ndarray]]:
    """The file's samples, `rows` at a time along each input's batch axis (fewer where samples are
    large: one batch's memory does not grow with the file); a fixed input's value whole, with every chunk."""
    if path.suffix == ".npy":
        paths.note_read(path, "the data")
        spec = _single_spec(specs)
        array = _open_npy(path, batched=spec is None or spec.batch_axis is not None)
        axis = _stream_axis(array.shape, spec)
        if axis is None:
            _refuse_above(str(path), array.nbytes, "the array")
            yield _single_input(np.asarray(array), specs, str(path))
            return
        step = _rows_per_read(str(path), array.nbytes // max(array.shape[axis], 1), rows)
        for start in range(0, max(array.shape[axis], 1), step):  # a memory map: only this slice is read
            yield _single_input(np.asarray(_along(array, axis, start, start + step)), specs, str(path))
    elif path.suffix == ".npz":
        yield from _npz_chunks(path, specs, rows)
    else:
        raise DataError(f"{path}: not a .npz or .npy file")


def _refuse_above(where: str, size: int, what: str) -> None:
    if size > MAX_READ_BYTES:
        raise DataError(f"{where}: {what} takes {size_text(size)}, more than the {size_text(MAX_READ_BYTES)} lpt "
                        "reads at once")


def _rows_per_read(where: str, sample_bytes: int, rows: int) -> int:
    """At most `rows` samples, and no more than BATCH_INPUT_BYTES of them (at least one, if it fits MAX_READ_BYTES)."""
    _refuse_above(where, sample_bytes, "one sample")
    return max(1, min(rows, BATCH_INPUT_BYTES // max(sample_bytes, 1)))


def _open_npy(path: Path, batched: bool = True) -> np.ndarray:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as err:  # noqa: BLE001 - a garbled header raises what numpy's tokenizer meets
        raise DataError(f"{path}: not a readable .npy file ({_first_line(err)})") from None
    if array.ndim == 0 and batched:
        raise DataError(f"{path}: holds a scalar, not a batch of samples")
    return array


def _npz_chunks(path: Path, specs: dict[str, InputSpec], rows: int,
                without: frozenset[str] = frozenset()) -> Iterator[dict[str, np.ndarray]]:
    """Every array in the .npz (but the keys `without`), `rows` samples at a time (fewer where samples
    are large), read straight from the zip members once their headers are checked."""
    archive = _open_zip(path)
    with archive:
        members = [m for m in archive.namelist() if m.endswith(".npy") and m[:-4] not in without]
        if not members:
            raise DataError(f"empty dataset: {path} holds no arrays")
        readers: dict[str, _NpyMember] = {}
        try:
            for m in members:
                readers[m[:-4]] = _NpyMember(archive, m, path, specs.get(m[:-4]))
            batched = {k: r for k, r in readers.items() if r.rows is not None}
            inputs = {k: r for k, r in batched.items() if k in specs}
            _same_counts(str(path), {k: r.rows for k, r in inputs.items()}, {k: specs[k].batch_axis for k in inputs})
            n = max((r.rows for r in batched.values()), default=1)
            step = _rows_per_read(str(path), sum(r.sample_bytes for r in batched.values()), rows)
            for _ in range(0, n, step):
                yield {k: r.read(step) for k, r in readers.items()}
        finally:
            for r in readers.values():
                r.close()


class _NpyMember:
    """A .npy inside a zip, read a few samples at a time (no pickles: object arrays are refused).

    Its header is checked against the zip's record of the member's size before anything else is
    read, so a header cannot claim more data than the member holds. Only samples on axis 0 of a
    C-order array are streamed. A fixed input's value (or one sample without its batch axis) is read
    whole and given with every read; so are column-major arrays and arrays whose samples lie on
    another axis (a state [2, N, 128]): their samples are not contiguous in the file, and the zip
    stream cannot seek back for each batch. What is read whole must fit MAX_READ_BYTES.
    """

    def __init__(self, archive: zipfile.ZipFile, member: str, path: Path, spec: InputSpec | None,
                 scalar_ok: bool = False):
        self.where = f"{path}[{member[:-4]}]"
        self.file = None
        try:
            self.file = archive.open(member)
            shape, fortran, dtype = _read_header(self.file)
            held = archive.getinfo(member).file_size - self.file.tell()
        except KeyError:
            raise DataError(f"{path}: no array under key {member[:-4]!r}") from None
        except _ZIP_ERRORS as err:
            self.close()
            raise DataError(f"{self.where}: not a readable array ({_first_line(err)})") from None
        if dtype.hasobject:
            self.close()
            raise DataError(f"{self.where}: holds Python objects; only numeric arrays are read (no pickles)")
        if not shape and not scalar_ok and (spec is None or spec.batch_axis is not None):
            self.close()
            raise DataError(f"{self.where}: holds a scalar, not a batch of samples")
        self.shape, self.dtype = shape, dtype
        self.nbytes = math.prod(shape) * dtype.itemsize
        if self.nbytes != held:
            self.close()
            raise DataError(f"{self.where}: its header declares {dtype} {list(shape)} ({size_text(self.nbytes)}), "
                            f"but the member holds {size_text(max(held, 0))}")
        self.axis = _stream_axis(shape, spec)
        self.rows = _samples(shape, spec)  # None: a fixed input's value
        self.sample_bytes = 0 if self.axis is None else self.nbytes // max(shape[self.axis], 1)
        self.whole = None
        self.done = 0
        if scalar_ok:
            return  # only the header was wanted
        if self.axis != 0 or (fortran and len(shape) > 1):
            self.refuse_above(self.nbytes, "the array, read whole (its samples are not on axis 0, or it is one value)")
            self.whole = np.frombuffer(self._read_bytes(self.nbytes), dtype)
            self.whole = self.whole.reshape(shape[::-1]).T if fortran else self.whole.reshape(shape)

    def refuse_above(self, size: int, what: str) -> None:
        if size > MAX_READ_BYTES:
            self.close()
            _refuse_above(self.where, size, what)

    def _read_bytes(self, n: int) -> bytes:
        try:
            data = self.file.read(n)
        except _ZIP_ERRORS as err:
            raise DataError(f"{self.where}: corrupt data ({_first_line(err)})") from None
        if len(data) != n:
            raise DataError(f"{self.where}: truncated array")
        return data

    def read(self, n: int) -> np.ndarray:
        """The next `n` samples (fewer at the end), or the whole value when it is one."""
        if self.axis is None:
            return self.whole
        n = max(0, min(n, self.rows - self.done))
        if self.whole is not None:
            out = _along(self.whole, self.axis, self.done, self.done + n)
        else:
            out = np.frombuffer(self._read_bytes(n * self.sample_bytes), self.dtype).reshape((n, *self.shape[1:]))
        self.done += n
        return out

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _read_header(f) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran_order, dtype) of the .npy that `f` is positioned at the start of. A garbled
    header is a ValueError (numpy's parser raises what its tokenizer meets: TokenError, SyntaxError, ...)."""
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(f)
        return np.lib.format.read_array_header_2_0(f)
    except _ZIP_ERRORS:
        raise
    except Exception as err:  # noqa: BLE001 - see the docstring
        raise ValueError(f"a garbled .npy header ({_first_line(err)})") from None


def _known_length(source, specs: dict[str, InputSpec]) -> int | None:
    """How many samples a source holds, if that can be known without reading it."""
    try:
        if isinstance(source, DataSource):
            return source.length()
        if isinstance(source, NpzMembers):
            return _file_length(source.path, specs, source.without)
        if isinstance(source, (str, os.PathLike)):
            path = Path(source)
            files = _data_files(path) if path.is_dir() else [path]
            return sum(_file_length(f, specs) for f in files)
        batched = [s for s in specs.values() if s.batch_axis is not None]
        if not batched:
            return None
        if isinstance(source, np.ndarray):
            return _samples(source.shape, batched[0]) if source.ndim and len(specs) == 1 else None
        if isinstance(source, Mapping):
            first = np.asarray(source[batched[0].name])
            return _samples(first.shape, batched[0]) if first.ndim else None
    except (KeyError, DataError, TypeError, *_ZIP_ERRORS):
        return None
    return None


def _file_length(path: Path, specs: dict[str, InputSpec], without: frozenset[str] = frozenset()) -> int:
    if path.suffix == ".npy":
        spec = _single_spec(specs)
        samples = _samples(_open_npy(path, batched=False).shape, spec)
        return 1 if samples is None else samples
    with zipfile.ZipFile(path) as archive:
        rows, arrays = [], 0
        for member in archive.namelist():
            if member.endswith(".npy") and member[:-4] not in without:
                arrays += 1
                with archive.open(member) as f:
                    shape, _, _ = _read_header(f)
                    samples = _samples(shape, specs.get(member[:-4]))
                    if samples is not None:
                        rows.append(samples)
        return max(rows, default=1 if arrays else 0)


def _label(source) -> str:
    if isinstance(source, (str, os.PathLike, NpzMembers, FolderSource)):
        return str(source)
    return "the data"


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
