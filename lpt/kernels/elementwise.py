"""Elementwise kernels on quantized tensors: add, mul, concat with per-argument scales; relu and clip on integers.

add_q and mul_q dequantize each argument, combine them in f32 and quantize:
    dst = saturate(rint((f32(q1 − z1)·s1  ∘  f32(q2 − z2)·s2) / s_dst) + z_dst),   ∘ = + or ·,
each step one f32 operation in that order — the same numbers as onnxruntime running
DequantizeLinear → Add/Mul → QuantizeLinear in f32. Arguments broadcast as ONNX's Add/Mul do.
concat_q requantizes each input to the common (scale, zero point) (lpt.kernels.quantize.requantize:
one f32 multiplier s_i/s_dst per input, exact — a copy — when the parameters already agree).
join_q is the form the backend's joins take: the graph's own Cast → Sub → Mul dequantization
(the shift may be fractional), Add or Mul, an optional Relu, then QuantizeLinear; one pass in C
(lpt/kernels/_elementwise.c) where every parameter is one value, the same operations in numpy otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lpt.kernels.quantize import dequantize, integer_container, quantize, requantize

try:
    from lpt.kernels import _elementwise as _native
except ImportError:  # built without a C compiler: the numpy forms run instead
    _native = None


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


def dequantize_shifted(q, shift, scale) -> np.ndarray:
    """x = (f32(q) − shift)·scale in f32, as Cast → Sub → Mul; shift None skips the Sub. Keeps q's memory layout."""
    x = np.asarray(q).astype(np.float32)
    if shift is not None:
        x = np.subtract(x, shift, out=_scratch(x, shift))
    return np.multiply(x, scale, out=_scratch(x, scale))


def join_q(multiply: bool, q1, shift1, scale1, q2, shift2, scale2, relu: bool = False, dst_scale=None,
           dst_zero_point=0, qmin: int = 0, qmax: int = 255) -> np.ndarray:
    """x = dequantize_shifted(q1, …) + (or ·) dequantize_shifted(q2, …), then max(x, 0) with `relu`, then
    saturate(rint(x / s_dst) + z_dst); x itself in f32 when dst_scale is None."""
    q1, q2 = np.asarray(q1), np.asarray(q2)
    if dst_scale is not None and (out := _join_in_one_pass(multiply, q1, shift1, scale1, q2, shift2, scale2, relu,
                                                           dst_scale, dst_zero_point, qmin, qmax)) is not None:
        return out
    first, second = dequantize_shifted(q1, shift1, scale1), dequantize_shifted(q2, shift2, scale2)
    x = (np.multiply if multiply else np.add)(first, second, out=_scratch(first, second))
    if relu:
        np.maximum(x, np.float32(0), out=x)
    return x if dst_scale is None else quantize(x, dst_scale, dst_zero_point, qmin, qmax, in_place=True)


def _scratch(x: np.ndarray, other) -> np.ndarray | None:
    """x as the output of x ∘ other when the result has x's shape, else None (a new array)."""
    return x if x.shape == np.broadcast_shapes(x.shape, np.shape(other)) else None


def _join_in_one_pass(multiply, q1, shift1, scale1, q2, shift2, scale2, relu, dst_scale, dst_zero_point, qmin, qmax):
    """The C form of join_q, or None where it does not apply: per-tensor parameters, one shared layout."""
    parameters = (shift1, scale1, shift2, scale2, dst_scale, dst_zero_point)
    if (_native is None or q1.shape != q2.shape or q1.strides != q2.strides
            or any(np.size(p) != 1 for p in parameters if p is not None)
            or {q1.dtype, q2.dtype} - {np.dtype(np.uint8), np.dtype(np.int8)}):
        return None
    dtype = integer_container(qmin, qmax)
    order = sorted(range(q1.ndim), key=lambda axis: -q1.strides[axis])  # outermost first
    flat1, flat2 = q1.transpose(order), q2.transpose(order)
    if not flat1.flags.c_contiguous or dtype not in (np.uint8, np.int8):
        return None
    out = np.empty(flat1.shape, dtype)
    _native.join(flat1, flat2, out, multiply, *(_value(v) for v in (shift1, scale1, shift2, scale2)), relu,
                 _value(dst_scale), int(np.asarray(dst_zero_point).reshape(())), qmin, qmax)
    return out.transpose(np.argsort(order))


def _value(parameter) -> float:
    return 0.0 if parameter is None else float(np.asarray(parameter, dtype=np.float32).reshape(()))
