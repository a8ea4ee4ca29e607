"""Data sources beyond arrays: folders of images or audio, lpt.Dataset, onnxruntime readers.

    source = open_data("photos/", model, image=ImageOptions(preset="imagenet"))
    print(source.describe())                   # what was chosen, and from where
    result = lpt.quantize(model, source)

Each is a DataSource: lpt.calibration.data.CalibrationData calls `chunks(specs, rows)` for every
pass over the data and gets dicts of arrays keyed by input name, batch on each input's batch
axis, decoded as they are consumed (a folder is never held in memory; only one chunk of `rows`
samples). `labels` is None, or the labels of the samples yielded so far in the current pass, in
order (compare reads them batch by batch); a file skipped as bad takes its label with it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from lpt import paths
from lpt.data.labels import Listing, folder_kind, list_folder
from lpt.data.preprocess import (
    METADATA_KEY,
    AudioOptions,
    AudioPreprocess,
    ImageOptions,
    ImagePreprocess,
    from_json,
    resolve_audio,
    resolve_image,
)
from lpt.errors import DataError, shown

logger = logging.getLogger(__name__)

AUDIO_LOOKAHEAD = 64 << 20  # bytes of one file's windows decoded before the first is given
CHUNK_BYTES = 16 << 20  # a chunk holds at most `rows` samples and about this much (calibration.data's batch bound)


class DataSource:
    """What CalibrationData reads through `chunks`; `labels` as the module says."""

    labels: list | None = None

    def chunks(self, specs: dict, rows: int) -> Iterator[dict[str, np.ndarray]]:
        raise NotImplementedError

    def length(self) -> int | None:
        """Samples in one pass, when known without decoding (for the progress bar)."""
        return None


class FolderSource(DataSource):
    """A folder of images or audio files (lpt.data.labels.list_folder), decoded with `preprocess`
    into samples of input `preprocess.input`. With `skip_bad`, a file that cannot be decoded is
    skipped and counted in `skipped` (path → why) instead of ending the pass with a DataError."""

    def __init__(self, folder: Path, listing: Listing, preprocess: ImagePreprocess | AudioPreprocess, *,
                 origin: str = "inferred", skip_bad: bool = False):
        self.folder, self.listing, self.preprocess = Path(folder), listing, preprocess
        self.origin = origin  # where the preprocessing came from, for describe()
        self.skip_bad = skip_bad
        self.skipped: dict[Path, str] = {}
        self.labels = [] if listing.labels is not None else None
        for file in listing.files:  # an output must never replace one of them (lpt.paths)
            paths.note_read(file, f"a file of the data {folder}")

    def __str__(self) -> str:
        return str(self.folder)

    def length(self) -> int | None:
        return len(self.listing.files) if self.preprocess.kind == "image" else None

    def describe(self) -> str:
        """One line: the files, their labels, and the preprocessing with where it came from."""
        listing = self.listing
        labels = ""
        if listing.labels is not None:
            classes = len(set(listing.labels))
            labels = f", {classes} classes from {listing.origin}"
        notes = f" (inferred: {', '.join(self.preprocess.notes)})" if self.preprocess.notes else ""
        return (f"{self.folder}: {len(listing.files)} {listing.kind} files{labels}; input {self.preprocess.input!r}, "
                f"preprocessing {self.origin}: {self.preprocess.describe()}{notes}")

    def summary(self) -> dict:
        """The JSON form for reports: the folder, its files, where labels and preprocessing came from,
        and the files skipped as bad (with --skip-bad)."""
        return {"folder": str(self.folder), "kind": self.listing.kind, "files": len(self.listing.files),
                "labels": self.listing.origin, "preprocess": json.loads(self.preprocess.to_json()),
                "preprocess_from": self.origin, "skipped_files": len(self.skipped),
                "skipped": [{"file": str(p), "why": why} for p, why in self.skipped.items()]}

    def chunks(self, specs: dict, rows: int) -> Iterator[dict[str, np.ndarray]]:
        spec = specs.get(self.preprocess.input)
        if spec is None:
            raise DataError(f"{self.folder}: its preprocessing feeds input {self.preprocess.input!r}, but the model's "
                            f"inputs are {', '.join(specs)}")
        others = [name for name in specs if name != spec.name]
        if others:
            raise DataError(f"{self.folder}: a folder feeds one input, but the model also takes {', '.join(others)}; "
                            "give the data as a .npz keyed by input name, or lpt.Dataset from Python")
        if spec.batch_axis is None:
            raise DataError(f"input {spec.name!r} is fixed (no batch axis): a folder of samples cannot feed it")
        if self.labels is not None:
            self.labels.clear()  # a new pass
        samples, labels = [], []
        yielded = size = 0
        for index, path in enumerate(self.listing.files):
            label = None if self.listing.labels is None else self.listing.labels[index]
            for sample in self._decoded(path):
                samples.append(_as_input(sample, spec))
                labels.append(label)
                size += samples[-1].nbytes
                if len(samples) == rows or size >= CHUNK_BYTES:
                    yield self._chunk(spec, samples, labels)
                    yielded += len(samples)
                    samples, labels, size = [], [], 0
        if samples:
            yielded += len(samples)
            yield self._chunk(spec, samples, labels)
        if not yielded and self.skipped:
            first, why = next(iter(self.skipped.items()))
            raise DataError(f"{self.folder}: all {len(self.skipped)} files were skipped as unreadable (first: "
                            f"{shown(first)}: {why})")

    def _chunk(self, spec, samples: list[np.ndarray], labels: list) -> dict[str, np.ndarray]:
        if self.labels is not None:
            self.labels.extend(labels)  # before the yield: the batch that holds them reads them
        return {spec.name: np.stack(samples, axis=spec.batch_axis)}

    def _decoded(self, path: Path) -> Iterator[np.ndarray]:
        """The samples of one file; a bad file is a one-line DataError naming it, or skipped."""
        from lpt.data.audio import BadAudio, audio_windows
        from lpt.data.images import BadImage, load_image

        given = 0
        try:
            if self.preprocess.kind == "image":
                yield load_image(path, self.preprocess)
                return
            # An audio file's windows are decoded up to AUDIO_LOOKAHEAD bytes before any is given, so a
            # bad file of usual length gives nothing (nothing is half-loaded); a longer one streams.
            ahead, size = [], 0
            for window in audio_windows(path, self.preprocess):
                ahead.append(window)
                size += window.nbytes
                if size > AUDIO_LOOKAHEAD:
                    given += len(ahead)
                    yield from ahead
                    ahead, size = [], 0
            yield from ahead
        except (BadImage, BadAudio) as err:
            if not self.skip_bad or given:
                after = f" after {given} windows" if given else ""
                hint = "" if given else " (--skip-bad skips such files)"
                raise DataError(f"{shown(path)}: {err}{after}{hint}") from None
            if path not in self.skipped:
                logger.warning("skipping %s: %s", path, err)
            self.skipped[path] = str(err)


def _as_input(sample: np.ndarray, spec) -> np.ndarray:
    """A float32 sample cast to the input's dtype: integer inputs (uint8 images, int16 audio) take
    the values rounded and clipped to their range."""
    if spec.dtype.kind in "iu":
        info = np.iinfo(spec.dtype)
        return np.clip(np.rint(sample), info.min, info.max).astype(spec.dtype)
    return sample.astype(spec.dtype, copy=False)


class Dataset(DataSource):
    """lpt.Dataset(iterable, transform): the model's inputs are transform(item) for each item, as
    nncf.Dataset gives them. Each transformed item is a dict keyed by input name (or one array for a
    single-input model), holding one sample or a batch. `label(item)` (optional) gives the item's
    label (or its batch's labels), so `compare` reports accuracy.

    The iterable is iterated once per pass over the data (calibration may take several). A one-shot
    iterator (a generator) is replayed from what it already gave, so only the items consumed are
    kept, never more.
    """

    def __init__(self, data_source: Iterable, transform=None, *, label=None):
        if not isinstance(data_source, Iterable):
            raise DataError(f"lpt.Dataset takes an iterable (a list, a generator, a DataLoader), not a "
                            f"{type(data_source).__name__}")
        self.items = _Replayable(data_source)
        self.transform = transform
        self.label = label
        self.labels = [] if label is not None else None

    def __iter__(self) -> Iterator:
        for item in self.items:
            yield item if self.transform is None else self.transform(item)

    def length(self) -> int | None:
        try:
            return len(self.items.source)
        except TypeError:
            return None

    def chunks(self, specs: dict, rows: int) -> Iterator[dict[str, np.ndarray]]:
        if self.labels is not None:
            self.labels.clear()
        for item in self.items:
            inputs = item if self.transform is None else self.transform(item)
            if self.labels is not None:
                self.labels.extend(np.atleast_1d(np.asarray(self.label(item))).tolist())
            yield _keyed(inputs, specs, "an item of lpt.Dataset")


class ReaderSource(DataSource):
    """An onnxruntime CalibrationDataReader (anything with get_next() returning a dict of inputs or
    None at the end), as it is. Each pass calls its rewind() where it has one; else the dicts it
    gave are replayed (only those consumed are kept)."""

    def __init__(self, reader):
        self.reader = reader
        self.items = None if callable(getattr(reader, "rewind", None)) else _Replayable(_read_all(reader))
        self.passes = 0

    def chunks(self, specs: dict, rows: int) -> Iterator[dict[str, np.ndarray]]:
        if self.items is None:
            if self.passes:
                self.reader.rewind()
            self.passes += 1
            items = _read_all(self.reader)
        else:
            items = self.items
        for item in items:
            yield _keyed(item, specs, "a dict from the reader's get_next()")


def _read_all(reader) -> Iterator:
    while True:
        item = reader.get_next()
        if item is None:
            return
        yield item


class _Replayable:
    """An iterable iterated again and again: a re-iterable (a list, a DataLoader) as it is; a one-shot
    iterator through a record of what it gave, continued from where it stopped."""

    def __init__(self, source):
        self.source = source
        self.one_shot = iter(source) is source
        self.record: list = []
        self.done = False

    def __iter__(self) -> Iterator:
        if not self.one_shot:
            yield from self.source
            return
        yield from self.record[:]  # a copy: the loop below appends
        i = len(self.record)
        while not self.done:
            if i < len(self.record):  # another pass read further meanwhile
                yield self.record[i]
                i += 1
                continue
            try:
                item = next(self.source)
            except StopIteration:
                self.done = True
                return
            self.record.append(item)
            i += 1
            yield item


def _keyed(item, specs: dict, what: str):
    """A dict as it is; one array for a single-input model keyed by that input."""
    if isinstance(item, dict) or hasattr(item, "keys"):
        return item
    if len(specs) != 1:
        raise DataError(f"{what} is one {type(item).__name__}, but the model has inputs {', '.join(specs)}: give a "
                        "dict keyed by input name")
    return {next(iter(specs)): item}


# -- opening a folder


def open_data(data, model=None, *, image: ImageOptions | None = None, audio: AudioOptions | None = None,
              labels: str | os.PathLike | None = None, skip_bad: bool = False, batch_axes=None,
              model_name: str | None = None, specs=None):
    """`data` as CalibrationData reads it: a folder of images or audio becomes a FolderSource, an
    onnxruntime reader a ReaderSource; anything else (arrays, .npz/.npy paths and folders, a
    DataSource) is returned as it is.

    A folder's preprocessing: the options given (`image` or `audio`; the model's input shape fills in
    the rest), else the preprocessing recorded in `model`'s metadata (METADATA_KEY), else all
    inferred from the input shape. `model` is an ir.Model or a path, or a list of them (the first
    recording a preprocessing is used; compare's candidate, then reference), or None (with the InputSpecs
    `specs` and no recorded preprocessing); `labels` a CSV `file,label` for a folder without class
    subfolders; `skip_bad` skips undecodable files, counting them."""
    image, audio = image or ImageOptions(), audio or AudioOptions()
    if isinstance(data, DataSource):
        return data
    if not isinstance(data, (str, os.PathLike, dict, np.ndarray)) and callable(getattr(data, "get_next", None)):
        return ReaderSource(data)
    if not isinstance(data, (str, os.PathLike)) or not Path(data).is_dir():
        if image.given or audio.given:
            raise DataError(f"{data}: preprocessing options apply to a folder of images or audio")
        return data
    folder = Path(data)
    kind = folder_kind(folder)
    if kind is None:
        if image.given or audio.given:
            raise DataError(f"{folder}: no images or audio files in this folder for the preprocessing options")
        return data
    csv_path = None
    if labels is not None:
        if not str(labels).lower().endswith(".csv"):
            raise DataError(f"--labels {labels}: for a folder of {kind} files, labels come from class subfolders or "
                            "a CSV file,label (give its path)")
        csv_path = Path(labels)
        paths.note_read(csv_path, "the labels")
    listing = list_folder(folder, csv_path)
    if isinstance(model, (list, tuple)):  # the first that records a preprocessing, else the first
        read = [_read_inputs(m, None) for m in model]
        model, model_name = next(((m, n) for m, n in read if METADATA_KEY in m.metadata_props), read[0])
    if model is not None:
        ir_model, name = _read_inputs(model, model_name)
        specs = _specs(ir_model, batch_axes)
        recorded = ir_model.metadata_props.get(METADATA_KEY)
    else:
        specs = {s.name: s for s in (specs.values() if isinstance(specs, dict) else specs or ())}
        name, recorded = model_name or "the model", None
    wrong = [n for n in _given_names(audio if kind == "image" else image) if n != "--scale"]  # --scale: both
    if wrong:
        raise DataError(f"{folder} holds {kind} files: the {'audio' if kind == 'image' else 'image'} options "
                        f"({', '.join(wrong)}) do not apply")
    options = image if kind == "image" else audio
    if not options.given and recorded is not None:
        preprocess = from_json(recorded, name)
        if preprocess.kind != kind:
            raise DataError(f"{name} was calibrated on {preprocess.kind} data ({METADATA_KEY}), but {folder} "
                            f"holds {kind} files")
        origin = f"as recorded in {name}"
    else:
        spec = _input_for(specs, folder)
        if kind == "image":
            preprocess = resolve_image(options, spec)
        else:
            preprocess = resolve_audio(options, spec)
            if preprocess.sample_rate is None:
                preprocess = _with_first_rate(preprocess, listing, folder)
        origin = "as given" if options.given else "inferred from the model"
    if kind == "audio":
        from lpt.data.audio import require_audio_libraries

        require_audio_libraries()  # before anything is decoded: one line naming the extra
    return FolderSource(folder, listing, preprocess, origin=origin, skip_bad=skip_bad)


def record_preprocess(model, data) -> None:
    """Write a folder's preprocessing into `model`'s metadata (METADATA_KEY, JSON), so the FQ model
    runs on the same preprocessing later (open_data reads it back)."""
    if isinstance(data, FolderSource):
        model.metadata_props[METADATA_KEY] = data.preprocess.to_json()


def _with_first_rate(preprocess: AudioPreprocess, listing: Listing, folder: Path) -> AudioPreprocess:
    """No --sample-rate: every file is resampled to the first file's rate, which is recorded."""
    from dataclasses import replace

    from lpt.data.audio import BadAudio, audio_rate

    for path in listing.files:
        try:
            rate = audio_rate(path)
        except BadAudio:
            continue  # decoding says why, naming it
        return replace(preprocess, sample_rate=rate,
                       notes=(*preprocess.notes, f"sample rate {rate} Hz (the first file's; --sample-rate to choose)"))
    return preprocess


def _input_for(specs: dict, folder: Path):
    batched = [s for s in specs.values() if s.batch_axis is not None]
    if len(specs) != 1 or len(batched) != 1:
        raise DataError(f"{folder}: a folder feeds one input, but the model takes {', '.join(specs)}; give the data "
                        "as a .npz keyed by input name, or lpt.Dataset from Python")
    return batched[0]


def _specs(model, batch_axes) -> dict:
    from lpt.calibration.data import input_specs, with_batch_axes

    return {s.name: s for s in with_batch_axes(input_specs(model), batch_axes)}


def _read_inputs(model, name: str | None):
    """(an ir.Model holding at least the inputs and metadata, a name for messages)."""
    if not isinstance(model, (str, os.PathLike)):
        return model, name or "the model"
    import onnx
    import onnx_ir as ir

    try:
        proto = onnx.load(os.fspath(model), load_external_data=False)
    except Exception as err:  # noqa: BLE001 - protobuf's errors; the model's own reader says more later
        raise DataError(f"{model}: cannot read the model's inputs ({' '.join(str(err).split())})") from None
    # only the inputs and metadata are needed (inputs that are initializers, as older models list them, are not)
    constants = {t.name for t in proto.graph.initializer}
    inputs = [v for v in proto.graph.input if v.name not in constants]
    for field in ("node", "initializer", "input", "output", "value_info", "sparse_initializer"):
        proto.graph.ClearField(field)
    proto.graph.input.extend(inputs)
    return ir.serde.deserialize_model(proto), name or Path(model).name


def _given_names(options) -> list[str]:
    from dataclasses import fields

    names = {"preset": "--preprocess"}
    return [names.get(f.name, f"--{f.name.replace('_', '-')}") for f in fields(options)
            if getattr(options, f.name) is not None]
