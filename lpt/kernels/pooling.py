"""Pooling on quantized tensors [N, C, *spatial], in integers (and the float32 global average); and its
inverse in shape, the nearest-neighbour upsampling by whole factors (a copy, of any type).

max_pool_q pads with the dtype's minimum, which can only tie with a real value, never win.
The average pools keep the input's scale and zero point: avg = zp + Σ(q − zp)/count, rounded half
to even exactly in integers (a floor division and its remainder). With count_include_pad the
padding counts as zp (a real 0) in the divisor; without it, only the input elements count.
Sums are int32: |Σ(q − zp)| ≤ 255·count < 2^31 for count < 8 421 505, int64 beyond.
Given another output scale and zero point, the rescale is one f64 expression instead:
q_out = saturate(rint(f64(m) · Σ(q − zp) / count) + zp_out), m = s_in / s_out in f32 — a multiply
then a division, each rounded in f64.
"""

from __future__ import annotations

import numpy as np

from lpt.kernels.gemm import accumulator_dtype
from lpt.kernels.quantize import integer_container
from lpt.kernels.window import Window


def max_pool_q(q, kernel_shape, strides=None, pads=None, dilations=None) -> np.ndarray:
    """out[n, c, o] = max over the window of q, padding = the dtype's minimum (ONNX MaxPool on integers).

    On floats the padding is −inf, and the maximum a fold over the taps in order in which a value replaces
    the running one where it is greater, or is NaN while the running one is not: a NaN wins (the first),
    and of equal values (−0 and +0) the first stays."""
    q = np.asarray(q)
    window = Window.of(kernel_shape, strides, dilations, pads)
    out_shape = window.output_shape(q.shape[2:])
    floats = q.dtype.kind == "f"
    padded = window.padded(q, -np.inf if floats else np.iinfo(q.dtype).min)
    taps = window.tap_slices(out_shape)
    out = padded[next(taps)].copy(order="K")  # keep the layout (channels-last stays so)
    for index in taps:
        if floats:
            value = padded[index]
            np.copyto(out, value, where=(value > out) | (np.isnan(value) & ~np.isnan(out)))
        else:
            np.maximum(out, padded[index], out=out)
    return out


def average_pool_q(q, zero_point, kernel_shape, strides=None, pads=None, count_include_pad: bool = False,
                   dilations=None, multiplier=None, out_zero_point=None, qmin=None, qmax=None) -> np.ndarray:
    """out = zp + round_half_even(Σ_window (q − zp) / count) (ONNX AveragePool in the input's quantization).

    With multiplier = s_in/s_out (and out_zero_point, qmin, qmax for the output, defaulting to the
    input's), out = saturate(rint(f64(m)·Σ(q − zp) / count) + zp_out) in f64 instead.
    """
    q = np.asarray(q)
    window = Window.of(kernel_shape, strides, dilations, pads)
    out_shape = window.output_shape(q.shape[2:])
    total_dtype = accumulator_dtype(255 * window.taps)
    padded = window.padded(q.astype(total_dtype) - total_dtype(zero_point), 0)
    total = np.zeros(q.shape[:2] + out_shape, dtype=total_dtype)
    for index in window.tap_slices(out_shape):
        total += padded[index]
    if count_include_pad:
        count = np.asarray(window.taps, dtype=total_dtype)
    else:
        inside = window.padded(np.ones((1, 1) + q.shape[2:], dtype=total_dtype), 0)
        count = sum(inside[index] for index in window.tap_slices(out_shape))
    return _average(total, count, zero_point, q.dtype, multiplier, out_zero_point, qmin, qmax)


def global_average_pool_q(q, zero_point, multiplier=None, out_zero_point=None, qmin=None, qmax=None) -> np.ndarray:
    """out[n, c, 1, …] = zp + round_half_even(Σ_spatial (q − zp) / count): ONNX GlobalAveragePool, as average_pool_q."""
    q = np.asarray(q)
    spatial = tuple(range(2, q.ndim))
    count = int(np.prod(q.shape[2:]))
    total_dtype = accumulator_dtype(255 * count)
    total = (q.astype(total_dtype) - total_dtype(zero_point)).sum(axis=spatial, keepdims=True, dtype=total_dtype)
    return _average(total, np.asarray(count, dtype=total_dtype), zero_point, q.dtype, multiplier,
                    out_zero_point, qmin, qmax)


def global_average_pool(x) -> np.ndarray:
    """ONNX GlobalAveragePool on float32 [N, C, *spatial]: each channel's values added in position order
    (row-major over the spatial axes), in float32, then divided by their count.

    The order is fixed so that lpt's native engine (lpt/native/integer_ops.cpp: mean_of_positions)
    gives the same bits; np.add.accumulate adds strictly in order, where sum() would add in pairs.
    onnxruntime adds in its own order: its result may differ in the last bits.
    """
    x = np.asarray(x, dtype=np.float32)
    flat = x.reshape(x.shape[:2] + (-1,))
    total = np.add.accumulate(flat, axis=2)[:, :, -1] if flat.shape[2] else np.zeros(x.shape[:2], np.float32)
    return (total / np.float32(flat.shape[2])).reshape(x.shape[:2] + (1,) * (x.ndim - 2))


def divide_half_even(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """round_half_even(n / d) exactly for integers, d > 0: ⌊n/d⌋, plus one past half, or at half with an odd ⌊n/d⌋."""
    quotient, remainder = np.divmod(numerator, denominator)
    twice = 2 * remainder
    return quotient + ((twice > denominator) | ((twice == denominator) & (quotient % 2 == 1)))


def _average(total, count, zero_point, dtype, multiplier, out_zero_point, qmin, qmax) -> np.ndarray:
    info = np.iinfo(dtype)
    qmin = info.min if qmin is None else qmin
    qmax = info.max if qmax is None else qmax
    if multiplier is None:
        averaged = divide_half_even(total, count) + int(zero_point)
    else:
        zp_out = int(zero_point if out_zero_point is None else out_zero_point)
        averaged = np.rint(np.float64(np.float32(multiplier)) * total / count) + zp_out
    return np.clip(averaged, qmin, qmax).astype(integer_container(qmin, qmax))


def upsample_nearest(x, factors) -> np.ndarray:
    """out[n, c, y, x] = x[n, c, y // k_h, x // k_w] for factors (k_h, k_w): each value repeated k_h × k_w
    times (ONNX Resize, nearest, by whole factors), x [N, C, H, W] of any type: only copies."""
    x = np.asarray(x)
    kh, kw = factors
    n, c, h, w = x.shape
    return np.broadcast_to(x[:, :, :, None, :, None], (n, c, h, kh, w, kw)).reshape(n, c, h * kh, w * kw)
