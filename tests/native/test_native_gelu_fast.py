"""The GELU output stage's approximation (lpt/native/gelu512.h with AVX-512, gelu256.h with AVX2 and FMA, which
LPT_AVX512=off forces on any CPU): within its bound for every float32 it may see, and the stage's levels those of
lpt's NumPy stage where values lie next to a half, where it takes the reference."""

from __future__ import annotations

import numpy as np
import pytest

import lpt.native
from lpt.kernels import Gelu
from lpt.kernels.output_stage import output_stage
from lpt.kernels.reference import conv_reference

from tests.native.test_native_conv import ROUTES, same_bits

CHECKED_BELOW = 0x7E800000  # the bits of 2^126: gelu512.h's GELU_FAST_CHECKED_BELOW


@pytest.mark.parametrize("first, last", [(0, CHECKED_BELOW), (0x80000000, 0x80000000 + CHECKED_BELOW)],
                         ids=["positive", "negative"])
def test_the_approximation_is_within_its_bound_for_every_float32_below_2_126(first, last):
    """Every float32 x with |x| < 2^126 (zeros, subnormals and all): |fast(x) − reference(x)| at most
    GELU_FAST_ABS + GELU_FAST_PER_U·u (GELU_FAST8_ABS and _PER_U for the eight-lane one), the bound the stage's
    test for values next to a half relies on."""
    try:
        ratio, x = lpt.native.engine.gelu_fast_worst_ratio(first, last, 2)
    except RuntimeError as err:
        # Neither AVX-512 nor AVX2 with FMA here: the stage never takes an approximation there, every level is
        # computed by the reference's operations, so there is no bound to check.
        pytest.skip(f"{err}: this process's GELU stage computes every level by the reference")
    assert ratio < 1, f"the approximation is {ratio:.3f} of its bound at x = {x!r}"


@pytest.mark.parametrize("route", ROUTES)
def test_levels_next_to_a_half_are_the_references(route):
    """A 1×1 convolution of one channel through 4096 output channels of random multipliers and biases: a
    million GELU values, hundreds of them within 1e-4 of a half of a level, where an approximation of a few
    ulp would round the other way were they not computed again. Each level is lpt's NumPy stage's."""
    rng = np.random.default_rng(2026)
    channels, scale, zero_point = 4096, np.float32(0.003), 40
    weights = rng.choice(np.array([-3, -2, -1, 1, 2, 3], np.int8), (channels, 1, 1, 1))
    multiplier = rng.uniform(1e-3, 0.03, channels).astype(np.float32)
    bias = rng.uniform(-2.0, 0.5, channels).astype(np.float32)
    src = np.arange(256, dtype=np.uint8).reshape(1, 1, 16, 16)
    gelu = Gelu(1.4142135, 1.0, 0.5)
    conv = lpt.native.Conv(weights, src_zero_point=128, multiplier=multiplier, bias=bias, post_ops=(gelu,),
                           dst_scale=scale, dst_zero_point=zero_point, dst_dtype=np.uint8, route=route, threads=2)
    acc = conv_reference(src, weights, 128).astype(np.int32)
    expected = output_stage(acc, multiplier, bias, (gelu,), scale, np.int32(zero_point), 0, 255)

    x = acc.astype(np.float32) * multiplier[None, :, None, None] + bias[None, :, None, None]
    levels = gelu.apply(x) / scale
    near = np.abs(np.abs(levels - np.floor(levels)) - np.float32(0.5)) < 1e-4
    unclamped = (levels > -zero_point) & (levels < 255 - zero_point)
    assert (near & unclamped).sum() > 50  # the case this test is for, many times over
    assert same_bits(conv(src), expected)
    assert same_bits(np.ascontiguousarray(conv(src, channels_last=True)), expected)
