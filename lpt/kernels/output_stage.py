"""From int32 accumulators to the destination: oneDNN v3's output scheme, and ONNX QLinear's requantization.

output_stage, in f32 and in this order (the reference twin performs the same operations):
    1. x = f32(acc) · m[c]         m = s_src · s_wei[c], one f32 multiply, computed once (dequantization_multiplier);
                                    f32(acc) is exact for |acc| ≤ 2^24 and rounded to nearest even beyond;
    2. x = x + bias[c]              a separate add (no fused multiply-add);
    3. x = post_op(x)               for each post-op in turn;
    4. q = saturate(rint(x / s_dst) + zp_dst)   quantize (one f32 division), or x itself for an f32 destination.
Per-channel values lie along `axis` (1 for convolution's [N, C, …], −1 for MatMul's [..., N]).
Every step after the conversion works in place on the f32 copy of acc, which the stage owns (a
post-op's `apply` may overwrite its argument): fewer passes over memory, same operations.
Where acc is int32 with channels innermost in memory, the post-ops are Relu/Clip and the
destination is 8-bit, one C pass does it all (lpt/kernels/_elementwise.c): the same operations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lpt.kernels.float_ops import gelu, hard_sigmoid
from lpt.kernels.quantize import broadcast_along, integer_container, quantize, round_to_range
from lpt.numerics import fake_quantize
from lpt.numerics.exp import sigmoid

try:
    from lpt.kernels import _elementwise as _native
except ImportError:  # built without a C compiler: the numpy forms run instead
    _native = None


@dataclass(frozen=True)
class Relu:
    """x = max(x, 0)."""

    def apply(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(x, np.float32(0), out=x)


@dataclass(frozen=True)
class Clip:
    """x = min(max(x, low), high)."""

    low: float
    high: float

    def apply(self, x: np.ndarray) -> np.ndarray:
        return np.minimum(np.maximum(x, np.float32(self.low), out=x), np.float32(self.high), out=x)


@dataclass(frozen=True)
class LeakyRelu:
    """x = x < 0 ? x·alpha : x in f32, as onnxruntime's LeakyRelu (one multiply, where x is negative)."""

    alpha: float

    def apply(self, x: np.ndarray) -> np.ndarray:
        return np.multiply(x, np.float32(self.alpha), out=x, where=x < 0)


@dataclass(frozen=True)
class Sigmoid:
    """x = 1 / (1 + exp(−x)) in f32, as lpt.numerics.exp spells it (the native engine's to the bit)."""

    def apply(self, x: np.ndarray) -> np.ndarray:
        return sigmoid(x)


@dataclass(frozen=True)
class Silu:
    """x = x·sigmoid(x) in f32 (SiLU, Swish: a Sigmoid and a Mul by x), lpt's sigmoid (lpt.numerics.exp)."""

    def apply(self, x: np.ndarray) -> np.ndarray:
        return x * sigmoid(x)


@dataclass(frozen=True)
class HardSwish:
    """x = x·min(max(x·alpha + beta, 0), 1) in f32: a HardSigmoid and a Mul by x (before opset 14), or ONNX's
    HardSwish (alpha = f32(1/6), beta = 1/2), as lpt.kernels.hard_sigmoid and a Mul compute them."""

    alpha: float
    beta: float

    def apply(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):  # −inf·0 is NaN, as onnxruntime's
            return x * hard_sigmoid(x, self.alpha, self.beta)


@dataclass(frozen=True)
class Gelu:
    """x = x·(erf(x / divisor) + one)·half in f32, as lpt.kernels.gelu computes GELU's five ops
    (Div, Erf, Add, Mul, Mul) and the native engine's to the bit."""

    divisor: float
    one: float
    half: float

    def apply(self, x: np.ndarray) -> np.ndarray:
        return gelu(x, self.divisor, self.one, self.half)


@dataclass(frozen=True, eq=False)  # eq=False: an ndarray field has no boolean ==
class Sum:
    """x = x + other: oneDNN's sum / binary-add post-op, with another f32 tensor broadcastable to x."""

    other: np.ndarray

    def apply(self, x: np.ndarray) -> np.ndarray:
        return np.add(x, np.asarray(self.other, dtype=np.float32), out=x)


@dataclass(frozen=True, eq=False)
class FakeQuantize:
    """x = FakeQuantize(x, il, ih, ol, oh, levels), OpenVINO's CPU chain: max, min, ·isc, +ish, round, ·osc+osh.

    Computed by lpt.numerics.fake_quantize (which documents the last-bit details), so that the fused
    post-op and a standalone FQ agree bit for bit. Limits are scalars or arrays broadcastable to x
    (e.g. [1, C, 1, 1]).
    """

    input_low: np.ndarray
    input_high: np.ndarray
    output_low: np.ndarray
    output_high: np.ndarray
    levels: int

    def apply(self, x: np.ndarray) -> np.ndarray:
        return fake_quantize(x, self.input_low, self.input_high, self.output_low, self.output_high, self.levels)


PostOp = Relu | Clip | LeakyRelu | Sigmoid | Silu | HardSwish | Gelu | Sum | FakeQuantize
# The post-ops that act on each value alone: lpt's native output stage computes these.
ELEMENTWISE_POST_OPS = (Relu, Clip, LeakyRelu, Sigmoid, Silu, HardSwish, Gelu)


def dequantization_multiplier(src_scale, weight_scale) -> np.ndarray:
    """m[c] = s_src · s_wei[c], one f32 multiply."""
    return np.asarray(src_scale, dtype=np.float32) * np.asarray(weight_scale, dtype=np.float32)


def output_stage(acc, multiplier, bias=None, post_ops: tuple[PostOp, ...] = (), dst_scale=None, dst_zero_point=0,
                 qmin: int = 0, qmax: int = 255, axis: int = 1) -> np.ndarray:
    """dst = post_ops(f32(acc)·m[c] + bias[c]), then saturate(rint(dst / s_dst) + zp_dst); f32 if s_dst is None."""
    acc = np.asarray(acc)
    if (out := _in_one_pass(acc, multiplier, bias, post_ops, dst_scale, dst_zero_point, qmin, qmax, axis)) is not None:
        return out
    x = acc.astype(np.float32)  # a copy: the steps below work in place on it
    np.multiply(x, broadcast_along(np.asarray(multiplier, dtype=np.float32), acc.ndim, axis), out=x)
    if bias is not None:
        np.add(x, broadcast_along(np.asarray(bias, dtype=np.float32), acc.ndim, axis), out=x)
    for op in post_ops:
        x = op.apply(x)
    if dst_scale is None:
        return x
    return quantize(x, dst_scale, dst_zero_point, qmin, qmax, in_place=True)


def _in_one_pass(acc, multiplier, bias, post_ops, dst_scale, dst_zero_point, qmin, qmax, axis):
    """The C form of output_stage, or None where it does not apply."""
    if (_native is None or acc.dtype != np.int32 or acc.ndim == 0 or np.size(dst_zero_point) != 1
            or np.size(dst_scale) != 1 or not all(isinstance(op, (Relu, Clip)) for op in post_ops)):
        return None  # (a per-channel destination broadcasts by numpy's rules in the numpy form: left to it)
    channels_last = np.moveaxis(acc, axis, -1)
    dtype = np.float32 if dst_scale is None else integer_container(qmin, qmax)
    if not channels_last.flags.c_contiguous or dtype not in (np.float32, np.uint8, np.int8):
        return None
    clips = [(0.0, np.inf) if isinstance(op, Relu) else (op.low, op.high) for op in post_ops]
    out = np.empty(channels_last.shape, dtype)
    channels = channels_last.shape[-1]
    _native.output_stage(channels_last, out, _vector(multiplier, channels),
                         None if bias is None else _vector(bias, channels), np.array(clips, np.float32).reshape(-1),
                         None if dst_scale is None else float(np.float32(np.asarray(dst_scale).reshape(()))),
                         int(np.asarray(dst_zero_point).reshape(())), qmin, qmax)
    return np.moveaxis(out, -1, axis)


def _vector(value, channels: int) -> np.ndarray:
    """One f32 per channel (a single value repeated)."""
    value = np.asarray(value, dtype=np.float32)
    if value.shape == (channels,) and value.flags.c_contiguous:
        return value
    return np.ascontiguousarray(np.broadcast_to(value.reshape(-1), (channels,)))


def qlinear_multiplier(x_scale, w_scale, y_scale) -> np.ndarray:
    """m[c] = (x_scale · w_scale[c]) / y_scale in f32, in that order, as onnxruntime's QLinearConv/QLinearMatMul do."""
    return (np.asarray(x_scale, dtype=np.float32) * np.asarray(w_scale, dtype=np.float32)
            / np.asarray(y_scale, dtype=np.float32))


def qlinear_output(acc, multiplier, zero_point, qmin: int, qmax: int, bias=None, axis: int = 1) -> np.ndarray:
    """q = saturate(rint(f32(acc + bias) · m[c]) + zp): QLinearConv/QLinearMatMul's requantization, as MLAS computes it.

    The int32 bias is added to the accumulator in integers (int64 here, where onnxruntime's int32
    would wrap), converted to f32 once, multiplied by m = qlinear_multiplier(...), rounded half to even.
    """
    acc = np.asarray(acc, dtype=np.int64)
    if bias is not None:
        acc = acc + broadcast_along(np.asarray(bias, dtype=np.int64), acc.ndim, axis)
    multiplier = broadcast_along(np.asarray(multiplier, dtype=np.float32), acc.ndim, axis)
    zero_point = broadcast_along(np.asarray(zero_point, dtype=np.int32), acc.ndim, axis)
    return round_to_range(acc.astype(np.float32) * multiplier, zero_point, qmin, qmax)
