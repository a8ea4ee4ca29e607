"""Elementwise kernels on quantized tensors: add, mul, concat with per-argument scales; relu and clip on integers.

add_q and mul_q dequantize each argument, combine them in f32 and quantize:
    dst = saturate(rint((f32(q1 − z1)·s1  ∘  f32(q2 − z2)·s2) / s_dst) + z_dst),   ∘ = + or ·,
each step one f32 operation in that order — the same numbers as onnxruntime running
DequantizeLinear → Add/Mul → QuantizeLinear in f32. Arguments broadcast as ONNX's Add/Mul do.
concat_q requantizes each input to the common (scale, zero point) (lpt.kernels.quantize.requantize:
one f32 multiplier s_i/s_dst per input, exact — a copy — when the parameters already agree).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lpt.kernels.quantize import dequantize, quantize, requantize


def add_q(q1, scale1, zero_point1, q2, scale2, zero_point2, dst_scale, dst_zero_point,
          qmin: int, qmax: int) -> np.ndarray:
    """dst = saturate(rint((s1·(q1 − z1) + s2·(q2 − z2)) / s_dst) + z_dst) in f32 (DESIGN.md's argument scaling)."""
    total = dequantize(q1, scale1, zero_point1) + dequantize(q2, scale2, zero_point2)
    return quantize(total, dst_scale, dst_zero_point, qmin, qmax)


def mul_q(q1, scale1, zero_point1, q2, scale2, zero_point2, dst_scale, dst_zero_point,
          qmin: int, qmax: int) -> np.ndarray:
    """dst = saturate(rint((s1·(q1 − z1) · s2·(q2 − z2)) / s_dst) + z_dst) in f32."""
    product = dequantize(q1, scale1, zero_point1) * dequantize(q2, scale2, zero_point2)
    return quantize(product, dst_scale, dst_zero_point, qmin, qmax)


def concat_q(tensors: Sequence[np.ndarray], scales: Sequence, zero_points: Sequence, dst_scale, dst_zero_point,
             qmin: int, qmax: int, axis: int = 1) -> np.ndarray:
    """concat_i requantize(q_i, z_i, s_i → s_dst, z_dst) along `axis`: one (scale, zero point) for the result."""
    parts = [requantize(q, z, s, dst_scale, dst_zero_point, qmin, qmax)
             for q, s, z in zip(tensors, scales, zero_points, strict=True)]
    return np.concatenate(parts, axis=axis)


def relu_q(q, zero_point) -> np.ndarray:
    """max(q, zp): Relu on the integers, since x ≥ 0 ⇔ q ≥ zp for a positive scale."""
    q = np.asarray(q)
    return np.maximum(q, np.asarray(zero_point).astype(q.dtype))


def clip_q(q, low_q, high_q) -> np.ndarray:
    """min(max(q, low_q), high_q), the bounds already quantized to integers of q's type."""
    q = np.asarray(q)
    return np.clip(q, q.dtype.type(low_q), q.dtype.type(high_q))
