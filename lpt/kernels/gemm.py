"""Integer matrix products through float32 BLAS, exact by construction.

An f32 holds every integer of magnitude ≤ 2^24 exactly. If |a| ≤ A and |b| ≤ B elementwise,
any partial sum a BLAS forms over k products — in whatever order, blocking or SIMD lanes it
chooses, with or without fused multiply-adds — is an integer of magnitude ≤ k·A·B. So with
k ≤ 2^24 // (A·B) every product, every partial sum and the result are exact, and the reduction
dimension K is cut into chunks of at most that length whose exact results are summed in int64.
For u8 × s8 (A = 255, B = 128, |a·b| ≤ 32640) the chunk is 514: 514·32640 = 16 776 960 < 2^24.
"""

from __future__ import annotations

import numpy as np

F32_EXACT_INTEGERS = 2**24  # every integer in [−2^24, 2^24] is a float32; 2^24 + 1 is not
INT32_LIMIT = 2**31 - 1


def exact_chunk(a_bound: int, b_bound: int) -> int:
    """The longest reduction k with k·a_bound·b_bound ≤ 2^24: every partial f32 sum stays exact."""
    chunk = F32_EXACT_INTEGERS // (a_bound * b_bound)
    if chunk < 1:
        raise ValueError(f"a product bound of {a_bound}·{b_bound} is beyond exact float32 arithmetic")
    return chunk


def chunk_slices(k: int, chunk: int) -> list[slice]:
    """[0, k) cut into the fewest slices of at most `chunk`, all of about the same length."""
    count = max(1, -(-k // chunk))
    step = max(1, -(-k // count))
    return [slice(start, min(start + step, k)) for start in range(0, max(k, 1), step)]


def integer_matmul(a: np.ndarray, b: np.ndarray, a_bound: int, b_bound: int) -> np.ndarray:
    """a @ b exactly as int64, for integer-valued f32 arrays with |a| ≤ a_bound, |b| ≤ b_bound (numpy's matmul)."""
    slices = chunk_slices(a.shape[-1], exact_chunk(a_bound, b_bound))
    total = np.matmul(a[..., slices[0]], b[..., slices[0], :]).astype(np.int64)
    for part in slices[1:]:
        total += np.matmul(a[..., part], b[..., part, :]).astype(np.int64)
    return total


def accumulator_dtype(bound: int) -> type[np.signedinteger]:
    """int32 when every accumulator is provably within ±bound ≤ 2^31 − 1, int64 otherwise."""
    return np.int32 if bound <= INT32_LIMIT else np.int64


def integer_range(dtype) -> tuple[int, int]:
    """(qmin, qmax) of an 8-bit integer dtype; TypeError for anything else (the kernels are 8-bit)."""
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
        raise TypeError(f"the int8 kernels take uint8 or int8 tensors, not {dtype}")
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def magnitude_bound(dtype) -> int:
    """max |q| over an 8-bit dtype: 255 for uint8, 128 for int8."""
    qmin, qmax = integer_range(dtype)
    return max(-qmin, qmax)


def deviation_bound(dtype, zero_point) -> int:
    """max |q − zp| over the dtype's range and the given zero point(s)."""
    qmin, qmax = integer_range(dtype)
    zp = np.asarray(zero_point, dtype=np.int64)
    return int(max(qmax - zp.min(), zp.max() - qmin))
