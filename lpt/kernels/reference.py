"""The slow, obvious twins of the int8 kernels, written to be read: loops over outputs, int64 and Python numbers.

Tests hold each fast kernel to its twin bit for bit. Integer twins are exact by construction (int64,
Fraction); where the contract names f32, a twin spells out the same f32 operations in the same order.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np

from lpt.kernels.output_stage import Clip, FakeQuantize, Gelu, HardSwish, LeakyRelu, Relu, Sigmoid, Silu, Sum
from lpt.numerics import dequantize_linear, fake_quantize, quantize_linear
from lpt.numerics.exp import erf, sigmoid


def conv_reference(src_q, weights_q, src_zero_point=0, weight_zero_point=0, groups=1,
                   strides=None, dilations=None, pads=None) -> np.ndarray:
    """acc[n, oc, o] = Σ_{ic, k} (x[n, ic', o·s + k·d − pad] − zp_x)·(w[oc, ic, k] − zp_w[oc]), 0 outside x: int64."""
    x = np.asarray(src_q).astype(np.int64) - int(src_zero_point)
    w = np.asarray(weights_q).astype(np.int64)
    w = w - np.asarray(weight_zero_point, dtype=np.int64).reshape((-1,) + (1,) * (w.ndim - 1))
    rank = w.ndim - 2
    kernel = w.shape[2:]
    strides = strides or [1] * rank
    dilations = dilations or [1] * rank
    pads = pads or [0] * (2 * rank)
    x = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[rank + i]) for i in range(rank)])  # zeros: q_x = zp_x
    out_shape = [(x.shape[2 + i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1 for i in range(rank)]
    out_per_group, in_per_group = w.shape[0] // groups, w.shape[1]
    acc = np.zeros([x.shape[0], w.shape[0]] + out_shape, dtype=np.int64)
    for o in itertools.product(*(range(n) for n in out_shape)):
        region = tuple(slice(o[i] * strides[i], o[i] * strides[i] + dilations[i] * (kernel[i] - 1) + 1, dilations[i])
                       for i in range(rank))
        for g in range(groups):
            patch = x[(slice(None), slice(g * in_per_group, (g + 1) * in_per_group)) + region]  # [N, IC/g, *kernel]
            filters = w[g * out_per_group:(g + 1) * out_per_group]  # [OC/g, IC/g, *kernel]
            summed_axes = list(range(1, 2 + rank))
            acc[(slice(None), slice(g * out_per_group, (g + 1) * out_per_group)) + o] = np.tensordot(
                patch, filters, axes=(summed_axes, summed_axes))
    return acc


def matmul_reference(a_q, a_zero_point, b_q, b_zero_point) -> np.ndarray:
    """acc = (a − za) @ (b − zb) in int64 (numpy's integer matmul: no BLAS, exact); za [M] means one per row."""
    za = np.asarray(a_zero_point, dtype=np.int64)
    if za.ndim == 1 and za.size > 1:
        za = za[:, None]
    a = np.asarray(a_q).astype(np.int64) - za
    b = np.asarray(b_q).astype(np.int64) - np.asarray(b_zero_point, dtype=np.int64)
    return np.matmul(a, b)


def output_stage_reference(acc, multiplier, bias=None, post_ops=(), dst_scale=None, dst_zero_point=0,
                           qmin=0, qmax=255, axis=1) -> np.ndarray:
    """Channel by channel x = f32(acc)·m[c], then x + bias[c]; each post-op's formula; QuantizeLinear, clamped."""
    acc = np.asarray(acc)
    axis = axis % acc.ndim
    multiplier = np.broadcast_to(np.asarray(multiplier, dtype=np.float32).reshape(-1), (acc.shape[axis],))
    bias = None if bias is None else np.broadcast_to(np.asarray(bias, dtype=np.float32).reshape(-1), (acc.shape[axis],))
    x = np.empty(acc.shape, dtype=np.float32)
    for c in range(acc.shape[axis]):
        channel = (slice(None),) * axis + (c,)
        x[channel] = acc[channel].astype(np.float32) * multiplier[c]
        if bias is not None:
            x[channel] = x[channel] + bias[c]
    for op in post_ops:
        if isinstance(op, Relu):
            x = np.where(x < 0, np.float32(0), x)
        elif isinstance(op, Clip):
            low, high = np.float32(op.low), np.float32(op.high)
            x = np.where(x < low, low, np.where(x > high, high, x))
        elif isinstance(op, LeakyRelu):
            x = np.where(x < 0, x * np.float32(op.alpha), x)
        elif isinstance(op, Sigmoid):
            x = sigmoid(x)
        elif isinstance(op, Silu):
            x = x * sigmoid(x)
        elif isinstance(op, HardSwish):  # numpy's maximum and minimum: a NaN stays, at a bound the bound
            h = x * np.float32(op.alpha) + np.float32(op.beta)
            h = np.where(h <= 0, np.float32(0), h)
            with np.errstate(invalid="ignore"):
                x = x * np.where(h >= 1, np.float32(1), h)
        elif isinstance(op, Gelu):
            x = (x * (erf(x / np.float32(op.divisor)) + np.float32(op.one))) * np.float32(op.half)
        elif isinstance(op, Sum):
            x = x + np.asarray(op.other, dtype=np.float32)
        elif isinstance(op, FakeQuantize):
            x = fake_quantize(x, op.input_low, op.input_high, op.output_low, op.output_high, op.levels)
        else:
            raise TypeError(f"unknown post-op {op!r}")
    return x if dst_scale is None else quantize_reference(x, dst_scale, dst_zero_point, qmin, qmax)


def quantize_reference(x, scale, zero_point, qmin, qmax, axis=1) -> np.ndarray:
    """lpt.numerics.quantize_linear (onnxruntime's QuantizeLinear) into int8 or uint8, then clamped to [qmin, qmax]."""
    dtype = np.int8 if qmin < 0 else np.uint8
    return np.clip(quantize_linear(x, scale, np.asarray(zero_point, dtype=dtype), axis=axis), qmin, qmax)


def requantize_reference(q, zero_point, scale, out_scale, out_zero_point, qmin, qmax) -> np.ndarray:
    """Element by element: m = f32(scale)/f32(out_scale), y = m·f32(q − zp), round half to even, + zp_out, clamp."""
    m = np.float32(scale) / np.float32(out_scale)
    out = [min(max(round(float(m * np.float32(int(v) - int(zero_point)))) + int(out_zero_point), qmin), qmax)
           for v in np.asarray(q).ravel()]
    return np.array(out, dtype=np.int64).reshape(np.shape(q))


def requantize_fixed_point_reference(acc, multiplier: int, shift: int, zero_point: int, qmin: int,
                                     qmax: int) -> np.ndarray:
    """Element by element in Python integers: gemmlowp's MultiplyByQuantizedMultiplier as written in C, + zp, clamp."""
    def high_mul(a: int, b: int) -> int:  # SaturatingRoundingDoublingHighMul (b ≥ 0: no −1·−1 overflow)
        product = a * b
        nudged = product + ((1 << 30) if product >= 0 else 1 - (1 << 30))
        quotient = abs(nudged) // (1 << 31)  # C's integer division truncates toward zero
        return quotient if nudged >= 0 else -quotient

    def divide_by_pot(x: int, exponent: int) -> int:  # RoundingDivideByPOT
        mask = (1 << exponent) - 1
        threshold = (mask >> 1) + (1 if x < 0 else 0)
        return (x >> exponent) + (1 if (x & mask) > threshold else 0)

    left, right = max(shift, 0), max(-shift, 0)
    out = [min(max(divide_by_pot(high_mul(int(v) << left, int(multiplier)), right) + zero_point, qmin), qmax)
           for v in np.asarray(acc).ravel()]
    return np.array(out, dtype=np.int64).reshape(np.shape(acc))


def max_pool_reference(q, kernel_shape, strides=None, pads=None, dilations=None) -> np.ndarray:
    """out[n, c, o] = max of the input elements the window covers (padding is not a value at all)."""
    return _pool(q, kernel_shape, strides, pads, dilations, lambda values, taps: max(values))


def average_pool_reference(q, zero_point, kernel_shape, strides=None, pads=None, count_include_pad=False,
                           dilations=None, multiplier=None, out_zero_point=None, qmin=None, qmax=None) -> np.ndarray:
    """out = zp + round(Fraction(Σ(q − zp), count)) (half to even), or round(f64(m)·Σ(q − zp)/count) + zp_out."""
    info = np.iinfo(np.asarray(q).dtype)
    qmin, qmax = (info.min if qmin is None else qmin), (info.max if qmax is None else qmax)

    def average(values, taps):
        total = sum(int(v) - int(zero_point) for v in values)
        count = taps if count_include_pad else len(values)
        if multiplier is None:
            value = round(Fraction(total, count)) + int(zero_point)
        else:
            zp_out = int(zero_point if out_zero_point is None else out_zero_point)
            value = round(float(np.float32(multiplier)) * total / count) + zp_out
        return min(max(value, qmin), qmax)

    return _pool(q, kernel_shape, strides, pads, dilations, average)


def _pool(q, kernel_shape, strides, pads, dilations, reduce) -> np.ndarray:
    q = np.asarray(q)
    rank = len(kernel_shape)
    strides = strides or [1] * rank
    dilations = dilations or [1] * rank
    pads = pads or [0] * (2 * rank)
    spatial = q.shape[2:]
    out_shape = [(spatial[i] + pads[i] + pads[rank + i] - dilations[i] * (kernel_shape[i] - 1) - 1) // strides[i] + 1
                 for i in range(rank)]
    taps = int(np.prod(kernel_shape))
    out = np.zeros(q.shape[:2] + tuple(out_shape), dtype=np.int64)
    for n, c in itertools.product(range(q.shape[0]), range(q.shape[1])):
        for o in itertools.product(*(range(size) for size in out_shape)):
            values = []
            for k in itertools.product(*(range(size) for size in kernel_shape)):
                position = [o[i] * strides[i] + k[i] * dilations[i] - pads[i] for i in range(rank)]
                if all(0 <= position[i] < spatial[i] for i in range(rank)):
                    values.append(q[(n, c) + tuple(position)])
            out[(n, c) + o] = reduce(values, taps)
    return out


def elementwise_reference(op: str, q1, scale1, zero_point1, q2, scale2, zero_point2, dst_scale, dst_zero_point,
                          qmin, qmax) -> np.ndarray:
    """QuantizeLinear(DequantizeLinear(q1) op DequantizeLinear(q2)) by lpt.numerics, op '+' or '*', in [qmin, qmax]."""
    x1 = dequantize_linear(q1, scale1, np.asarray(zero_point1, dtype=np.asarray(q1).dtype))
    x2 = dequantize_linear(q2, scale2, np.asarray(zero_point2, dtype=np.asarray(q2).dtype))
    return quantize_reference(x1 + x2 if op == "+" else x1 * x2, dst_scale, dst_zero_point, qmin, qmax)


def conv_transpose_reference(src_q, weights_q, src_zero_point=0, weight_zero_point=0, groups=1, strides=None,
                             dilations=None, pads=None, output_padding=None) -> np.ndarray:
    """Every input pixel, every kernel tap, every output channel: add its product where it lands (int64)."""
    src = np.asarray(src_q).astype(np.int64) - int(src_zero_point)
    weights = np.asarray(weights_q).astype(np.int64)
    batch, in_channels, height, width = src.shape
    _, out_per_group, kh, kw = weights.shape
    sh, sw = strides or (1, 1)
    dh, dw = dilations or (1, 1)
    top, left, bottom, right = pads or (0, 0, 0, 0)
    oph, opw = output_padding or (0, 0)
    zp = np.broadcast_to(np.asarray(weight_zero_point, dtype=np.int64).reshape(-1), (groups * out_per_group,))
    full_h, full_w = sh * (height - 1) + dh * (kh - 1) + 1 + oph, sw * (width - 1) + dw * (kw - 1) + 1 + opw
    out = np.zeros((batch, groups * out_per_group, full_h, full_w), dtype=np.int64)
    per_group = in_channels // groups
    for n in range(batch):
        for ci in range(in_channels):
            g = ci // per_group
            for j in range(out_per_group):
                oc = g * out_per_group + j
                for y in range(height):
                    for x in range(width):
                        for a in range(kh):
                            for b in range(kw):
                                product = src[n, ci, y, x] * (weights[ci, j, a, b] - zp[oc])
                                out[n, oc, y * sh + a * dh, x * sw + b * dw] += product
    return out[:, :, top:full_h - bottom, left:full_w - right]
