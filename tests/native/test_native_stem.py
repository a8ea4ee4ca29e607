"""lpt's kernel for convolutions with few products per output (lpt/native/stem.cpp: a spectrogram's one channel,
an image's three) against lpt's NumPy oracle, bit for bit. Each case runs on the route this process takes: where
the CPU has no AVX-512 VNNI (a Zen 3, or LPT_AVX512=off, or a forced LPT_ONEDNN=s16) the kernel is not used, and
oneDNN's primitive or lpt's s16 kernel runs the same cases and must give the same bits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lpt.native
from lpt.kernels import Clip, LeakyRelu, Relu, Sigmoid
from lpt.kernels.output_stage import output_stage
from lpt.kernels.reference import conv_reference

STEM = "lpt:stem_avx512_vnni"


def runs_here() -> bool:
    """Whether this process takes the kernel: a conv that fits it, on a CPU with AVX-512 VNNI."""
    conv = lpt.native.Conv(np.ones((4, 1, 3, 3), np.int8), pads=(1, 1, 1, 1), dst_scale=0.5, dst_dtype=np.uint8)
    conv(np.zeros((1, 1, 4, 4), np.uint8), channels_last=True)
    return lpt.native.engine.implementation(conv._operation) == STEM


@st.composite
def stem_cases(draw):
    """A 2-D convolution of 1-3 input channels whose kernel rows fit the kernel's words, and a source for it."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    channels = draw(st.integers(1, 3))
    kernel_w = draw(st.integers(1, 16 // channels))
    kernel_h = draw(st.integers(1, max(1, 31 // (channels * kernel_w))))
    out_channels = draw(st.sampled_from([1, 5, 16, 24, 33, 64, 128]))  # 64, 128: four blocks at once
    strides = (draw(st.integers(1, 2)), draw(st.integers(1, 3)))
    dilations = (draw(st.integers(1, 2)), 1)
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    spatial = tuple(max(draw(st.integers(1, 13)), d * (k - 1) + 1 - pads[i] - pads[2 + i])
                    for i, (k, d) in enumerate(zip((kernel_h, kernel_w), dilations)))
    dtype = draw(st.sampled_from([np.uint8, np.int8]))
    info = np.iinfo(dtype)
    src = rng.integers(info.min, int(info.max) + 1, (draw(st.integers(1, 2)), channels) + spatial).astype(dtype)
    weights = rng.integers(-128, 128, (out_channels, channels, kernel_h, kernel_w)).astype(np.int8)
    if draw(st.booleans()):  # the largest products: every tap at its extreme
        src[:] = info.max if draw(st.booleans()) else info.min
        weights[0], weights[-1] = 127, -128
    zero_point = draw(st.sampled_from([0, int(info.min), int(info.max), int(rng.integers(info.min, info.max + 1))]))
    window = dict(strides=strides, dilations=dilations, pads=pads)
    return src, weights, zero_point, window, rng


STAGES = [  # own: the kernel takes the layer (stem.h: fits)
    dict(post_ops=(), dst_dtype=np.uint8, dst_zero_point=7, own=True),
    dict(post_ops=(Relu(),), dst_dtype=np.uint8, dst_zero_point=0, own=True),
    dict(post_ops=(Clip(0.0, 6.0),), dst_dtype=np.uint8, dst_zero_point=0, own=True),
    dict(post_ops=(LeakyRelu(0.1),), dst_dtype=np.int8, dst_zero_point=-3, own=True),
    dict(post_ops=(Relu(),), dst_dtype=np.int8, dst_zero_point=-100, own=True),  # the Relu as the levels' bound
    dict(post_ops=(Sigmoid(),), dst_dtype=np.uint8, dst_zero_point=0, own=False),
    dict(post_ops=(Relu(),), dst_dtype=None, dst_zero_point=0, own=False),  # a float32 destination
]


def one_margin_multipliers(weights, dst_scale, rng) -> np.ndarray:
    """Multipliers small enough for one margin to serve every value (prepare_clipped_levels: 6u·|acc|·|m / s| at
    most 2^-10 with |acc| at its largest, Σ|w|·255), so the kernel takes the fused stage: each channel's largest
    accumulator at 200-1000 levels."""
    largest = 255.0 * np.abs(weights.reshape(weights.shape[0], -1).astype(np.float64)).sum(axis=1)
    return (rng.uniform(200, 1000, weights.shape[0]) * float(dst_scale) / np.maximum(largest, 1)).astype(np.float32)


@given(case=stem_cases(), stage=st.sampled_from(STAGES), channels_last=st.booleans(), one_margin=st.booleans())
@settings(max_examples=150, deadline=None)
def test_the_output_stage_equals_the_reference(case, stage, channels_last, one_margin):
    """Pads holding the zero point, strides, a dilated height, partial blocks of sixteen channels, signed
    sources, every output stage the kernel applies (and two it leaves to oneDNN or s16), the fused stage and the
    reference's, either layout of the source; the output channels-last, as programs take it."""
    src, weights, zero_point, window, rng = case
    multiplier = rng.uniform(1e-4, 4e-3, weights.shape[0]).astype(np.float32)
    bias = rng.normal(0, 1, weights.shape[0]).astype(np.float32)
    dst_scale = None if stage["dst_dtype"] is None else np.float32(rng.uniform(0.01, 0.2))
    if one_margin and dst_scale is not None:
        multiplier = one_margin_multipliers(weights, dst_scale, rng)
    conv = lpt.native.Conv(weights, src_zero_point=zero_point, multiplier=multiplier, bias=bias,
                           post_ops=stage["post_ops"], dst_scale=dst_scale, dst_zero_point=stage["dst_zero_point"],
                           dst_dtype=stage["dst_dtype"], threads=2, **window)
    if channels_last:
        src = np.moveaxis(np.ascontiguousarray(np.moveaxis(src, 1, -1)), -1, 1)
    acc = conv_reference(src, weights, zero_point, **window)
    limits = np.iinfo(stage["dst_dtype"] or np.uint8)
    expected = output_stage(acc, multiplier, bias, stage["post_ops"], dst_scale=dst_scale,
                            dst_zero_point=stage["dst_zero_point"], qmin=int(limits.min), qmax=int(limits.max))
    got = conv(src, channels_last=True)
    assert got.dtype == expected.dtype and np.array_equal(np.ascontiguousarray(got).view(np.uint8),
                                                          np.ascontiguousarray(expected).view(np.uint8))
    if runs_here():
        own = stage["own"] and not over_phases(src.shape, weights.shape, window)
        assert (lpt.native.engine.implementation(conv._operation) == STEM) == own


def over_phases(source_shape, weights_shape, window) -> bool:
    """Whether the engine runs the layer as a convolution over phases of its source instead (prepare_polyphase:
    one channel, a window of 16 taps or more along the last axis only, few output channels; run_polyphase: a
    source of one row)."""
    out_channels, _, kernel_h, kernel_w = weights_shape
    return (source_shape[1] == 1 and source_shape[2] == 1 and out_channels <= 8 and kernel_h == 1 and kernel_w >= 16
            and window["strides"][0] == 1 and window["pads"][0] == window["pads"][2] == 0)


def test_a_spectrogram_stem_over_many_rows_on_two_threads():
    """dnsmos_sig_bak_ovr's first layer's shape (1 → 128 channels, 3×3, over 900 × 161 here cut to 60 rows):
    rows split among threads, eight blocks of channels, a Relu and a u8 destination; its fused stage (one margin for
    every value), as the model's weights and scales give it, four blocks at a time."""
    rng = np.random.default_rng(5)
    weights = rng.integers(-128, 128, (128, 1, 3, 3)).astype(np.int8)
    src = rng.integers(0, 256, (1, 1, 60, 161)).astype(np.uint8)
    multiplier = one_margin_multipliers(weights, 0.03, rng)
    bias = rng.normal(0, 0.5, 128).astype(np.float32)
    window = dict(pads=(1, 1, 1, 1))
    conv = lpt.native.Conv(weights, src_zero_point=12, multiplier=multiplier, bias=bias, post_ops=(Relu(),),
                           dst_scale=np.float32(0.03), dst_zero_point=0, dst_dtype=np.uint8, threads=2,
                           **window)
    expected = output_stage(conv_reference(src, weights, 12, **window), multiplier, bias, (Relu(),),
                            dst_scale=np.float32(0.03), dst_zero_point=0)
    np.testing.assert_array_equal(conv(src, channels_last=True), expected)


@pytest.mark.parametrize("channels, kernel, stride, pads", [(1, 15, 1, (7, 7)), (2, 8, 3, (0, 2)), (1, 3, 2, (1, 1))])
def test_one_dimensional_stems(channels, kernel, stride, pads):
    """1-D convolutions (one kernel row: kernel_h 1), an s8 source and destination, up to 16 bytes a row."""
    rng = np.random.default_rng(kernel)
    weights = rng.integers(-128, 128, (20, channels, kernel)).astype(np.int8)
    src = rng.integers(-128, 128, (2, channels, 300)).astype(np.int8)
    multiplier = rng.uniform(1e-4, 1e-3, 20).astype(np.float32)
    bias = rng.normal(0, 0.5, 20).astype(np.float32)
    window = dict(strides=(stride,), pads=pads)
    conv = lpt.native.Conv(weights, src_zero_point=-5, multiplier=multiplier, bias=bias, post_ops=(Relu(),),
                           dst_scale=np.float32(0.02), dst_zero_point=-128, dst_dtype=np.int8, threads=2,
                           **window)
    expected = output_stage(conv_reference(src, weights, -5, **window), multiplier, bias, (Relu(),),
                            dst_scale=np.float32(0.02), dst_zero_point=-128, qmin=-128, qmax=127)
    np.testing.assert_array_equal(conv(src, channels_last=True), expected)
    if runs_here():
        assert lpt.native.engine.implementation(conv._operation) == STEM


@pytest.mark.parametrize("post_ops, dst_dtype, dst_zero_point", [((), np.uint8, 7), ((Relu(),), np.int8, -100),
                                                                  ((Clip(0.0, 6.0),), np.uint8, 0)])
@pytest.mark.parametrize("out_channels, largest_weight", [(24, 3), (64, 2)])  # 64, |w| ≤ 2: four_blocks' fused stage
def test_every_odd_accumulator_a_tie(post_ops, dst_dtype, dst_zero_point, out_channels, largest_weight):
    """x = acc / 2 at a scale of 1: every odd accumulator's level is a tie, which the kernel takes from the quotient
    (rounded half to even), and the rest from the product; small weights keep most levels inside the range."""
    rng = np.random.default_rng(3)
    weights = rng.integers(-largest_weight, largest_weight + 1, (out_channels, 1, 3, 3)).astype(np.int8)
    src = rng.integers(0, 40, (1, 1, 20, 33)).astype(np.uint8)
    multiplier = np.full(out_channels, 0.5, np.float32)
    window = dict(pads=(1, 1, 1, 1))
    conv = lpt.native.Conv(weights, src_zero_point=20, multiplier=multiplier, post_ops=post_ops,
                           dst_scale=np.float32(1.0), dst_zero_point=dst_zero_point, dst_dtype=dst_dtype, threads=2,
                           **window)
    acc = conv_reference(src, weights, 20, **window)
    assert 0.3 < np.count_nonzero(acc % 2) / acc.size
    limits = np.iinfo(dst_dtype)
    expected = output_stage(acc, multiplier, None, post_ops, dst_scale=np.float32(1.0), dst_zero_point=dst_zero_point,
                            qmin=int(limits.min), qmax=int(limits.max))
    np.testing.assert_array_equal(conv(src, channels_last=True), expected)
    if runs_here():
        assert lpt.native.engine.implementation(conv._operation) == STEM
