"""Route s16's direct kernel on bytes (lpt/native/s16.h: ByteWeights) against lpt's NumPy oracle, bit for bit.

LPT_S16_BYTES=1 makes every convolution and matmul it can run take it whatever its source (however much of it
lies outside the kernel's window), =0 none; it is read when an operation is made, so each test sets it around
the constructor."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lpt.native
from lpt.kernels import Relu
from lpt.kernels.output_stage import output_stage
from lpt.kernels.reference import conv_reference, matmul_reference

BYTES, INT16 = "lpt:s16_bytes_avx2", "lpt:s16_avx2"

# not on exact_routes(): a kernel on bytes that saturated would fail s16's probe, and these tests would skip
pytestmark = pytest.mark.skipif(lpt.native.available() and not lpt.native.engine.s16_supported(),
                                reason="this CPU has no AVX2, so it has no s16 route to run the kernel on bytes")


@contextlib.contextmanager
def bytes_kernel(choice: str | None):
    """LPT_S16_BYTES as `choice` (unset with None), and LPT_WINOGRAD=0 so that a 3×3 layer takes a direct kernel."""
    values = {"LPT_S16_BYTES": choice, "LPT_WINOGRAD": "0"}
    before = {name: os.environ.pop(name, None) for name in values}
    os.environ.update({name: value for name, value in values.items() if value is not None})
    try:
        yield
    finally:
        for name, value in before.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def weights_of(kind: str, rng, shape) -> np.ndarray:
    if kind == "uniform":
        return rng.integers(-128, 128, shape).astype(np.int8)
    if kind == "max":  # every pair 127 + 127: the largest sum of a pair
        return np.full(shape, 127, np.int8)
    if kind == "min":
        return np.full(shape, -128, np.int8)
    if kind == "ends":
        return rng.choice(np.array([-128, 127], np.int8), shape)
    g = rng.normal(size=shape)  # a trained layer's: each output channel's largest at ±127, most far below
    return np.round(127 * g / np.abs(g).reshape(shape[0], -1).max(1).reshape((-1,) + (1,) * (len(shape) - 1))).astype(np.int8)


@st.composite
def byte_cases(draw):
    """A convolution the kernel on bytes runs: one group, input channels a multiple of 4, dilation along rows only."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rank = draw(st.sampled_from([1, 2, 2]))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    strides = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    dilations = (draw(st.integers(1, 2)),) * (rank - 1) + (1,)
    pads = tuple(draw(st.integers(0, 2)) for _ in range(2 * rank))
    extents = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    spatial = tuple(max(draw(st.integers(2, 9)), e - pads[i] - pads[rank + i]) for i, e in enumerate(extents))
    in_channels, out_channels = 4 * draw(st.integers(1, 10)), draw(st.integers(1, 40))
    src_dtype = draw(st.sampled_from([np.uint8, np.int8]))
    info = np.iinfo(src_dtype)
    kind = draw(st.sampled_from(["uniform", "trained", "trained", "max", "min", "ends"]))
    weights = weights_of(kind, rng, (out_channels, in_channels) + kernel)
    src = rng.integers(info.min, int(info.max) + 1, (draw(st.integers(1, 2)), in_channels) + spatial).astype(src_dtype)
    if kind in ("max", "min", "ends"):
        src[:] = draw(st.sampled_from([info.min, info.max]))
    if draw(st.booleans()):  # channels-last, seen as [N, C, *spatial]
        src = np.moveaxis(np.ascontiguousarray(np.moveaxis(src, 1, -1)), -1, 1)
    zero_point = draw(st.sampled_from([0, int(info.min), int(info.max), int(rng.integers(info.min, info.max + 1))]))
    return src, weights, zero_point, dict(strides=strides, dilations=dilations, pads=pads), rng


@given(case=byte_cases())
@settings(max_examples=80, deadline=None)
def test_accumulators_and_output_stage_on_bytes_equal_the_reference(case):
    """Whatever the weights and wherever the zero point lies (the spatial padding holds it), with the kernel on
    bytes forced (LPT_S16_BYTES=1: half of a uniform source lies outside its window, and every value of a source
    at an extreme may), the accumulators are the reference's, in both layouts; the output stage too."""
    src, weights, zero_point, window, rng = case
    stage = dict(multiplier=rng.uniform(1e-5, 1e-4, len(weights)).astype(np.float32),
                 bias=rng.normal(0, 1, len(weights)).astype(np.float32), post_ops=(Relu(),),
                 dst_scale=np.float32(0.05), dst_zero_point=np.int32(4))
    with bytes_kernel("1"):
        conv = lpt.native.Conv(weights, src_zero_point=zero_point, route="s16", threads=2, dst_dtype=np.uint8,
                               **stage, **window)
    expected = conv_reference(src, weights, zero_point, **window)
    assert np.array_equal(conv.accumulate(src), expected)
    if expected[0, 0].size > 1:  # one position per image runs the int16 kernel's row tiles
        assert conv.implementation == BYTES
    assert np.array_equal(conv.accumulate(src, channels_last=True), expected)
    levels = output_stage(expected.astype(np.int32), qmin=0, qmax=255, **stage)
    assert np.array_equal(conv(src), levels)


@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 80).map(lambda q: 4 * q), n=st.integers(1, 40),
       rows=st.integers(2, 30), signed=st.booleans())
@settings(max_examples=40, deadline=None)
def test_a_matmul_on_bytes_equals_the_reference(seed, k, n, rows, signed):
    rng = np.random.default_rng(seed)
    dtype = np.int8 if signed else np.uint8
    info = np.iinfo(dtype)
    src = rng.integers(info.min, int(info.max) + 1, (rows, k)).astype(dtype)
    weights = weights_of(rng.choice(["uniform", "trained"]), rng, (n, k)).T.copy()
    zero_point = int(rng.integers(info.min, info.max + 1))
    with bytes_kernel("1"):
        matmul = lpt.native.MatMul(weights, src_zero_point=zero_point, route="s16", threads=2)
    assert np.array_equal(matmul.accumulate(src), matmul_reference(src, zero_point, weights, 0))
    assert matmul.implementation == BYTES


@pytest.mark.parametrize("value, weight", [(255, -128), (255, 127), (0, -128)])
def test_the_largest_sums_on_bytes(value, weight):
    """Every product at its largest over 4096 inputs of a 1×1 layer, every value outside the window (255 with a zero
    point of 0: 128 above it, in r 127 and 128 added back): 4096·255·128 is 2^31 / 16, far from wrapping. With a
    source of 0 and a zero point of 255, the whole sum is the zero point's term."""
    src = np.full((1, 4096, 3, 5), value, np.uint8)
    weights = np.full((20, 4096, 1, 1), weight, np.int8)
    zero_point = 255 - value
    with bytes_kernel("1"):
        conv = lpt.native.Conv(weights, src_zero_point=zero_point, route="s16", threads=2)
    got = conv.accumulate(src)
    assert conv.implementation == BYTES
    assert np.all(got == 4096 * (value - zero_point) * weight)


def windowed_source(rng, shape, zero_point: int, outliers: int) -> np.ndarray:
    """uint8 values within 60 of the zero point (as a trained layer's activations mostly are), and `outliers` of
    them at 0 or 255, in different rows."""
    src = np.clip(zero_point + rng.integers(-60, 61, shape), 0, 255).astype(np.uint8)
    flat = src.reshape(-1)
    flat[rng.choice(flat.size, outliers, replace=False)] = rng.choice(np.array([0, 255], np.uint8), outliers)
    return src


@pytest.mark.parametrize("zero_point", [0, 7, 128, 200, 255])
def test_by_default_the_bytes_run_where_the_source_lies_within_their_window(zero_point):
    """Without LPT_S16_BYTES, a source with a few values outside the window (at 0 or 255, beyond 64 levels from
    the zero point) takes the bytes, those values added back one by one; a uniform one, half outside, the int16
    kernel; and =0 keeps the int16 kernel for any. The accumulators are the reference's each time."""
    rng = np.random.default_rng(zero_point)
    weights = weights_of("uniform", rng, (40, 64, 3, 3))
    mostly = windowed_source(rng, (2, 64, 12, 12), zero_point, outliers=20)
    uniform = rng.integers(0, 256, (2, 64, 12, 12)).astype(np.uint8)
    for src, choice, implementation in ((mostly, None, BYTES), (uniform, None, INT16), (mostly, "0", INT16)):
        with bytes_kernel(choice):
            conv = lpt.native.Conv(weights, src_zero_point=zero_point, pads=(1, 1, 1, 1), strides=(1, 2), route="s16",
                                   threads=2)
        for channels_last in (False, True):
            got = conv.accumulate(src, channels_last=channels_last)
            assert conv.implementation == implementation
            assert np.array_equal(got, conv_reference(src, weights, zero_point, pads=(1, 1, 1, 1), strides=(1, 2)))


def test_a_row_with_too_many_values_outside_the_window_runs_the_int16_kernel():
    """Under 1/128 of the whole source outside the window, but all in one row, beyond that row's room (1/64 of it):
    the int16 kernel, exact."""
    rng = np.random.default_rng(3)
    weights = weights_of("trained", rng, (16, 32, 1, 1))
    src = windowed_source(rng, (1, 32, 40, 40), 10, outliers=0)
    src[0, :, 5, :2] = 255  # 64 of row 5's 1280 values: 1/20 of the row, 1/800 of the source
    with bytes_kernel(None):
        conv = lpt.native.Conv(weights, src_zero_point=10, route="s16", threads=1)
    assert np.array_equal(conv.accumulate(src), conv_reference(src, weights, 10))
    assert conv.implementation == INT16
    src[0, :, 5, 1], src[0, 16:, 5, 0] = 20, 20  # 16 of them, within the row's room
    assert np.array_equal(conv.accumulate(src), conv_reference(src, weights, 10))
    assert conv.implementation == BYTES


@pytest.mark.parametrize("out_channels", [1, 4, 8, 24, 40])
def test_eight_channels_or_fewer_take_the_bytes_in_half_tiles(out_channels):
    """A layer of at most 8 output channels, or whose last block of 16 has at most 8 valid, computes them in half
    tiles (ten positions × 8 channels): by default on the bytes like any other, over 63 positions (six whole tiles
    and a part of one), its accumulators and its output stage the reference's."""
    rng = np.random.default_rng(out_channels)
    weights = weights_of("trained", rng, (out_channels, 16, 3, 3))
    src = windowed_source(rng, (1, 16, 7, 9), 100, outliers=3)
    stage = dict(multiplier=rng.uniform(1e-4, 1e-3, out_channels).astype(np.float32),
                 bias=rng.normal(0, 1, out_channels).astype(np.float32), post_ops=(Relu(),),
                 dst_scale=np.float32(0.05), dst_zero_point=np.int32(4))
    with bytes_kernel(None):
        conv = lpt.native.Conv(weights, src_zero_point=100, pads=(1, 1, 1, 1), route="s16", threads=2,
                               dst_dtype=np.uint8, **stage)
    expected = conv_reference(src, weights, 100, pads=(1, 1, 1, 1))
    assert np.array_equal(conv.accumulate(src), expected)
    assert conv.implementation == BYTES
    assert np.array_equal(conv(src), output_stage(expected.astype(np.int32), qmin=0, qmax=255, **stage))
