"""lpt's depthwise kernel on AVX-512 VNNI (lpt/native/depthwise.cpp) against lpt's NumPy oracle, bit for bit. Each
case runs on the route this process takes: where the CPU has no AVX-512 VNNI and VBMI (a Zen 3, or LPT_AVX512=off,
or a forced LPT_ONEDNN=s16) the kernel is not used, and oneDNN's primitive or lpt's s16 kernel runs the same cases
and must give the same bits. LPT_DEPTHWISE=1 gives the kernel every depthwise layer it fits, 0 none; it is read
when an operation is made, so each test sets it around the constructor."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lpt.native
from lpt.kernels import Clip, LeakyRelu, Relu, Sigmoid
from lpt.kernels.output_stage import output_stage
from lpt.kernels.reference import conv_reference

DEPTHWISE = "lpt:depthwise_avx512_vnni"


@contextlib.contextmanager
def depthwise_kernel(choice: str | None):
    """LPT_DEPTHWISE as `choice` (unset with None)."""
    before = os.environ.pop("LPT_DEPTHWISE", None)
    if choice is not None:
        os.environ["LPT_DEPTHWISE"] = choice
    try:
        yield
    finally:
        os.environ.pop("LPT_DEPTHWISE", None)
        if before is not None:
            os.environ["LPT_DEPTHWISE"] = before


def depthwise(weights, **arguments):
    return lpt.native.Conv(weights, groups=weights.shape[0], threads=2, **arguments)


def runs_here() -> bool:
    """Whether this process takes the kernel: a 5×5 depthwise layer into 8 bits, on a CPU with AVX-512 VNNI and VBMI."""
    conv = depthwise(np.ones((16, 1, 5, 5), np.int8), pads=(2, 2, 2, 2), dst_scale=0.5, dst_dtype=np.uint8)
    conv(np.zeros((1, 16, 6, 6), np.uint8), channels_last=True)
    return lpt.native.engine.implementation(conv._operation) == DEPTHWISE


@st.composite
def depthwise_cases(draw):
    """A depthwise convolution without dilation (1-D or 2-D) and a source for it."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rank = draw(st.sampled_from([1, 2, 2, 2]))
    kernel = tuple(draw(st.integers(1, 9)) for _ in range(rank))
    channels = draw(st.sampled_from([2, 5, 16, 24, 40, 64, 70]))  # partial blocks of sixteen, one and several
    strides = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    pads = tuple(draw(st.integers(0, 4)) for _ in range(2 * rank))
    spatial = tuple(max(draw(st.integers(1, 14)), k - pads[i] - pads[rank + i]) for i, k in enumerate(kernel))
    dtype = draw(st.sampled_from([np.uint8, np.int8]))
    info = np.iinfo(dtype)
    src = rng.integers(info.min, int(info.max) + 1, (draw(st.integers(1, 2)), channels) + spatial).astype(dtype)
    weights = rng.integers(-128, 128, (channels, 1) + kernel).astype(np.int8)
    if draw(st.booleans()):  # the largest products: every tap at its extreme
        src[:] = info.max if draw(st.booleans()) else info.min
        weights[0], weights[-1] = 127, -128
    zero_point = draw(st.sampled_from([0, int(info.min), int(info.max), int(rng.integers(info.min, info.max + 1))]))
    return src, weights, zero_point, dict(strides=strides, pads=pads), rng


STAGES = [
    dict(post_ops=(), dst_dtype=np.uint8, dst_zero_point=7),  # levels in registers
    dict(post_ops=(Relu(),), dst_dtype=np.uint8, dst_zero_point=0),
    dict(post_ops=(Clip(0.0, 6.0),), dst_dtype=np.uint8, dst_zero_point=0),
    dict(post_ops=(LeakyRelu(0.1),), dst_dtype=np.int8, dst_zero_point=-3),  # a slope: the reference's levels
    dict(post_ops=(), dst_dtype=None, dst_zero_point=0),  # float32 in registers
    dict(post_ops=(Relu(),), dst_dtype=None, dst_zero_point=0),  # float32 through lpt_s16's stage
    dict(post_ops=(Sigmoid(),), dst_dtype=np.uint8, dst_zero_point=0),  # 8 bits through lpt_s16's stage
]


def one_margin_multipliers(weights, dst_scale, rng) -> np.ndarray:
    """Multipliers small enough for one margin to serve every value (prepare_clipped_levels), so that the stage's
    fused levels need no bound per lane: each channel's largest accumulator at 200-1000 levels."""
    largest = 255.0 * np.abs(weights.reshape(weights.shape[0], -1).astype(np.float64)).sum(axis=1)
    return (rng.uniform(200, 1000, weights.shape[0]) * float(dst_scale) / np.maximum(largest, 1)).astype(np.float32)


def expected_and_conv(src, weights, zero_point, window, stage, multiplier, bias, choice="1"):
    dst_scale = stage.get("dst_scale")
    with depthwise_kernel(choice):
        conv = depthwise(weights, src_zero_point=zero_point, multiplier=multiplier, bias=bias,
                         post_ops=stage["post_ops"], dst_scale=dst_scale, dst_zero_point=stage["dst_zero_point"],
                         dst_dtype=stage["dst_dtype"], **window)
    acc = conv_reference(src, weights, zero_point, groups=weights.shape[0], **window)
    limits = np.iinfo(stage["dst_dtype"] or np.uint8)
    expected = output_stage(acc, multiplier, bias, stage["post_ops"], dst_scale=dst_scale,
                            dst_zero_point=stage["dst_zero_point"], qmin=int(limits.min), qmax=int(limits.max))
    return expected, conv


def same_bits(got, expected) -> bool:
    return got.dtype == expected.dtype and np.array_equal(np.ascontiguousarray(got).view(np.uint8),
                                                          np.ascontiguousarray(expected).view(np.uint8))


@given(case=depthwise_cases(), stage=st.sampled_from(STAGES), channels_last=st.booleans(), one_margin=st.booleans(),
       biased=st.booleans())
@settings(max_examples=150, deadline=None)
def test_the_output_stage_equals_the_reference(case, stage, channels_last, one_margin, biased):
    """Any kernel to 9 × 9, strides, pads holding the zero point, partial blocks of sixteen channels, signed
    sources, every kind of output stage (levels in registers, fused with and without a bound per lane, or the
    reference's; float32; others through lpt_s16's stage), either layout of the source; the output channels-last,
    as programs take it."""
    src, weights, zero_point, window, rng = case
    # signs mixed (a folded batch norm's), so that an accumulator of 0 gives −0 where there is no bias
    multiplier = (rng.uniform(1e-4, 4e-3, len(weights)) * rng.choice([-1, 1], len(weights))).astype(np.float32)
    bias = rng.normal(0, 1, len(weights)).astype(np.float32) if biased else None
    stage = dict(stage, dst_scale=None if stage["dst_dtype"] is None else np.float32(rng.uniform(0.01, 0.2)))
    if one_margin and stage["dst_scale"] is not None:
        multiplier = np.copysign(one_margin_multipliers(weights, stage["dst_scale"], rng), multiplier)
    if channels_last:
        src = np.moveaxis(np.ascontiguousarray(np.moveaxis(src, 1, -1)), -1, 1)
    expected, conv = expected_and_conv(src, weights, zero_point, window, stage, multiplier, bias)
    assert same_bits(conv(src, channels_last=True), expected)
    if runs_here():
        assert lpt.native.engine.implementation(conv._operation) == DEPTHWISE


@pytest.mark.parametrize("kernel, spatial, implemented", [((3, 3), (23, 30), False), ((1, 5), (23, 30), False),
                                                           ((5, 5), (23, 30), True), ((7, 7), (23, 30), True),
                                                           ((3, 3), (4, 9), True), ((1, 7), (1, 40), True)])
def test_by_default_the_kernel_takes_large_kernels_and_small_layers(kernel, spatial, implemented):
    """Without LPT_DEPTHWISE, a 3×3 or 1×5 layer of 0.3-0.6 M products stays on oneDNN (as fast there), a 5×5 or 7×7
    takes the kernel, and so does a layer under 2^17 products (oneDNN's fixed cost: 31 104 and 26 880 here); =0 keeps
    oneDNN for any. 96 channels, as PaddleOCR's detector's 7×7 layers, an 8-bit destination."""
    rng = np.random.default_rng(kernel[0])
    weights = rng.integers(-128, 128, (96, 1) + kernel).astype(np.int8)
    src = rng.integers(0, 256, (1, 96) + spatial).astype(np.uint8)
    stage = dict(post_ops=(), dst_dtype=np.uint8, dst_zero_point=128, dst_scale=np.float32(0.05))
    window = dict(pads=(kernel[0] // 2, kernel[1] // 2) * 2)
    multiplier = one_margin_multipliers(weights, stage["dst_scale"], rng)
    for choice, takes in ((None, implemented), ("0", False)):
        expected, conv = expected_and_conv(src, weights, 100, window, stage, multiplier, None, choice)
        assert same_bits(conv(src, channels_last=True), expected)
        if runs_here():
            assert (lpt.native.engine.implementation(conv._operation) == DEPTHWISE) == takes


def test_bands_of_rows_on_two_threads():
    """A source wide enough that the quad rows of one block split its output rows into bands (160 kB each), and two
    images: every band's rows and each thread's tasks, against the reference."""
    rng = np.random.default_rng(11)
    weights = rng.integers(-128, 128, (40, 1, 7, 7)).astype(np.int8)
    src = rng.integers(0, 256, (2, 40, 61, 190)).astype(np.uint8)
    stage = dict(post_ops=(Relu(),), dst_dtype=np.uint8, dst_zero_point=0, dst_scale=np.float32(0.1))
    multiplier = one_margin_multipliers(weights, stage["dst_scale"], rng)
    bias = rng.normal(0, 1, 40).astype(np.float32)
    expected, conv = expected_and_conv(src, weights, 37, dict(pads=(3, 3, 3, 3), strides=(1, 2)), stage, multiplier,
                                       bias)
    assert same_bits(conv(src, channels_last=True), expected)
