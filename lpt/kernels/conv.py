"""Integer convolution, prepared once and run many times: acc = Σ (q_src − zp_src)·(q_wei − zp_wei), exact.

The four terms of the OpenVINO RFC,
    Σ (a − za)(w − zw) = Σ a·w − zw·Σ a − za·Σ w + K·za·zw,
collapse because the weights are constant: packing stores W' = w − zw, which carries the first two
terms into the product with the raw source, and the last two into the compensation
comp[oc] = Σ W'[oc] (= Σ q_wei when zw = 0), so acc = conv(a, W') − za·comp. The product sees
raw q_src, and the padding is filled with za, where it contributes (za − za)·W' = 0.

The product runs, where it can, on MLAS's integer GEMM (lpt.kernels.int8_gemm: one group,
W' within int8, MLAS free of saturation): im2col gathers the source channels-last into
[N·P, taps·C] rows in one strided copy, and the int32 result [N·P, OC] comes back as an
[N, OC, *out] view of that channels-last memory, which every later elementwise step keeps
(numpy preserves the layout), so the next convolution's gather reads it without a transpose.
Otherwise the product runs through f32 BLAS (lpt.kernels.gemm: chunks of the reduction K exact
by construction) on an im2col matrix built with one strided copy per kernel tap; a depthwise
convolution (one input channel per group) skips im2col and accumulates tap by tap in f32, exact
while taps·max|a|·max|W'| ≤ 2^24.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from lpt.kernels import gemm
from lpt.kernels.gemm import accumulator_dtype, deviation_bound, exact_chunk, integer_range, magnitude_bound
from lpt.kernels.int8_gemm import MAX_REDUCTION, ConstantInt8Gemm, as_unsigned, gemm_route
from lpt.kernels.window import Window

IM2COL_BYTES = 64 << 20  # the MLAS route gathers its im2col rows in blocks of at most this many bytes


@dataclass(frozen=True, eq=False)  # eq=False: ndarray fields have no boolean ==
class PackedConv:
    """Weights packed once: W' = q_wei − zp_wei as f32 [groups, OC/groups, IC/groups·∏kernel], comp[oc] = Σ W'[oc]."""

    weights: np.ndarray  # f32, integer-valued, reduction order (ic, *kernel) as in ONNX's [OC, IC/g, *kernel]
    compensation: np.ndarray  # int64 [OC]
    offset: np.ndarray  # int64 [OC, 1, …]: −zp_src · comp, broadcast over [N, OC, *spatial]
    src_zero_point: int
    weight_bound: int  # max |W'|, 1 for all-zero weights
    weight_abs_sum: int  # max over oc of Σ_k |W'[oc, k]|: bounds every partial sum of one output
    chunks: dict  # max|q_src| (128 or 255) → slices of K whose f32 partial sums are all exact
    groups: int
    window: Window
    int8_gemm: ConstantInt8Gemm | None  # W' as int8 [(taps, IC), OC] on MLAS, where exact

    @property
    def out_channels(self) -> int:
        return self.weights.shape[0] * self.weights.shape[1]

    @property
    def in_channels(self) -> int:
        return self.groups * self.weights.shape[2] // self.window.taps


def pack_conv(weights_q, weight_zero_point=0, src_zero_point: int = 0, groups: int = 1,
              strides=None, dilations=None, pads=None, threads: int = 0, int8_gemm: bool = True,
              auto_pad: str = "NOTSET") -> PackedConv:
    """W' = q_wei − zp_wei, comp[oc] = Σ W'[oc], offset = −zp_src·comp, for weights [OC, IC/groups, *kernel].

    weight_zero_point is one value or one per output channel; weights are int8 or uint8 (any integers
    with |q_wei − zp_wei| ≤ 2^24 work). strides, dilations, pads as ONNX's Conv (pads [x1_begin, …, x1_end, …]).
    With `int8_gemm` (and where it is exact) the product runs on MLAS with `threads` threads
    (0: one per core); without, on f32 BLAS.
    """
    weights = np.asarray(weights_q)
    if weights.ndim < 3 or weights.shape[0] % groups:
        raise ValueError(f"weights of shape {weights.shape} do not fit a convolution with {groups} groups")
    out_channels, kernel = weights.shape[0], weights.shape[2:]
    zero_point = np.asarray(weight_zero_point, dtype=np.int64).reshape(-1)
    if zero_point.size not in (1, out_channels):
        raise ValueError(f"{zero_point.size} weight zero points for {out_channels} output channels")
    centred = weights.astype(np.int64).reshape(out_channels, -1) - zero_point[:, None]
    compensation = centred.sum(axis=1)
    magnitudes = np.abs(centred)
    offset = -int(src_zero_point) * compensation
    route = gemm_route() if int8_gemm else None
    mlas = (route is not None and groups == 1 and centred.shape[1] <= MAX_REDUCTION
            and -128 <= centred.min(initial=0) and centred.max(initial=0) <= 127)
    channels_last = np.moveaxis(centred.reshape(weights.shape), 1, -1).reshape(out_channels, -1)
    return PackedConv(
        weights=centred.astype(np.float32).reshape(groups, out_channels // groups, -1),
        compensation=compensation,
        offset=offset.reshape((out_channels,) + (1,) * len(kernel)),
        src_zero_point=int(src_zero_point),
        weight_bound=max(1, int(np.abs(centred).max(initial=0))),
        weight_abs_sum=max(1, int(magnitudes.sum(axis=1).max(initial=0))),
        chunks={bound: exact_chunks(magnitudes, gemm.F32_EXACT_INTEGERS // bound) for bound in (128, 255)},
        groups=groups,
        window=Window.of(kernel, strides, dilations, pads, auto_pad),
        int8_gemm=ConstantInt8Gemm(channels_last.T.astype(np.int8), threads, route) if mlas else None,
    )


def with_src_zero_point(packed: PackedConv, src_zero_point: int) -> PackedConv:
    """The same packed weights for another source zero point (one known only at run time, as
    DynamicQuantizeLinear gives): only the offset −zp_src·comp changes."""
    if src_zero_point == packed.src_zero_point:
        return packed
    return replace(packed, src_zero_point=int(src_zero_point),
                   offset=(-int(src_zero_point) * packed.compensation).reshape(packed.offset.shape))


def exact_chunks(magnitudes: np.ndarray, limit: int) -> tuple[slice, ...]:
    """Cut K into slices with Σ_{k in slice} |W'[oc, k]| ≤ limit for every output channel oc.

    A partial sum within a slice is a sum of some of its products, so with |q_src| ≤ A and
    limit = 2^24 // A it is an integer of magnitude ≤ 2^24: exact in float32, in any order.
    Greedy, one slice after another, each as long as the bound allows (at least one column).
    """
    cumulative = np.concatenate([np.zeros((magnitudes.shape[0], 1), np.int64), np.cumsum(magnitudes, axis=1)], axis=1)
    k = magnitudes.shape[1]
    slices, start = [], 0
    while start < k:
        # Σ over [start, end) of each row, for every end: nondecreasing in end, so a search finds the cut.
        widest = (cumulative[:, start + 1:] - cumulative[:, start:start + 1]).max(axis=0)
        end = start + max(1, int(np.searchsorted(widest, limit, side="right")))
        slices.append(slice(start, end))
        start = end
    return tuple(slices) or (slice(0, 0),)


def conv_accumulate(src_q: np.ndarray, packed: PackedConv, exact_float: bool = False) -> np.ndarray:
    """acc[n, oc, o] = Σ (q_src − zp_src)·(q_wei − zp_wei) over the window, padding zp_src: int32 [N, OC, *out].

    int64 instead when K·max|q_src − zp_src|·max|W'| might exceed 2^31 − 1 (K = IC/groups·∏kernel).
    Whatever order a BLAS sums in, a partial sum of one output is a sum of some of its products
    q_src·W'[oc, k], so its magnitude is at most max|q_src|·Σ_k|W'[oc, k]|; the result
    (q_src − zp)·W' and the offset zp·comp are bounded by max|q_src − zp|·Σ_k|W'| the same way.
    K is cut where that bound would pass 2^24 (`exact_chunks`, at packing): trained weights, far
    below their maximum on average, allow slices in the thousands where the worst case
    max|q|·max|W'|·K would cut at 514. With `exact_float`, when the whole result fits 2^24, the
    accumulators come back as float32 holding the same integers: an f32 output stage reads them
    without two conversions. On MLAS (packed.int8_gemm) they are int32, laid out channels-last.
    """
    src_q = np.asarray(src_q)
    qmin, qmax = integer_range(src_q.dtype)
    if not qmin <= packed.src_zero_point <= qmax:
        raise ValueError(f"source zero point {packed.src_zero_point} is outside {src_q.dtype}")
    if src_q.ndim != 2 + len(packed.window.kernel) or src_q.shape[1] != packed.in_channels:
        raise ValueError(f"source of shape {src_q.shape} does not fit weights for {packed.in_channels} input channels")
    window, groups = packed.window.for_input(src_q.shape[2:]), packed.groups
    out_shape = window.output_shape(src_q.shape[2:])
    if packed.int8_gemm is not None:
        return _accumulate_channels_last(src_q, packed, window, out_shape)
    padded = window.padded(src_q, packed.src_zero_point)
    reduction = packed.weights.shape[2]
    src_bound = magnitude_bound(src_q.dtype)
    bound = reduction * deviation_bound(src_q.dtype, packed.src_zero_point) * packed.weight_bound
    sum_bound = max(src_bound, deviation_bound(src_q.dtype, packed.src_zero_point)) * packed.weight_abs_sum
    if reduction == window.taps and window.taps <= exact_chunk(src_bound, packed.weight_bound):
        raw = _depthwise(padded, packed.weights, window, out_shape)
    else:
        cols = _im2col(padded, window, out_shape, groups)
        chunks = packed.chunks[src_bound]
        if len(chunks) == 1 and sum_bound <= gemm.F32_EXACT_INTEGERS:
            acc = np.matmul(packed.weights, cols).reshape((src_q.shape[0], packed.out_channels) + out_shape)
            np.add(acc, packed.offset.astype(np.float32), out=acc)
            return acc if exact_float else acc.astype(accumulator_dtype(bound))
        raw = np.matmul(packed.weights[..., chunks[0]], cols[..., chunks[0], :]).astype(np.int64)
        for chunk in chunks[1:]:
            raw += np.matmul(packed.weights[..., chunk], cols[..., chunk, :]).astype(np.int64)
    acc = raw.reshape((src_q.shape[0], packed.out_channels) + out_shape) + packed.offset
    return acc.astype(accumulator_dtype(bound))


def _accumulate_channels_last(src_q: np.ndarray, packed: PackedConv, window: Window, out_shape) -> np.ndarray:
    """MLAS's Σ (q_src − zp_src)·W' over channels-last im2col rows: int32 [N, OC, *out], a view of [N, *out, OC].

    The im2col rows are gathered a block of output rows at a time, each block at most IM2COL_BYTES:
    whole, they would be taps·C bytes per output position (1.3 GB for one 3×3 128-channel layer of
    8 spectrograms of 900×161).
    """
    source, zero_point = as_unsigned(np.moveaxis(src_q, 1, -1), packed.src_zero_point)  # before im2col multiplies it
    source = window.padded(source, zero_point, channels_last=True)  # [N, *spatial, C]
    spatial_strides = source.strides[1:-1]
    taps = np.lib.stride_tricks.as_strided(
        source, shape=(source.shape[0],) + tuple(out_shape) + window.kernel + (source.shape[-1],),
        strides=(source.strides[0],) + tuple(st * s for st, s in zip(spatial_strides, window.strides))
        + tuple(st * d for st, d in zip(spatial_strides, window.dilations)) + (source.strides[-1],),
        writeable=False)
    reduction, batch = packed.int8_gemm.reduction, src_q.shape[0]
    positions = int(np.prod(out_shape[1:], dtype=np.int64))  # per output row
    block = max(1, IM2COL_BYTES // max(positions * reduction, 1))  # output rows per GEMM
    acc = np.empty((batch, out_shape[0], positions, packed.out_channels), np.int32)
    for n in range(batch):
        for start in range(0, out_shape[0], block):
            gathered = np.ascontiguousarray(taps[n, start:start + block]).reshape(-1, reduction)  # [rows, (taps, C)]
            acc[n, start:start + block] = packed.int8_gemm(gathered, zero_point).reshape(-1, positions,
                                                                                          packed.out_channels)
    return np.moveaxis(acc.reshape((batch,) + tuple(out_shape) + (packed.out_channels,)), -1, 1)


def _im2col(padded, window: Window, out_shape, groups: int) -> np.ndarray:
    """cols[n, g, (c, tap), p] = padded[n, c, o·stride + tap·dilation] as f32 [N, g, IC/g·taps, P]."""
    batch, channels = padded.shape[:2]
    source = padded.astype(np.float32)  # one conversion, then plain f32 copies per tap
    cols = np.empty((batch, channels, window.taps) + out_shape, dtype=np.float32)
    for tap, index in enumerate(window.tap_slices(out_shape)):
        cols[:, :, tap] = source[index]
    return cols.reshape(batch, groups, -1, int(np.prod(out_shape)))


def _depthwise(padded, weights, window: Window, out_shape):
    """Σ_tap padded[n, c, tap + o·stride] · W'[c, j, tap], one input channel per group, in f32: [N, C, OC/C, P]."""
    batch, channels = padded.shape[:2]
    source = padded.astype(np.float32)
    acc = np.zeros((batch, channels, weights.shape[1], int(np.prod(out_shape))), dtype=np.float32)
    for tap, index in enumerate(window.tap_slices(out_shape)):
        acc += source[index].reshape(batch, channels, 1, -1) * weights[None, :, :, tap, None]
    return acc.astype(np.int64)
