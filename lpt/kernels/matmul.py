"""Integer MatMul and Gemm: acc = Σ_k (a − za)·(b − zb), exact, with numpy/ONNX MatMul broadcasting.

Two forms, both feeding raw integers to f32 BLAS (lpt.kernels.gemm):
- a constant right-hand side is packed once as B' = b − zb with its column sums Σ_k B' and
  acc = a @ B' − za·Σ_k B' (the OpenVINO RFC's compensation; padding does not arise); a 2-D B'
  within int8 with one za runs on MLAS's integer GEMM instead (lpt.kernels.int8_gemm), where exact;
- two activations (attention's Q·Kᵀ, ONNX MatMulInteger) use the four terms
  acc = a @ b − za·Σ_k b − zb·Σ_k a + K·za·zb.
Zero points: za is one value, one per row of a ([M], as ONNX MatMulInteger allows) or an array
broadcastable to [..., M, 1]; zb one value, one per column ([N]) or broadcastable to [..., 1, N].
Gemm's transA/transB transpose the last two axes; its alpha and beta belong to the f32 output stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lpt.kernels.gemm import accumulator_dtype, deviation_bound, integer_matmul, magnitude_bound
from lpt.kernels.int8_gemm import MAX_REDUCTION, ConstantInt8Gemm, gemm_route


@dataclass(frozen=True, eq=False)  # eq=False: ndarray fields have no boolean ==
class PackedMatMul:
    """A constant right-hand side packed once: B' = q_b − zp_b as f32 [..., K, N], offset = −zp_a·Σ_k B'."""

    weights: np.ndarray  # f32, integer-valued
    offset: np.ndarray  # int64, broadcastable to [..., M, N]
    a_zero_point: np.ndarray  # int64, broadcastable to [..., M, 1]
    weight_bound: int  # max |B'|, 1 for all-zero weights
    int8_gemm: ConstantInt8Gemm | None  # B' as int8 [K, N] on MLAS, where exact


def pack_matmul_weights(b_q, b_zero_point=0, a_zero_point=0, trans_b: bool = False, threads: int = 0,
                        int8_gemm: bool = True) -> PackedMatMul:
    """B' = q_b − zp_b (q_b transposed first if trans_b), offset = −zp_a·Σ_k B', for a constant b [..., K, N].

    With `int8_gemm` (and where it is exact) the product runs on MLAS with `threads` threads (0: one per core).
    """
    b = np.asarray(b_q)
    if b.ndim < 2:
        raise ValueError(f"the right-hand side must have rank ≥ 2, got shape {b.shape}")
    if trans_b:
        b = np.swapaxes(b, -1, -2)
    centred = b.astype(np.int64) - _column_zero_point(b_zero_point)
    a_zero_point = _row_zero_point(a_zero_point)
    route = gemm_route() if int8_gemm else None
    mlas = (route is not None and centred.ndim == 2 and a_zero_point.ndim == 0 and centred.shape[0] <= MAX_REDUCTION
            and -128 <= centred.min(initial=0) and centred.max(initial=0) <= 127)
    return PackedMatMul(
        weights=centred.astype(np.float32),
        offset=-a_zero_point * centred.sum(axis=-2, keepdims=True),
        a_zero_point=a_zero_point,
        weight_bound=max(1, int(np.abs(centred).max(initial=0))),
        int8_gemm=ConstantInt8Gemm(centred.astype(np.int8), threads, route) if mlas else None,
    )


def matmul_accumulate_packed(a_q, packed: PackedMatMul, trans_a: bool = False) -> np.ndarray:
    """acc = Σ_k (q_a − zp_a)·B'[k]: int32 [..., M, N], int64 when K·max|a − za|·max|B'| may pass 2^31 − 1."""
    a = _operand(a_q, trans_a)
    if packed.int8_gemm is not None:
        rows = np.ascontiguousarray(a).reshape(-1, a.shape[-1])
        return packed.int8_gemm(rows, int(packed.a_zero_point)).reshape(a.shape[:-1] + (packed.int8_gemm.columns,))
    raw = integer_matmul(a.astype(np.float32), packed.weights, magnitude_bound(a.dtype), packed.weight_bound)
    bound = a.shape[-1] * deviation_bound(a.dtype, packed.a_zero_point) * packed.weight_bound
    return (raw + packed.offset).astype(accumulator_dtype(bound))


def matmul_accumulate(a_q, a_zero_point, b_q, b_zero_point, trans_a: bool = False,
                      trans_b: bool = False) -> np.ndarray:
    """acc = Σ_k (q_a − za)·(q_b − zb) = a@b − za·Σ_k b − zb·Σ_k a + K·za·zb: int32 [..., M, N] (int64 past int32)."""
    a, b = _operand(a_q, trans_a), _operand(b_q, trans_b)
    za, zb = _row_zero_point(a_zero_point), _column_zero_point(b_zero_point)
    k = a.shape[-1]
    raw = integer_matmul(a.astype(np.float32), b.astype(np.float32), magnitude_bound(a.dtype), magnitude_bound(b.dtype))
    row_sums = a.sum(axis=-1, keepdims=True, dtype=np.int64)
    column_sums = b.sum(axis=-2, keepdims=True, dtype=np.int64)
    acc = raw - za * column_sums - row_sums * zb + k * za * zb
    return acc.astype(accumulator_dtype(k * deviation_bound(a.dtype, za) * deviation_bound(b.dtype, zb)))


def _operand(q, transpose: bool) -> np.ndarray:
    q = np.asarray(q)
    if q.ndim < 2:
        raise ValueError(f"MatMul operands must have rank ≥ 2, got shape {q.shape}")
    return np.swapaxes(q, -1, -2) if transpose else q


def _row_zero_point(zero_point) -> np.ndarray:
    """za as int64 broadcastable to [..., M, 1]: one value, [M] → [M, 1], or already [..., M, 1]."""
    zero_point = np.asarray(zero_point, dtype=np.int64)
    if zero_point.size == 1:
        return zero_point.reshape(())
    return zero_point[:, None] if zero_point.ndim == 1 else zero_point


def _column_zero_point(zero_point) -> np.ndarray:
    """zb as int64 broadcastable to [..., K, N]: one value, [N], or [..., 1, N]."""
    zero_point = np.asarray(zero_point, dtype=np.int64)
    return zero_point.reshape(()) if zero_point.size == 1 else zero_point
