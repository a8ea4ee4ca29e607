"""lpt's compiled parts (everything else is in pyproject.toml), both optional.

- lpt/kernels/_elementwise.c: the one-pass output stage and joins.
- lpt/native/_engine.cpp: int8 convolution and matmul on oneDNN 3.2 and lpt's own kernels (s16.cpp for AVX2,
  stem.cpp for few products per output, depthwise.cpp for depthwise layers of large kernels and few_rows.cpp for
  matmuls of a few rows, all three on AVX-512 VNNI);
  lpt/native/__init__.py loads it.

optional=True: without a compiler (or, for the engine, without oneDNN's headers) lpt still
installs, and its NumPy/MLAS forms run instead. -ffp-contract=off keeps every multiply and add a
separate float32 operation (no FMA), which the bit-exactness with the NumPy forms depends on.
"""

import sys
from importlib import metadata
from pathlib import Path

from setuptools import Extension, setup


def onednn_prefix() -> Path | None:
    """The prefix holding include/oneapi/dnnl and lib/libdnnl.so.3, from the oneDNN wheels' records.

    The wheels put them under the environment's prefix, not in site-packages; under pip's build
    isolation the headers wheel lives in a temporary prefix of its own, which this finds too.
    """
    try:
        headers = metadata.distribution("onednn-devel-cpu-gomp")
    except metadata.PackageNotFoundError:
        return None
    for file in headers.files or ():
        if file.name == "dnnl.hpp" and file.parent.name == "dnnl":
            prefix = Path(headers.locate_file(file)).resolve().parents[3]  # <prefix>/include/oneapi/dnnl/dnnl.hpp
            if (prefix / "lib" / "libdnnl.so.3").exists():
                return prefix
    return None


flags = [] if sys.platform == "win32" else ["-O3", "-ffp-contract=off"]
extensions = [Extension("lpt.kernels._elementwise", ["lpt/kernels/_elementwise.c"],
                        extra_compile_args=flags, optional=True)]
prefix = onednn_prefix() if sys.platform == "linux" else None
if prefix is None:
    print("lpt: oneDNN headers not found (onednn-devel-cpu-gomp): building without the native engine", file=sys.stderr)
else:
    # At run time lpt/native/__init__.py loads the environment's libdnnl.so.3 before the extension; the
    # rpath finds it from a regular install (<prefix>/lib/python3.X/site-packages/lpt/native/).
    extensions.append(Extension(
        "lpt.native._engine", ["lpt/native/_engine.cpp", "lpt/native/s16.cpp", "lpt/native/integer_ops.cpp",
         "lpt/native/float_ops.cpp", "lpt/native/parallel.cpp", "lpt/native/stem.cpp", "lpt/native/few_rows.cpp",
         "lpt/native/depthwise.cpp"],
        language="c++", optional=True,
        include_dirs=[str(prefix / "include")], library_dirs=[str(prefix / "lib")], libraries=[":libdnnl.so.3"],
        extra_compile_args=flags + ["-std=c++17", "-fopenmp", "-fvisibility=hidden"],
        extra_link_args=["-fopenmp", "-Wl,-rpath,$ORIGIN/../../../../../lib"]))
setup(ext_modules=extensions)
