"""u8 × s8 → int32 products with a constant right-hand side, on onnxruntime's MLAS integer GEMM.

Why MLAS: on a CPU with VNNI or AMX its integer GEMM is 3–8× faster than the f32 BLAS route of
lpt.kernels.gemm (bench/resnet18.py measures it), and its results are int32 sums, not floats.
It is reached through a one-node onnxruntime session running MatMulInteger, whose constant B
onnxruntime packs once, when the session is built.

Exactness, proven rather than hoped for:
- every partial sum is an int32 sum of products a·b with |a − za| ≤ 255 and |b| ≤ 128, so with
  K ≤ MAX_REDUCTION = ⌊(2^31 − 1) / (255·128)⌋ = 65 793 nothing can overflow (callers check K);
- one MLAS kernel is not exact: on AVX2 without VNNI, u8 × s8 adds pairs of products in int16
  with saturation (vpmaddubsw; onnxruntime's quantization guide describes it). `mlas_is_exact`
  looks for it once per process: with a = 255 everywhere and b = 127 (then −128) everywhere,
  every product, and so every partial sum, has the largest magnitude its sign allows, so a
  kernel that saturates some intermediate on some input saturates on this one. A kernel's order
  of operations does not depend on the data, so an exact probe means exact results for all
  inputs; a failed probe sends callers back to the f32 BLAS route.
"""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

MAX_REDUCTION = (2**31 - 1) // (255 * 128)


class ConstantInt8Gemm:
    """y[m, n] = Σ_k (a[m, k] − za)·b[k, n] as int32, for 8-bit a [M, K] and the int8 b [K, N] given here."""

    def __init__(self, weights: np.ndarray, threads: int = 0):
        weights = np.asarray(weights)
        if weights.dtype != np.int8 or weights.ndim != 2:
            raise ValueError(f"the constant operand must be int8 [K, N], got {weights.dtype} {weights.shape}")
        if weights.shape[0] > MAX_REDUCTION:
            raise ValueError(f"K = {weights.shape[0]} could overflow int32 (at most {MAX_REDUCTION})")
        self.reduction, self.columns = weights.shape
        self._session = _session(weights, threads)

    def __call__(self, a: np.ndarray, a_zero_point: int = 0) -> np.ndarray:
        a, a_zero_point = as_unsigned(a, a_zero_point)
        return self._session.run(None, {"a": a, "a_zero_point": np.array(a_zero_point, np.uint8)})[0]


def as_unsigned(q: np.ndarray, zero_point: int) -> tuple[np.ndarray, int]:
    """An int8 q and its zero point as uint8 q + 128 and zp + 128, which leave q − zp as it was; uint8 as it is.

    MLAS multiplies u8 by s8. A caller that gathers q into a larger array (im2col) shifts it first.
    """
    if q.dtype != np.int8:
        return q, zero_point
    return q.view(np.uint8) ^ np.uint8(128), zero_point + 128


def _session(weights: np.ndarray, threads: int) -> ort.InferenceSession:
    k, n = weights.shape
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b", "a_zero_point"], ["y"])], "int8_gemm",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, k]),
         helper.make_tensor_value_info("a_zero_point", TensorProto.UINT8, [])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [None, n])],
        [helper.make_tensor("b", TensorProto.INT8, [k, n], weights.tobytes(), raw=True)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Spinning threads would steal the cores from the numpy work between two GEMMs.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@functools.cache
def mlas_is_exact() -> bool:
    """Whether this process's MLAS u8 × s8 kernel is free of intermediate saturation (see the module doc)."""
    k, n = 300, 37  # odd sizes, to reach the kernels' edge handling too
    for value in (127, -128):
        gemm = ConstantInt8Gemm(np.full((k, n), value, np.int8), threads=1)
        for rows in (1, 5, 64):
            if not np.all(gemm(np.full((rows, k), 255, np.uint8)) == 255 * value * k):
                return False
    return True
