"""ONNX QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear, in onnxruntime's f32 arithmetic.

These are the reference the integer kernels are checked against, so each one computes exactly
what onnxruntime's CPU kernels (MLAS) compute, bit for bit; tests/numerics checks that claim
against onnxruntime itself and against ONNX's backend node test cases.
"""

from __future__ import annotations

import numpy as np

from lpt.errors import QuantizationError

INTEGER_TYPES = {  # name: (qmin, qmax, numpy container)
    "uint8": (0, 255, np.uint8),
    "int8": (-128, 127, np.int8),
    "uint16": (0, 65535, np.uint16),
    "int16": (-32768, 32767, np.int16),
    "uint4": (0, 15, np.uint8),  # numpy has no 4-bit integers: 4-bit values in an 8-bit array
    "int4": (-8, 7, np.int8),
}


def quantize_linear(x, scale, zero_point=None, axis: int = 1, block_size: int = 0, output_dtype=None) -> np.ndarray:
    """q = saturate(round_half_even(x / scale) + zero_point), x / scale one f32 division.

    Matches onnxruntime's QuantizeLinear (MLAS): the quotient is an f32 division — not
    x·(1/scale), which differs in the last bit often enough to move ties — clamped to
    [qmin − zp, qmax − zp] before rounding, so ±inf saturate and NaN gives qmin. (onnxruntime's
    per-element kernels — blocked along a non-last axis, int4 per axis on the last one — convert
    to int32 before clamping, so there x/scale ≥ 2³¹ wraps to qmin; lpt saturates, as the spec says.)

    scale and zero_point hold one value (per tensor), one per index of `axis` (1-D), or one
    per block of `block_size` elements along `axis` (same rank as x, ONNX opset 21).
    The output type is `output_dtype` (a numpy dtype or a name such as "int4"), else the zero
    point's dtype, else uint8 as in ONNX; int4/uint4 come in int8/uint8 arrays.
    """
    x = np.asarray(x, dtype=np.float32)
    qmin, qmax, container = INTEGER_TYPES[_output_type(zero_point, output_dtype)]
    scale = _checked_scale(scale, x.shape, axis, block_size)
    zp = _zero_point(zero_point, qmin, qmax, x.shape, axis, block_size)
    with np.errstate(over="ignore"):  # a quotient beyond f32 is ±inf, and saturates below
        quotient = x / scale
    # fmax/fmin map NaN to the lower bound, as MLAS's MAXPS/MINPS do.
    quotient = np.fmin(np.fmax(quotient, (qmin - zp).astype(np.float32)), (qmax - zp).astype(np.float32))
    return (np.rint(quotient).astype(np.int32) + zp).astype(container)


def dequantize_linear(q, scale, zero_point=None, axis: int = 1, block_size: int = 0) -> np.ndarray:
    """x = f32(q − zero_point) · scale: the difference in int32, then one f32 multiply, as onnxruntime computes it."""
    q = np.asarray(q)
    if q.dtype.name not in INTEGER_TYPES and q.dtype.kind not in "iu":
        raise QuantizationError(f"DequantizeLinear needs an integer input, got {q.dtype}")
    q = q.astype(np.int32)
    scale = _checked_scale(scale, q.shape, axis, block_size)
    zp = 0 if zero_point is None else _broadcast(np.asarray(zero_point).astype(np.int32), q.shape, axis, block_size)
    return (q - zp).astype(np.float32) * scale


def dynamic_quantize_linear(x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """scale = (max(x, 0) − min(x, 0))/255, zp = round(clip(−min/scale, 0, 255)), y = quantize_linear(x, scale, zp).

    In f32, as onnxruntime computes them: NaN is left out of min and max, and an all-zero x gets
    scale 1.0 (the spec's formula is 0/0 there; ONNX's reference evaluator picks 1/255 instead).
    """
    x = np.asarray(x, dtype=np.float32)
    low = np.fmin.reduce(x, axis=None, initial=np.float32(0))
    high = np.fmax.reduce(x, axis=None, initial=np.float32(0))
    with np.errstate(over="ignore", invalid="ignore"):  # an infinite range: quantize_linear refuses its scale
        scale = np.float32(1) if low == high else (high - low) / np.float32(255)
        zero_point = np.rint(np.clip(-low / scale, 0, 255)).astype(np.uint8)
    return quantize_linear(x, scale, zero_point), np.asarray(scale, dtype=np.float32), np.asarray(zero_point)


def _output_type(zero_point, output_dtype) -> str:
    if output_dtype is not None:
        name = output_dtype if isinstance(output_dtype, str) else np.dtype(output_dtype).name
    elif zero_point is not None:
        name = np.asarray(zero_point).dtype.name
    else:
        name = "uint8"
    if name not in INTEGER_TYPES:
        raise QuantizationError(f"lpt quantizes to integer types only ({', '.join(INTEGER_TYPES)}), not {name}")
    return name


def _checked_scale(scale, shape, axis: int, block_size: int) -> np.ndarray:
    scale = np.asarray(scale, dtype=np.float32)
    if not np.all(np.isfinite(scale) & (scale != 0)):
        raise QuantizationError(f"scale must be finite and non-zero, got {scale.ravel()[:8]}")
    return _broadcast(scale, shape, axis, block_size)


def _zero_point(zero_point, qmin: int, qmax: int, shape, axis: int, block_size: int) -> np.ndarray:
    if zero_point is None:
        return np.zeros((), dtype=np.int32)
    zp = np.asarray(zero_point).astype(np.int32)
    if np.any((zp < qmin) | (zp > qmax)):
        raise QuantizationError(f"zero point {zp.ravel()[:8]} is outside the output range [{qmin}, {qmax}]")
    return _broadcast(zp, shape, axis, block_size)


def _broadcast(param: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int) -> np.ndarray:
    """`param` shaped to broadcast against a tensor of `shape`: per tensor, per axis, or blocked along axis."""
    rank = len(shape)
    if block_size == 0 and param.size == 1 and param.ndim <= 1:
        return param.reshape(())
    if not -rank <= axis < rank:
        raise QuantizationError(f"axis {axis} is out of range for a tensor of rank {rank}")
    axis %= rank
    if block_size:
        blocks = -(-shape[axis] // block_size)
        if param.shape != shape[:axis] + (blocks,) + shape[axis + 1:]:
            raise QuantizationError(f"blocked parameter of shape {param.shape} does not fit shape {shape} "
                                    f"with block_size {block_size} on axis {axis}")
        return np.repeat(param, block_size, axis=axis).take(np.arange(shape[axis]), axis=axis)
    if param.shape != (shape[axis],):
        raise QuantizationError(f"parameter of shape {param.shape} does not fit axis {axis} of shape {shape}")
    return param.reshape([-1 if d == axis else 1 for d in range(rank)])
