"""The float32 ops that sit between int8 layers (a pool after a ReLU kept in f32, a squeeze-excite's scale,
a HardSwish, a concatenation), each as a fixed order of float32 operations.

lpt's native engine runs the same operations in the same order (lpt/native/integer_ops.cpp), so a
network keeps to one native program across them, with the bits of these functions. They also agree
with onnxruntime's kernels, except where its order of additions differs (average_pool says where).
"""

from __future__ import annotations

import numpy as np

HARD_SWISH_ALPHA, HARD_SWISH_BETA = np.float32(1 / 6), np.float32(0.5)


def hard_swish(x) -> np.ndarray:
    """ONNX HardSwish: x·min(max(x·(1/6) + 1/2, 0), 1), one float32 operation at a time (with α = f32(1/6),
    as onnxruntime, which gives the same bits)."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore"):  # −inf·0 is NaN, as onnxruntime's
        return x * np.minimum(np.maximum(x * HARD_SWISH_ALPHA + HARD_SWISH_BETA, np.float32(0)), np.float32(1))


def average_pool(x, kernel_shape, strides=None, pads=None, count_include_pad: bool = False) -> np.ndarray:
    """ONNX AveragePool (2-D, floor mode, no dilation) on float32 [N, C, H, W].

    Each window column is added down its rows, then the columns from left to right, all in float32
    (the padding as 0.0), and the total divided by the count: the window's area with
    `count_include_pad`, else the elements inside the input. onnxruntime (MLAS) adds in this order
    for the windows measured (2×2 stride 2; 3×3 stride 1 and 2, padded or not; 5×5 stride 1), but
    row by row for 3×3 of stride 3, where the last bit of some averages differs.
    """
    x = np.asarray(x, dtype=np.float32)
    (kh, kw), (sh, sw) = kernel_shape, strides or (1, 1)
    top, left, bottom, right = pads or (0, 0, 0, 0)
    h, w = x.shape[2:]
    out_h, out_w = (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    inside = np.pad(np.ones((h, w), np.float32), ((top, bottom), (left, right)))
    total, count = None, None
    for j in range(kw):
        column, column_count = None, None
        for i in range(kh):
            rows, cols = slice(i, i + sh * (out_h - 1) + 1, sh), slice(j, j + sw * (out_w - 1) + 1, sw)
            value = padded[:, :, rows, cols]
            column = value if column is None else column + value
            column_count = inside[rows, cols] if column_count is None else column_count + inside[rows, cols]
        total = column if total is None else total + column
        count = column_count if count is None else count + column_count
    divisor = np.float32(kh * kw) if count_include_pad else count
    return total / divisor
