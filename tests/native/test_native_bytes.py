"""Route s16's direct kernel on bytes (lpt/native/s16.h: ByteWeights) against lpt's NumPy oracle, bit for bit.

LPT_S16_BYTES=1 makes every convolution and matmul it can run take it (the weights' pay-off aside), =0 none;
it is read when an operation is made, so each test sets it around the constructor."""

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
    if kind == "max":  # every pair 127 + 127: the most any high part takes
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
    """Whatever the weights (a high part in every block, or in few) and wherever the zero point lies (the
    spatial padding holds it), the accumulators are the reference's, in both layouts; the output stage too."""
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
    """Every product at its largest over 4096 inputs of a 1×1 layer, every pair of weights split into a high part:
    4096·255·128 is 2^31 / 16, far from wrapping. With a source of 0 and a zero point of 255, the whole sum is the
    zero point's term."""
    src = np.full((1, 4096, 3, 5), value, np.uint8)
    weights = np.full((20, 4096, 1, 1), weight, np.int8)
    zero_point = 255 - value
    with bytes_kernel("1"):
        conv = lpt.native.Conv(weights, src_zero_point=zero_point, route="s16", threads=2)
    got = conv.accumulate(src)
    assert conv.implementation == BYTES
    assert np.all(got == 4096 * (value - zero_point) * weight)


def test_by_default_the_bytes_run_where_few_blocks_have_a_high_part():
    """Without LPT_S16_BYTES, weights that never pair past 128 (within ±64) take the bytes; uniform ones, a high
    part in nearly every block, the int16 kernel; and =0 keeps the int16 kernel for any."""
    rng = np.random.default_rng(5)
    src = rng.integers(0, 256, (1, 64, 6, 6)).astype(np.uint8)
    small, uniform = rng.integers(-64, 65, (32, 64, 1, 1)).astype(np.int8), weights_of("uniform", rng, (32, 64, 1, 1))
    for weights, choice, implementation in ((small, None, BYTES), (uniform, None, INT16), (small, "0", INT16)):
        with bytes_kernel(choice):
            conv = lpt.native.Conv(weights, src_zero_point=7, route="s16", threads=1)
        assert np.array_equal(conv.accumulate(src), conv_reference(src, weights, 7))
        assert conv.implementation == implementation
