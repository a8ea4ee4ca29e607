"""Which files of a folder are samples, in which order, and their labels.

    listing = list_folder(Path("photos"), csv=None)
    listing.kind, listing.files, listing.labels, listing.classes

A folder holds its files at the top level (no labels, unless a CSV gives them) or in one
subfolder per class (torchvision's ImageFolder convention: class `cat` holds photos/cat/...,
any depth below). Class subfolders named by integers (0, 1, ..., 10) take those integers as
labels, so folders written from a labelled array keep its labels; other names are numbered in
sorted order, as ImageFolder does. A CSV `file,label` (an optional header line; file paths
relative to the folder) labels the files of a folder without subfolders: every file needs a row
and every row a file. Files are read in sorted order; hidden files and other suffixes (a README,
the CSV itself) are ignored. Only names are listed here: nothing is decoded.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

from lpt.data.audio import SUFFIXES as AUDIO_SUFFIXES
from lpt.data.images import SUFFIXES as IMAGE_SUFFIXES
from lpt.errors import DataError, shown

ARRAY_SUFFIXES = (".npz", ".npy")
CSV_NAME = "labels.csv"  # found in the folder's top level when no CSV is given


@dataclass(frozen=True)
class Listing:
    kind: str  # "image" or "audio"
    files: tuple[Path, ...]
    labels: tuple[int, ...] | None  # one per file, or None: no labels
    classes: tuple[str, ...] | None  # class names by label, where the labels came from names
    origin: str  # where the labels came from: "class subfolders", "CSV labels.csv", "none"


def folder_kind(folder: Path) -> str | None:
    """"image" or "audio" for a folder of such files (at its top level or in class subfolders);
    None for anything else (a folder of .npz/.npy files, an empty folder), left to the array reader."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return None
    suffixes = {Path(e.name).suffix.lower() for e in entries if e.is_file() and not e.name.startswith(".")}
    if suffixes & set(ARRAY_SUFFIXES):
        return None
    for entry in entries:  # class subfolders: one file tells
        if entry.is_dir() and not entry.name.startswith("."):
            suffixes |= _first_suffixes(Path(entry.path))
    kinds = {k for k, s in (("image", IMAGE_SUFFIXES), ("audio", AUDIO_SUFFIXES)) if suffixes & set(s)}
    if len(kinds) > 1:
        raise DataError(f"{folder}: holds both images and audio files; give a folder of one kind")
    return next(iter(kinds), None)


def list_folder(folder: Path, csv_path: Path | None = None) -> Listing:
    """The samples of `folder` (a folder_kind folder) and their labels; a DataError naming the file or
    row that is missing or wrong."""
    kind = folder_kind(folder)
    if kind is None:
        raise DataError(f"{folder}: no images, audio, .npz or .npy files in this folder")
    suffixes = IMAGE_SUFFIXES if kind == "image" else AUDIO_SUFFIXES
    top = sorted(e.name for e in os.scandir(folder) if e.is_file() and _is_sample(e.name, suffixes))
    subfolders = sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
    if csv_path is None and (folder / CSV_NAME).is_file() and not subfolders:
        csv_path = folder / CSV_NAME
    if top and subfolders:
        raise DataError(f"{folder}: holds both {kind} files and subfolders ({shown(subfolders[0])}); put every file "
                        "in a class subfolder (labels by folder), or none (labels from a CSV, or none)")
    if subfolders:
        if csv_path is not None:
            raise DataError(f"{csv_path}: labels come from {folder}'s class subfolders; give a CSV only for a folder "
                            "without subfolders")
        return _by_subfolder(folder, subfolders, suffixes, kind)
    files = tuple(folder / name for name in top)
    if csv_path is None:
        return Listing(kind, files, None, None, "none")
    labels, classes = _from_csv(folder, csv_path, files)
    return Listing(kind, files, labels, classes, f"CSV {csv_path.name}")


def _by_subfolder(folder: Path, subfolders: list[str], suffixes, kind: str) -> Listing:
    numbered = all(_is_integer(name) for name in subfolders)
    if numbered:
        values = [int(name) for name in subfolders]
        if len(set(values)) != len(values):
            raise DataError(f"{folder}: class subfolders {', '.join(subfolders)} name the same class twice")
        order = sorted(range(len(subfolders)), key=lambda i: values[i])
        classes = None
    else:
        order = list(range(len(subfolders)))
        classes = tuple(subfolders)
    files, labels = [], []
    for i in order:
        label = values[i] if numbered else i
        for path in _walk(folder / subfolders[i], suffixes):
            files.append(path)
            labels.append(label)
    if not files:
        raise DataError(f"{folder}: its class subfolders hold no {kind} files")
    return Listing(kind, tuple(files), tuple(labels), classes, "class subfolders")


def _from_csv(folder: Path, csv_path: Path, files: tuple[Path, ...]) -> tuple[tuple[int, ...], tuple[str, ...] | None]:
    """One label per file, from rows `file,label`."""
    try:
        with open(csv_path, newline="", encoding="utf-8") as f:
            rows = [row for row in csv.reader(f) if row and any(cell.strip() for cell in row)]
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise DataError(f"{csv_path}: not a readable CSV ({' '.join(str(err).split())})") from None
    if rows and len(rows[0]) >= 2 and rows[0][0].strip().lower() in ("file", "filename", "path", "image", "name"):
        rows = rows[1:]
    by_name: dict[str, str] = {}
    for number, row in enumerate(rows, 1):
        if len(row) != 2:
            raise DataError(f"{csv_path}: row {number} has {len(row)} fields; expected file,label")
        name = os.path.normpath(row[0].strip())
        if name in by_name:
            raise DataError(f"{csv_path}: file {shown(name)} is labelled twice")
        by_name[name] = row[1].strip()
    names = [os.path.relpath(p, folder) for p in files]
    missing = [n for n in names if n not in by_name]
    if missing:
        raise DataError(f"{csv_path}: no label for {shown(missing[0])}" + (f" (and {len(missing) - 1} more files)"
                                                                             if len(missing) > 1 else ""))
    extra = sorted(set(by_name) - set(names))
    if extra:
        raise DataError(f"{csv_path}: labels {shown(extra[0])}, which is not a file of {folder}")
    values = [by_name[n] for n in names]
    if all(_is_integer(v) for v in values):
        return tuple(int(v) for v in values), None
    classes = tuple(sorted(set(values)))
    index = {c: i for i, c in enumerate(classes)}
    return tuple(index[v] for v in values), classes


def _walk(folder: Path, suffixes) -> list[Path]:
    """The sample files under `folder`, any depth, in sorted order."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [Path(root) / n for n in sorted(names) if _is_sample(n, suffixes)]
    return found


def _first_suffixes(folder: Path) -> set[str]:
    """The suffix of the first sample-looking file under `folder` (enough to tell images from audio)."""
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            suffix = Path(name).suffix.lower()
            if not name.startswith(".") and suffix in IMAGE_SUFFIXES + AUDIO_SUFFIXES:
                return {suffix}
    return set()


def _is_sample(name: str, suffixes) -> bool:
    return not name.startswith(".") and Path(name).suffix.lower() in suffixes


def _is_integer(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True
