#!/bin/sh
# Build bench/onednn/onednn_conv*.so against the oneDNN 3.2 PyPI wheels
# (onednn-cpu-gomp + onednn-devel-cpu-gomp == 2023.2.0) installed in the active venv.
set -e
cd "$(dirname "$0")"
PY=${PYTHON:-python}
PREFIX=$($PY -c 'import sys; print(sys.prefix)')          # wheels put include/ and lib/ here
PYINC=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
EXT=$($PY -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
test -f "$PREFIX/include/oneapi/dnnl/dnnl.hpp" || { echo "no oneDNN headers in $PREFIX/include (pip install onednn-devel-cpu-gomp==2023.2.0)"; exit 1; }
test -f "$PREFIX/lib/libdnnl.so.3" || { echo "no libdnnl.so.3 in $PREFIX/lib (pip install onednn-cpu-gomp==2023.2.0)"; exit 1; }
g++ -O2 -std=c++17 -shared -fPIC -I"$PYINC" -I"$PREFIX/include" conv.cpp \
    -L"$PREFIX/lib" -ldnnl -Wl,-rpath,"$PREFIX/lib" -o "onednn_conv$EXT"
echo "built $(pwd)/onednn_conv$EXT"
