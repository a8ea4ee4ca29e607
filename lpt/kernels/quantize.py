"""Quantize, dequantize and requantize: f32 ↔ integers, and integers → integers (in f32 or integer-only).

Every f32 formula here fixes its operation order, since the last bit decides ties:
- quantize:    q = saturate(rint(x / s) + zp), one f32 division (ONNX QuantizeLinear as onnxruntime computes it);
- dequantize:  x = f32(q − zp) · s, the difference in int32, one f32 multiply (ONNX DequantizeLinear);
- requantize:  m = s_in / s_out once in f32, then q_out = saturate(rint(m · f32(q_in − z_in)) + z_out);
- quantize_fq: q = saturate(rint(clip(x, lo, hi) · isc + ish) + qmin), a multiply then an add (no fused
  multiply-add), with isc = (levels − 1)/(ih − il) and ish = −il·isc precomputed in f32 (OpenVINO's affine form).
rint is round half to even. "saturate" clamps to [qmin, qmax]; it is applied to the f32 value before
rounding (clamped to [qmin − zp, qmax − zp]), which gives the same integers and sends ±inf to the
ends and NaN to qmin, as onnxruntime's MLAS kernels do.
"""

from __future__ import annotations

import numpy as np

from lpt.errors import QuantizationError

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def integer_container(qmin: int, qmax: int) -> type[np.integer]:
    """The narrowest numpy integer type holding [qmin, qmax]."""
    for dtype in (np.uint8, np.int8, np.uint16, np.int16, np.int32):
        info = np.iinfo(dtype)
        if info.min <= qmin and qmax <= info.max:
            return dtype
    raise QuantizationError(f"no integer type holds [{qmin}, {qmax}]")


def broadcast_along(value, ndim: int, axis: int | None) -> np.ndarray:
    """`value` shaped to broadcast against a rank-`ndim` tensor: one value as a scalar, else a 1-D array along `axis`.

    With axis None, an array is taken as already broadcastable (numpy rules).
    """
    value = np.asarray(value)
    if value.size == 1:
        return value.reshape(())
    if axis is None:
        return value
    if value.ndim != 1:
        raise QuantizationError(f"a per-axis parameter must be 1-D, got shape {value.shape}")
    shape = [1] * ndim
    shape[axis] = -1
    return value.reshape(shape)


def round_to_range(y: np.ndarray, zero_point, qmin: int, qmax: int, in_place: bool = False) -> np.ndarray:
    """saturate(rint(y) + zero_point) for f32 y, as the narrowest integer type holding [qmin, qmax].

    The clamped, rounded value and the zero point are integers below 2^17, so adding them in f32
    is exact: the same integers as an int32 addition, one pass fewer (none for a zero point of 0).
    With `in_place`, y (an f32 array the caller owns) is the scratch space.
    """
    zp = np.asarray(zero_point, dtype=np.int32)
    low, high = (qmin - zp).astype(np.float32), (qmax - zp).astype(np.float32)
    y = np.asarray(y)
    scratch = in_place and y.dtype == np.float32 and y.shape == np.broadcast_shapes(y.shape, low.shape)
    rounded = np.asarray(np.fmax(y, low, out=y if scratch else None))  # an array even for a scalar y
    np.fmin(rounded, high, out=rounded)
    np.rint(rounded, out=rounded)
    if np.any(zp):
        np.add(rounded, zp.astype(np.float32), out=rounded)
    return rounded.astype(integer_container(qmin, qmax))


def quantize(x, scale, zero_point, qmin: int, qmax: int, axis: int | None = None,
             in_place: bool = False) -> np.ndarray:
    """q = saturate(rint(x / scale) + zero_point) in f32: ONNX QuantizeLinear with an explicit [qmin, qmax].

    The same integers as lpt.numerics.quantize_linear, clamped to [qmin, qmax] (a narrow range such
    as [−127, 127] for levels 255). scale and zero_point are per tensor or 1-D along `axis`.
    With `in_place`, an f32 x the caller owns is overwritten instead of copied.
    """
    x = np.asarray(x, dtype=np.float32)
    scale = broadcast_along(np.asarray(scale, dtype=np.float32), x.ndim, axis)
    zero_point = broadcast_along(np.asarray(zero_point, dtype=np.int32), x.ndim, axis)
    scratch = in_place and x.shape == np.broadcast_shapes(x.shape, scale.shape)
    return round_to_range(np.divide(x, scale, out=x if scratch else None), zero_point, qmin, qmax, in_place=True)


def dequantize(q, scale, zero_point=0, axis: int | None = None) -> np.ndarray:
    """x = f32(q − zero_point) · scale: the difference in int32, then one f32 multiply."""
    q = np.asarray(q)
    scale = broadcast_along(np.asarray(scale, dtype=np.float32), q.ndim, axis)
    zero_point = broadcast_along(np.asarray(zero_point, dtype=np.int32), q.ndim, axis)
    return (q.astype(np.int32) - zero_point).astype(np.float32) * scale


def requantize(q, zero_point, scale, out_scale, out_zero_point, qmin: int, qmax: int,
               axis: int | None = None) -> np.ndarray:
    """q_out = saturate(rint(m · f32(q − zero_point)) + out_zero_point), m = scale / out_scale computed once in f32.

    One rounding of m and one of the product: not the same as dequantize followed by quantize
    (a multiply then a division), which can land on the other side of a tie.
    """
    q = np.asarray(q)
    multiplier = broadcast_along(np.asarray(scale, dtype=np.float32) / np.asarray(out_scale, dtype=np.float32),
                                 q.ndim, axis)
    zero_point = broadcast_along(np.asarray(zero_point, dtype=np.int32), q.ndim, axis)
    out_zero_point = broadcast_along(np.asarray(out_zero_point, dtype=np.int32), q.ndim, axis)
    difference = (q.astype(np.int32) - zero_point).astype(np.float32)
    return round_to_range(multiplier * difference, out_zero_point, qmin, qmax, in_place=True)


def fq_input_affine(input_low, input_high, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(crop_low, crop_high, isc, ish) = (min(il, ih), max(il, ih), (levels − 1)/(ih − il), −il·isc) in f32."""
    il, ih = np.asarray(input_low, dtype=np.float32), np.asarray(input_high, dtype=np.float32)
    input_scale = np.float32(levels - 1) / (ih - il)
    return np.minimum(il, ih), np.maximum(il, ih), input_scale, -il * input_scale


def quantize_fq(x, crop_low, crop_high, input_scale, input_shift, qmin: int, qmax: int) -> np.ndarray:
    """q = saturate(rint(clip(x, crop_low, crop_high) · isc + ish) + qmin) in f32: FakeQuantize's level as an integer.

    The multiply and the add round separately (OpenVINO's CPU plugin; see lpt.numerics.fake_quantize).
    The saturation only matters when |il| ≫ ih − il puts a level just outside the grid. NaN → qmin.
    Parameters broadcast against x (numpy rules); fq_input_affine computes them from an FQ's limits.
    """
    x = np.asarray(x, dtype=np.float32)
    crop_low, crop_high, input_scale, input_shift = (
        np.asarray(v, dtype=np.float32) for v in (crop_low, crop_high, input_scale, input_shift))
    cropped = np.fmin(np.fmax(x, crop_low), crop_high)
    return round_to_range(cropped * input_scale + input_shift, qmin, qmin, qmax, in_place=True)


def quantize_multiplier(real) -> tuple[np.ndarray, np.ndarray]:
    """real ≈ multiplier · 2^(shift − 31), multiplier in [2^30, 2^31): TFLite's QuantizeMultiplier.

    The Q31 mantissa is rounded half away from zero (std::round); a real below 2^−32 gives (0, 0).
    Vectorized over an array of reals (per-channel multipliers).
    """
    real = np.asarray(real, dtype=np.float64)
    if not np.all(np.isfinite(real) & (real > 0)):
        raise QuantizationError(f"a requantization multiplier must be finite and positive, got {real.ravel()[:8]}")
    mantissa, shift = np.frexp(real)  # real = mantissa · 2^shift, mantissa in [0.5, 1)
    multiplier = np.floor(mantissa * 2.0**31 + 0.5).astype(np.int64)  # exact: a 53-bit mantissa times 2^31
    carry = multiplier == 2**31
    multiplier, shift = np.where(carry, 2**30, multiplier), shift + carry
    if np.any(shift > 30):
        raise QuantizationError(f"a requantization multiplier of {real.max()} is beyond Q31 with a shift ≤ 30")
    tiny = shift < -31
    return (np.where(tiny, 0, multiplier).astype(np.int32)[()], np.where(tiny, 0, shift).astype(np.int32)[()])


def requantize_fixed_point(acc, multiplier, shift, zero_point, qmin: int, qmax: int,
                           axis: int | None = None) -> np.ndarray:
    """q = saturate(RoundingDivideByPOT(SaturatingRoundingDoublingHighMul(acc·2^left, multiplier), right) + zp).

    gemmlowp/TFLite's integer-only requantization (MultiplyByQuantizedMultiplier) with
    left = max(shift, 0), right = max(−shift, 0), in int64 holding int32 values. Rounding: the
    doubling high multiply, (x·m + nudge)/2^31 with C's truncating division and nudge 2^30 or
    1 − 2^30 by sign, rounds to nearest with ties toward +∞ (as ARM's VQRDMULH);
    RoundingDivideByPOT rounds to nearest with ties away from zero. The left shift must keep
    acc·2^left within int32 (ValueError otherwise: it is not saturated silently).
    """
    x = np.asarray(acc, dtype=np.int64)
    multiplier = broadcast_along(np.asarray(multiplier, dtype=np.int64), x.ndim, axis)
    shift = broadcast_along(np.asarray(shift, dtype=np.int64), x.ndim, axis)
    shifted = x << np.maximum(shift, 0)
    if np.any((shifted < INT32_MIN) | (shifted > INT32_MAX)):
        raise ValueError("acc · 2^shift overflows int32 in the integer-only requantization")
    scaled = _rounding_divide_by_pot(_saturating_rounding_doubling_high_mul(shifted, multiplier), np.maximum(-shift, 0))
    zero_point = broadcast_along(np.asarray(zero_point, dtype=np.int64), x.ndim, axis)
    return np.clip(scaled + zero_point, qmin, qmax).astype(integer_container(qmin, qmax))


def _saturating_rounding_doubling_high_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """round(a·b / 2^31), ties toward +∞, for int32 values held in int64; b ≥ 0, so −2^31·−2^31 cannot occur."""
    product = a * b  # |a·b| < 2^62
    nudged = product + np.where(product >= 0, 1 << 30, 1 - (1 << 30))
    return np.where(nudged >= 0, nudged >> 31, -((-nudged) >> 31))  # C's division, truncating toward zero


def _rounding_divide_by_pot(x: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """round(x / 2^exponent), ties away from zero: gemmlowp's remainder-and-threshold form."""
    mask = (np.int64(1) << exponent) - 1
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + ((x & mask) > threshold)


def one_hot_levels(v, table: np.ndarray, low: int, high: int, dtype) -> np.ndarray:
    """The quantized one-hot of integers v [..., 1] over table [K]: [..., K], `high` (the level of 1) where
    v equals table[k], `low` (the level of 0) elsewhere."""
    return np.where(np.asarray(v) == np.asarray(table), dtype(high), dtype(low)).astype(dtype, copy=False)
