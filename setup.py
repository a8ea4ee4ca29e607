"""The one compiled part of lpt: lpt/kernels/_elementwise.c (everything else is in pyproject.toml).

optional=True: without a C compiler lpt still installs, and its numpy forms run instead.
-ffp-contract=off keeps every multiply and add a separate float32 operation (no FMA), which the
bit-exactness with the numpy forms depends on.
"""

import sys

from setuptools import Extension, setup

flags = [] if sys.platform == "win32" else ["-O3", "-ffp-contract=off"]
setup(ext_modules=[Extension("lpt.kernels._elementwise", ["lpt/kernels/_elementwise.c"],
                             extra_compile_args=flags, optional=True)])
