"""Every file a command reads and writes, in one place: an output never replaces an input.

    files = Files()
    model = files.model("m.onnx")                      # the model and its external data files
    data = files.data("samples/")                      # a data file, or every .npz/.npy of a folder
    out = files.output("m.int8.onnx", "-o", force=False)   # refused if it is any file read above

A file is told apart by what it is (device and inode, symlinks followed), so a symlink, a hard link
or another spelling of an input is that input. Outputs are checked before the work starts: not
empty, not a folder, in a folder that exists and can be written, a name the file system takes, not
an input, not another output, not a new .npz/.npy inside a data folder, not an existing file
without `force`.

While a `Files` is `watching()`, lpt.model_io and lpt.calibration.data note every file they open,
and lpt.model_io.write_bytes asks `check_write` before it writes: the last check, at the moment of
writing, covers what a command reads without declaring it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from lpt.errors import DataError, ModelError, OutputError

# what a data folder's files are read as (arrays; images and audio as lpt.data.images/audio read them)
DATA_SUFFIXES = (".npz", ".npy", ".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff",
                 ".wav", ".flac", ".ogg", ".mp3")


def stat_of(path: Path, error: type[Exception], missing: str) -> os.stat_result:
    """os.stat(path), or `error` in one line: `missing` when there is no such path, else why it cannot be read."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        raise error(f"{path}: {missing}") from None
    except OSError as err:
        raise error(f"{path}: cannot read ({err.strerror})") from None


@dataclass(frozen=True)
class Read:
    """A file a command reads: as given, what it is to the command ("the data"), and its identity."""

    path: Path
    what: str
    identity: tuple[int, int]


class Files:
    """The files one command reads (models, their external data, data files) and writes."""

    def __init__(self) -> None:
        self.reads: list[Read] = []
        self._identities: set[tuple[int, int]] = set()  # of self.reads: a folder of 50,000 images is noted in O(n)
        self.data_folders: list[tuple[str, Path]] = []  # (realpath, as given)
        self.outputs: list[tuple[str, str, tuple[int, int] | None]] = []  # (realpath, option, identity)

    # -- inputs

    def model(self, path: str | os.PathLike, what: str = "the model") -> Path:
        """A model path, checked as a plausible ONNX file (lpt.model_io.check_model_file); it and the
        external data files it names are inputs."""
        from lpt.model_io import model_files

        path = _given(path, what, ModelError)
        first, *external = model_files(path)
        self.note(first, what)
        for file in external:
            self.note(file, f"external data of {what} {path}")
        return path

    def data(self, path: str | os.PathLike, what: str = "the data") -> Path:
        """A data path: a regular file, or a folder whose .npz/.npy files are all inputs."""
        path = _given(path, what, DataError)
        info = stat_of(path, DataError, "no such file or folder")
        if stat.S_ISDIR(info.st_mode):
            self.data_folders.append((os.path.realpath(path), path))
            for file in sorted(path.iterdir()):
                if file.suffix in DATA_SUFFIXES and file.is_file():
                    self.note(file, f"a file of {what} {path}")
        elif stat.S_ISREG(info.st_mode):
            self.note(path, what)
        else:
            raise DataError(f"{path}: not a regular file ({kind(info.st_mode)}); give a .npz, a .npy or a folder")
        return path

    def note(self, path: str | os.PathLike, what: str) -> None:
        """Record a file the command reads (no-op for one that does not exist)."""
        identity = _identity(path)
        if identity is not None and identity not in self._identities:
            self._identities.add(identity)
            self.reads.append(Read(Path(path), what, identity))

    # -- outputs

    def output(self, path: str | os.PathLike | None, option: str, *, force: bool = False) -> Path | None:
        """An output path, checked before any work (see the module's docstring); None stays None."""
        if path is None:
            return None
        if os.fspath(path) == "":
            raise OutputError(f"{option}: the output path is empty")
        path = Path(path)
        limit = _name_max(path.parent)
        if len(os.fsencode(path.name)) > limit:
            raise OutputError(f"{option} {path}: the file name is {len(os.fsencode(path.name))} bytes, more than "
                              f"the {limit} its file system takes")
        identity = _identity(path)
        if os.path.isdir(path):
            raise OutputError(f"{option} {path}: is a folder; give a file path")
        self._refuse_inputs(path, identity, option)
        real = os.path.realpath(path)
        for other, other_option, other_identity in self.outputs:
            if other == real or (identity is not None and identity == other_identity):
                raise OutputError(f"{option} {path}: is also the output of {other_option}")
        if path.suffix in DATA_SUFFIXES:
            for folder, given in self.data_folders:
                if os.path.dirname(real) == folder:
                    raise OutputError(f"{option} {path}: would be read as data next time, from the data folder "
                                      f"{given}; write it elsewhere")
        parent = path.parent
        if not os.path.isdir(parent):
            raise OutputError(f"{option} {path}: no such folder {parent}")
        if not os.access(parent, os.W_OK):
            raise OutputError(f"{option} {path}: cannot write in folder {parent}")
        if identity is not None and not force:
            raise OutputError(f"{path}: already exists (pass --force to replace it)")
        self.outputs.append((real, option, identity))
        return path

    def check_write(self, path: str | os.PathLike) -> None:
        """Refuse to write `path` if it is a file this command reads (called as the file is written)."""
        self._refuse_inputs(Path(path), _identity(path), "output")

    def _refuse_inputs(self, path: Path, identity: tuple[int, int] | None, option: str) -> None:
        if identity is None:
            return
        for read in self.reads:
            if read.identity == identity:
                same = "" if os.fspath(read.path) == os.fspath(path) else f" ({read.path})"
                raise OutputError(f"{option} {path}: is {read.what}{same}, which this command reads; refusing to "
                                  "overwrite the input, even with --force")


_watching: ContextVar[Files | None] = ContextVar("lpt_files", default=None)


@contextmanager
def watching(files: Files | None = None) -> Iterator[Files]:
    """Make `files` (a new Files by default) the one note_read and check_write report to."""
    files = files if files is not None else Files()
    token = _watching.set(files)
    try:
        yield files
    finally:
        _watching.reset(token)


def note_read(path: str | os.PathLike, what: str) -> None:
    """Tell the watching Files, if any, that `path` is read."""
    files = _watching.get()
    if files is not None:
        files.note(path, what)


def check_write(path: str | os.PathLike) -> None:
    """Ask the watching Files, if any, whether `path` may be written (an OutputError if it is an input)."""
    files = _watching.get()
    if files is not None:
        files.check_write(path)


def kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _given(path: str | os.PathLike, what: str, error: type[Exception]) -> Path:
    if os.fspath(path) == "":
        raise error(f"{what}: the path is empty")
    return Path(path)


def _identity(path: str | os.PathLike) -> tuple[int, int] | None:
    """(device, inode) of what `path` names, symlinks followed; None if nothing is there."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    return info.st_dev, info.st_ino


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255
