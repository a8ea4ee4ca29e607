"""Loads the compiled engine, lpt/native/_engine.cpp, and oneDNN's libdnnl.so.3 before it; or says why not.

The oneDNN wheel (onednn-cpu-gomp) puts libdnnl.so.3 in <prefix>/lib, outside site-packages, where
the dynamic linker does not look. Loading that file first, by path, satisfies the extension's
NEEDED entry (the linker matches an already loaded soname) in an editable install as in a regular
one, whose rpath ($ORIGIN/../../../../../lib) would also find it.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
from importlib import metadata
from pathlib import Path
from types import ModuleType

DISABLE_VARIABLE = "LPT_ONEDNN"


def library_path() -> Path | None:
    """libdnnl.so.3 from the onednn-cpu-gomp wheel's records, else <sys.prefix>/lib/libdnnl.so.3, else None."""
    try:
        for file in metadata.distribution("onednn-cpu-gomp").files or ():
            if file.name == "libdnnl.so.3":
                path = Path(file.locate())
                if path.exists():
                    return path
    except metadata.PackageNotFoundError:
        pass
    path = Path(sys.prefix) / "lib" / "libdnnl.so.3"
    return path if path.exists() else None


def load() -> tuple[ModuleType | None, str | None]:
    """(the _engine module, None), or (None, the reason it is not available)."""
    if os.environ.get(DISABLE_VARIABLE, "").strip().lower() == "off":
        return None, f"{DISABLE_VARIABLE}=off"
    # oneDNN's primitives run on libgomp's threads, which otherwise spin at each barrier; on a busy
    # 2-core machine a spinning thread waits for one descheduled, and a 0.05 ms convolution took
    # 30 ms (measured on digits_cnn). lpt's own loops have their own pool (parallel.cpp). Read
    # when libgomp loads, so set before oneDNN brings it in; a user's value stays.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    library = library_path()
    if library is None:
        return None, "oneDNN's libdnnl.so.3 is not installed (pip install onednn-cpu-gomp==2023.2.0)"
    try:
        ctypes.CDLL(str(library))  # RTLD_LOCAL: no symbol of it interposes on a oneDNN inside OpenVINO
    except OSError as error:
        return None, f"oneDNN's {library} does not load: {error}"
    try:
        return importlib.import_module("lpt.native._engine"), None
    except ImportError as error:
        return None, f"lpt was installed without its native engine (no C++ compiler or no oneDNN headers): {error}"


engine, reason = load()
