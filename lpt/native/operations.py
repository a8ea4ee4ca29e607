"""One int8 convolution or matmul on oneDNN, prepared once and run many times, exact to the integer.

Both compute acc = Σ (q_src − zp_src)·q_wei in int32 (the padding of a convolution holds zp_src, so
it adds nothing, as ONNX's ConvInteger), then lpt's output stage, in f32 and in this order:
    x = f32(acc)·m[c];  x = x + bias[c];  post-ops;  q = saturate(rint(x / s_dst) + zp_dst)
(or x itself for an f32 destination), bit-identical to lpt.kernels.output_stage on every route.

What stays on lpt's NumPy/MLAS path raises `Unsupported` at creation, with the reason: a weight
zero point other than 0, uint8 weights, post-ops other than Relu, Clip, LeakyRelu, Sigmoid, SiLU, HardSwish and GELU, a
per-channel destination scale or zero point, a reduction longer than int32 holds for every input,
or no native engine / no exact route on this machine.
"""

from __future__ import annotations

import os

import numpy as np

from lpt.kernels.int8_gemm import MAX_REDUCTION
from lpt.kernels.output_stage import Clip, Gelu, HardSwish, LeakyRelu, Relu, Sigmoid, Silu
from lpt.kernels.quantize import integer_container
from lpt.kernels.window import Window
from lpt.native import routes
from lpt.native._library import engine, reason
from lpt.numerics import dynamic_quantize_linear

SCRATCH_BYTES = 64 << 20  # a convolution runs on at most this much scratch at once (Conv._run)
_DESTINATIONS = {np.dtype(np.float32): "f32", np.dtype(np.uint8): "u8", np.dtype(np.int8): "s8"}


class Unsupported(ValueError):
    """The native engine does not run this step; the message says why (lpt's NumPy/MLAS path does)."""


def usable_cores() -> int:
    """The cores this process may run on (its affinity), which bounds the engine's threads."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class _Operation:
    """What Conv and MatMul share: the route, the output stage's parameters, the threads."""

    def __init__(self, out_channels, reduction, multiplier, bias, post_ops, dst_scale, dst_zero_point, dst_dtype,
                 qmin, qmax, threads, route):
        if engine is None:
            raise Unsupported(f"the native engine is not available: {reason}")
        self.route = route or routes.route()
        if self.route is None:
            raise Unsupported(f"no exact oneDNN route on this machine ({routes.ROUTE_VARIABLE}="
                              f"{os.environ.get(routes.ROUTE_VARIABLE, 'auto')})")
        if self.route not in routes.ROUTES:
            raise ValueError(f"unknown route {self.route!r}: one of {', '.join(routes.ROUTES)}")
        if reduction > MAX_REDUCTION:
            raise Unsupported(f"a reduction of {reduction} could overflow int32 (at most {MAX_REDUCTION})")
        self.threads = min(threads, usable_cores()) if threads > 0 else usable_cores()
        self.multiplier = _per_channel(multiplier, out_channels, "multiplier")
        self.bias = None if bias is None else _per_channel(bias, out_channels, "bias")
        self.dst_dtype, destination = _destination(dst_scale, dst_zero_point, dst_dtype, qmin, qmax)
        self._stage = (self.multiplier, self.bias, _post_ops(post_ops)) + destination

    @property
    def instruction(self) -> tuple:
        """This operation as an instruction of a native program (lpt.native.program)."""
        return ("layer", self._operation)

    @property
    def implementation(self) -> str:
        """What computed the last run: the oneDNN implementation (e.g. brg:avx512_core_vnni) or lpt's (lpt:s16_avx2,
        lpt:rows_avx2 for a one-hot's gather of weight rows), '' before a run."""
        return engine.implementation(self._operation)

    def _check_src(self, src: np.ndarray, src_zero_point: int | None) -> int:
        """The zero point this run subtracts: `src_zero_point`, or the operation's own where it is None."""
        if src.dtype not in (np.uint8, np.int8):
            raise TypeError(f"the source must be uint8 or int8, got {src.dtype}")
        zero_point = self.src_zero_point if src_zero_point is None else int(src_zero_point)
        info = np.iinfo(src.dtype)
        if not info.min <= zero_point <= info.max:
            raise ValueError(f"source zero point {zero_point} is outside {src.dtype}")
        return zero_point


class Conv(_Operation):
    """dst[n, oc, o] = output_stage(Σ_{ic,k} (q_src[n, ic', o·s + k·d − pad] − zp_src)·q_wei[oc, ic, k]) on oneDNN.

    weights: int8 [OC, IC/groups, *kernel], 1 to 3 spatial axes; strides, dilations, pads as ONNX's
    Conv (pads [x1_begin, x2_begin, …, x1_end, x2_end], explicit); multiplier f32, one or one per
    OC (s_src·s_wei[oc]); bias f32 [OC] or None; post_ops a tuple of lpt.kernels Relu / Clip / LeakyRelu /
    Sigmoid / Silu / Gelu;
    dst_scale None for an f32 destination, else the destination's scale and zero point, in
    dst_dtype (uint8 or int8; by default the narrowest type holding [qmin, qmax]), saturated to
    [qmin, qmax]. threads: 0 for every usable core, else at most that many. route: None for
    routes.route(), or "u8s8" / "s16" / "split" (a route not exact on this CPU gives wrong results;
    s16 hands grouped and 3-D convolutions to split).
    The primitive for a source shape is created, and the weights reordered, at its first run.
    """

    def __init__(self, weights, *, groups: int = 1, strides=None, dilations=None, pads=None, src_zero_point: int = 0,
                 weight_zero_point=0, multiplier=1.0, bias=None, post_ops=(), dst_scale=None, dst_zero_point=0,
                 dst_dtype=None, qmin: int | None = None, qmax: int | None = None, threads: int = 0,
                 route: str | None = None):
        weights = np.asarray(weights)
        if weights.dtype != np.int8:
            raise Unsupported(f"{weights.dtype} weights (int8 only)")
        if not 3 <= weights.ndim <= 5:
            raise Unsupported(f"a convolution with {weights.ndim - 2} spatial axes (1 to 3 only)")
        if np.any(np.asarray(weight_zero_point) != 0):
            raise Unsupported("a weight zero point other than 0")
        if groups < 1 or weights.shape[0] % groups:
            raise ValueError(f"weights of shape {weights.shape} do not fit a convolution with {groups} groups")
        super().__init__(weights.shape[0], int(np.prod(weights.shape[1:])), multiplier, bias, post_ops, dst_scale,
                         dst_zero_point, dst_dtype, qmin, qmax, threads, route)
        self.window = Window.of(weights.shape[2:], strides, dilations, pads)
        self.groups, self.src_zero_point = groups, int(src_zero_point)
        self.out_channels, self.in_channels = weights.shape[0], weights.shape[1] * groups
        rank = len(self.window.kernel)
        if not routes.runs(self.route, groups, rank, depthwise=weights.shape[1] == 1 and weights.shape[0] == groups):
            self.route = "split"
        weights = np.ascontiguousarray(weights)
        self._operation = self._make(weights)
        if route is None:
            chosen = routes.conv_route(self.route, int(np.prod(weights.shape[1:])), groups, rank,
                                       staged=engine.stages(self._operation))
            if chosen != self.route:
                self.route = chosen
                self._operation = self._make(weights)

    def _make(self, weights: np.ndarray):
        rank = len(self.window.kernel)
        return engine.conv(weights, weights.shape, self.groups, self.window.strides, self.window.dilations,
                           self.window.pads[:rank], self.window.pads[rank:], self.src_zero_point, self.route,
                           self.threads, *self._stage)

    def __call__(self, src, channels_last: bool = False, src_zero_point: int | None = None) -> np.ndarray:
        """dst [N, OC, *out] from src uint8/int8 [N, IC, *spatial]; with `channels_last`, a view of [N, *out, OC].
        `src_zero_point` replaces the operation's for this run (a dynamic quantization's)."""
        return self._run(src, None, channels_last, src_zero_point)

    def accumulate(self, src, channels_last: bool = False, src_zero_point: int | None = None) -> np.ndarray:
        """acc int32 [N, OC, *out], before the output stage: what the exactness tests compare."""
        return self._run(src, np.int32, channels_last, src_zero_point)

    def _run(self, src, dtype, channels_last: bool, src_zero_point: int | None) -> np.ndarray:
        src = np.asarray(src)
        zero_point = self._check_src(src, src_zero_point)
        if src.ndim != 2 + len(self.window.kernel) or src.shape[1] != self.in_channels:
            raise ValueError(f"source of shape {src.shape} does not fit weights for {self.in_channels} input channels")
        if not (src.flags.c_contiguous or np.moveaxis(src, 1, -1).flags.c_contiguous):
            src = np.ascontiguousarray(src)
        out_spatial = self.window.output_shape(src.shape[2:])
        dtype = self.dst_dtype if dtype is None else dtype
        if channels_last:
            out = np.empty((src.shape[0],) + out_spatial + (self.out_channels,), dtype)
        else:
            out = np.empty((src.shape[0], self.out_channels) + out_spatial, dtype)
        # The engine's scratch (int32 accumulators, twice on the split route, and the source in its
        # layout) grows with the batch: run it a few images at a time, as the MLAS route does.
        per_image = src[:1].nbytes + 8 * int(np.prod(out_spatial)) * self.out_channels
        images = max(1, SCRATCH_BYTES // max(per_image, 1))
        for start in range(0, src.shape[0], images):
            engine.run(self._operation, src[start:start + images], out[start:start + images], dtype == np.int32,
                       channels_last, zero_point)
        return np.moveaxis(out, -1, 1) if channels_last else out


class MatMul(_Operation):
    """dst[..., n] = output_stage(Σ_k (q_src[..., k] − zp_src)·q_wei[k, n]) on oneDNN, for a constant int8 [K, N].

    The same parameters as Conv, per N instead of per OC; the source's leading axes are flattened to M rows.
    """

    def __init__(self, weights, *, src_zero_point: int = 0, weight_zero_point=0, multiplier=1.0, bias=None,
                 post_ops=(), dst_scale=None, dst_zero_point=0, dst_dtype=None, qmin: int | None = None,
                 qmax: int | None = None, threads: int = 0, route: str | None = None):
        weights = np.asarray(weights)
        if weights.dtype != np.int8 or weights.ndim != 2:
            raise Unsupported(f"{weights.dtype} weights of shape {weights.shape} (int8 [K, N] only)")
        if np.any(np.asarray(weight_zero_point) != 0):
            raise Unsupported("a weight zero point other than 0")
        super().__init__(weights.shape[1], weights.shape[0], multiplier, bias, post_ops, dst_scale, dst_zero_point,
                         dst_dtype, qmin, qmax, threads, route)
        self.src_zero_point = int(src_zero_point)
        self.reduction, self.columns = weights.shape
        self._operation = engine.matmul(np.ascontiguousarray(weights), weights.shape, self.src_zero_point, self.route,
                                        self.threads, *self._stage)

    def __call__(self, src, src_zero_point: int | None = None) -> np.ndarray:
        """dst [..., N] from src uint8/int8 [..., K]; `src_zero_point` as Conv's."""
        return self._run(src, self.dst_dtype, src_zero_point)

    def accumulate(self, src, src_zero_point: int | None = None) -> np.ndarray:
        """acc int32 [..., N], before the output stage."""
        return self._run(src, np.int32, src_zero_point)

    def _run(self, src, dtype, src_zero_point: int | None) -> np.ndarray:
        src = np.asarray(src)
        zero_point = self._check_src(src, src_zero_point)
        if src.ndim < 1 or src.shape[-1] != self.reduction:
            raise ValueError(f"source of shape {src.shape} does not fit weights [K={self.reduction}, N]")
        rows = np.ascontiguousarray(src.reshape(-1, self.reduction))
        out = np.empty((rows.shape[0], self.columns), dtype)
        if rows.shape[0]:
            engine.run(self._operation, rows, out, dtype == np.int32, False, zero_point)
        return out.reshape(src.shape[:-1] + (self.columns,))


class Product:
    """dst[..., m, n] = output_stage(Σ_k (a[..., m, k] − za)·(b[..., k, n] − zb)), exact in int32, for two
    uint8/int8 tensors that both arrive at run time (attention's Q·Kᵀ and weights·V: MatMulInteger of
    two activations); a and b have the same leading axes (no broadcasting).

    The output stage's parameters are MatMul's: multiplier and bias one value or one per column n.
    Nothing is packed ahead, and there is no oneDNN primitive: a plain int32 loop, which at the sizes of
    attention (K of 16 to 64) costs less than preparing one. It runs as an instruction of a native program.
    """

    def __init__(self, *, a_zero_point: int = 0, b_zero_point: int = 0, multiplier=1.0, bias=None, post_ops=(),
                 dst_scale=None, dst_zero_point=0, dst_dtype=None, qmin: int | None = None, qmax: int | None = None,
                 threads: int = 0):
        from lpt.native.program import Program

        if engine is None:
            raise Unsupported(f"the native engine is not available: {reason}")
        if np.size(a_zero_point) != 1 or np.size(b_zero_point) != 1:
            raise Unsupported("a per-row or per-column zero point of a product")
        threads = min(threads, usable_cores()) if threads > 0 else usable_cores()
        multiplier = np.ascontiguousarray(np.asarray(multiplier, np.float32).reshape(-1))
        bias = None if bias is None else np.ascontiguousarray(np.asarray(bias, np.float32).reshape(-1))
        self.dst_dtype, destination = _destination(dst_scale, dst_zero_point, dst_dtype, qmin, qmax)
        self._product = engine.product(int(np.reshape(a_zero_point, ())), int(np.reshape(b_zero_point, ())), threads,
                                       multiplier, bias, _post_ops(post_ops), *destination)
        self._program = Program([("product", ["a", "b"], "y", self._product)], ["a", "b"], ["y"], threads)

    @property
    def instruction(self) -> tuple:
        """This product as an instruction of a native program (lpt.native.program)."""
        return ("product", self._product)

    def __call__(self, a, b) -> np.ndarray:
        """dst [..., M, N] from a [..., M, K] and b [..., K, N]; Unsupported where the engine does not take them."""
        [out] = self._program(a, b)
        return out


def dynamic_quantize(x, threads: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX DynamicQuantizeLinear of a float32 x: (uint8 q, scale, zero point), exactly as
    lpt.numerics.dynamic_quantize_linear, in one pass for the range and one for q (and its error
    where the scale is infinite or 0)."""
    if engine is None:
        raise Unsupported(f"the native engine is not available: {reason}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    q = np.empty(x.shape, np.uint8)
    scale, zero_point = engine.dynamic_quantize(x, q, min(threads, usable_cores()) if threads > 0 else usable_cores())
    if not np.isfinite(np.float32(scale)) or np.float32(scale) == 0:  # a range beyond f32, or below its steps
        return dynamic_quantize_linear(x)
    return q, np.asarray(scale, np.float32), np.asarray(zero_point, np.uint8)


def _destination(dst_scale, dst_zero_point, dst_dtype, qmin, qmax) -> tuple[np.dtype, tuple]:
    """The destination's dtype, and its part of the engine's output stage (dst, scale, zero point, qmin, qmax)."""
    if np.size(dst_scale) > 1 or np.size(dst_zero_point) != 1:
        raise Unsupported("a per-channel destination scale or zero point")
    if dst_scale is None:
        if dst_dtype not in (None, np.float32):
            raise ValueError(f"a {np.dtype(dst_dtype)} destination needs a dst_scale")
        dtype, qmin, qmax = np.dtype(np.float32), 0, 0
    else:
        if dst_dtype is None:
            dst_dtype = integer_container(0 if qmin is None else qmin, 255 if qmax is None else qmax)
        dtype = np.dtype(dst_dtype)
        if dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
            raise Unsupported(f"a {dtype} destination (u8, s8 or f32 only)")
        info = np.iinfo(dtype)
        qmin, qmax = (info.min if qmin is None else qmin), (info.max if qmax is None else qmax)
        if not info.min <= qmin <= qmax <= info.max:
            raise ValueError(f"[{qmin}, {qmax}] is not a range within {dtype}")
    return dtype, (_DESTINATIONS[dtype], 1.0 if dst_scale is None else float(np.float32(np.asarray(dst_scale).reshape(()))),
                   int(np.asarray(dst_zero_point).reshape(())), int(qmin), int(qmax))


def _per_channel(value, channels: int, name: str) -> np.ndarray:
    """One f32 per channel, from one value or one per channel."""
    value = np.asarray(value, dtype=np.float32).reshape(-1)
    if value.size not in (1, channels):
        raise ValueError(f"{value.size} {name} values for {channels} channels")
    return np.ascontiguousarray(np.broadcast_to(value, (channels,)))


MAX_POST_OPS = 8  # lpt/native/s16.h: MAX_POST_OPS
_SLOPE_CLIP, _SIGMOID, _GELU, _SILU, _HARD_SWISH = 0.0, 1.0, 2.0, 3.0, 4.0  # and its post-op kinds


def _post_ops(post_ops) -> np.ndarray:
    """The post-ops as the engine's (kind, slope, low, high) quadruples (lpt/native/s16.h: PostOp): kind 0 is
    x < 0 ? x·slope : x, then min(max(x, low), high), so Relu is a clip with no upper bound and LeakyRelu a
    slope with no bounds; kind 1 is lpt's Sigmoid (lpt.numerics.exp); kind 2 a GELU, its divisor, one and
    half in the other three places; kind 3 a SiLU, x·sigmoid(x); kind 4 a HardSwish, its alpha and beta
    in the places of slope and low."""
    quadruples = []
    for op in post_ops:
        if isinstance(op, Relu):
            quadruples.append((_SLOPE_CLIP, 1.0, 0.0, np.inf))
        elif isinstance(op, Clip):
            quadruples.append((_SLOPE_CLIP, 1.0, op.low, op.high))
        elif isinstance(op, LeakyRelu):
            quadruples.append((_SLOPE_CLIP, op.alpha, -np.inf, np.inf))
        elif isinstance(op, Sigmoid):
            quadruples.append((_SIGMOID, 0.0, 0.0, 0.0))
        elif isinstance(op, Gelu):
            quadruples.append((_GELU, op.divisor, op.one, op.half))
        elif isinstance(op, Silu):
            quadruples.append((_SILU, 0.0, 0.0, 0.0))
        elif isinstance(op, HardSwish):
            quadruples.append((_HARD_SWISH, op.alpha, op.beta, 0.0))
        else:
            raise Unsupported(f"the post-op {type(op).__name__} (Relu, Clip, LeakyRelu, Sigmoid, SiLU, HardSwish "
                              "and GELU only)")
    # a LeakyRelu then a clip is one quadruple: the same operations in the same order (s16's one-clip stage)
    merged = []
    for quadruple in quadruples:
        if merged and merged[-1][0] == _SLOPE_CLIP and merged[-1][2:] == (-np.inf, np.inf) and \
                quadruple[0] == _SLOPE_CLIP and quadruple[1] == 1.0:
            merged[-1] = (_SLOPE_CLIP, merged[-1][1], quadruple[2], quadruple[3])
        else:
            merged.append(quadruple)
    quadruples = merged
    if len(quadruples) > MAX_POST_OPS:
        raise Unsupported(f"{len(quadruples)} post-ops (the engine's output stage takes {MAX_POST_OPS})")
    return np.array(quadruples, np.float32).reshape(-1)
