"""A convolution and the max pool after it in one pass on route s16 (lpt/native/_engine.cpp: pools_layer,
pool_in_stage; s16.cpp: convolve_pooled_staged): each window's largest accumulators staged, against the layer and
lpt's NumPy max pool run one after the other, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lpt.native
from lpt.kernels import Clip, LeakyRelu, Relu, Sigmoid
from lpt.kernels.pooling import max_pool_q
from lpt.native.program import Program

pytestmark = pytest.mark.skipif(lpt.native.available() and not lpt.native.engine.s16_supported(),
                                reason="this CPU has no AVX2, so it has no s16 route to pool in the stage on")

POOLED = "lpt:s16_avx2_pooled"
STAGES = [  # ordered: whether each level keeps the accumulators' order, so that the pool joins the stage
    dict(post_ops=(Relu(),), ordered=True),
    dict(post_ops=(), ordered=True),
    dict(post_ops=(Clip(-1.0, 2.0),), ordered=True),
    dict(post_ops=(LeakyRelu(0.1),), ordered=True),
    dict(post_ops=(LeakyRelu(-0.5),), ordered=False),  # a negative slope reverses the order below 0
    dict(post_ops=(Sigmoid(),), ordered=False),  # not a clip: the layer and the pool run apart
]


def layer_then_pool(src, conv, pool):
    """What the program of the two instructions computes, the implementation that ran its layer, and what the
    two compute one after the other."""
    window = (pool, pool, (1, 1), (0, 0, 0, 0))
    program = Program([("layer", ["q"], "y", conv.instruction[1]), ("max_pool", ["y"], "p", window)], ["q"], ["p"],
                      threads=2)
    [got] = program(src)
    implementation = lpt.native.engine.implementation(conv._operation)
    return got, implementation, max_pool_q(conv(src), pool, pool, (0, 0, 0, 0), (1, 1))


@given(seed=st.integers(0, 2**32 - 1), stage=st.sampled_from(STAGES), dst=st.sampled_from([np.uint8, np.int8]),
       pool=st.sampled_from([(2, 2), (1, 4), (2, 1), (3, 3), (2, 3)]), negative=st.booleans())
@settings(max_examples=60, deadline=None)
def test_the_pooled_stage_equals_the_layer_then_the_pool(seed, stage, dst, pool, negative):
    """Sources of 1 to 5 channels (the stem's one; odd counts read whole), 1 to 40 output channels (partial and
    half blocks of 16), kernels of 1 to 3 with strides, pads and a dilated height, sizes that leave a partial
    window to drop; a channel with a negative multiplier (levels in the reverse order: not pooled in the stage)."""
    rng = np.random.default_rng(seed)
    channels, out_channels = int(rng.integers(1, 6)), int(rng.choice([1, 5, 8, 16, 24, 33, 40]))
    kernel = tuple(int(k) for k in rng.integers(1, 4, 2))
    strides, dilations = (int(rng.integers(1, 3)), int(rng.integers(1, 3))), (int(rng.integers(1, 3)), 1)
    pads = tuple(int(p) for p in rng.integers(0, 2, 4))
    # at least two windows along each axis, and up to a few positions more
    size = tuple((2 * p - 1) * s + d * (k - 1) + 1 + int(rng.integers(0, 8))
                 for p, s, d, k in zip(pool, strides, dilations, kernel))
    src = rng.integers(0, 256, (int(rng.integers(1, 3)), channels) + size).astype(np.uint8)
    weights = rng.integers(-128, 128, (out_channels, channels) + kernel).astype(np.int8)
    multiplier = rng.uniform(1e-3, 1e-2, out_channels).astype(np.float32)
    if negative:
        multiplier[-1] = -multiplier[-1]
    info = np.iinfo(dst)
    conv = lpt.native.Conv(weights, strides=strides, dilations=dilations, pads=pads,
                           src_zero_point=int(rng.integers(0, 256)), multiplier=multiplier,
                           bias=rng.normal(0, 1, out_channels).astype(np.float32), post_ops=stage["post_ops"],
                           dst_scale=np.float32(0.05), dst_zero_point=int(rng.integers(info.min, info.max)),
                           dst_dtype=dst, threads=2, route="s16")
    got, _, expected = layer_then_pool(src, conv, pool)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert np.array_equal(got, expected)


def test_a_stem_and_its_pool_run_as_one_and_a_reversed_stage_does_not():
    """dnsmos_p808's shape of stem (1 → 32, 3×3, pads 1, Relu, 2×2 pool), small: fused; the same with a negative
    multiplier in one channel: the layer and the pool apart. The same bits both ways."""
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, (1, 1, 36, 24)).astype(np.uint8)
    weights = rng.integers(-128, 128, (32, 1, 3, 3)).astype(np.int8)
    for sign, implementation in ((1.0, POOLED), (-1.0, "lpt:s16_avx2")):
        multiplier = np.full(32, 2e-3, np.float32)
        multiplier[5] *= sign
        conv = lpt.native.Conv(weights, pads=(1, 1, 1, 1), src_zero_point=128, multiplier=multiplier,
                               post_ops=(Relu(),), dst_scale=np.float32(0.05), dst_dtype=np.uint8, threads=2,
                               route="s16")
        got, ran, expected = layer_then_pool(src, conv, (2, 2))
        assert np.array_equal(got, expected)
        assert ran == implementation


@pytest.mark.parametrize("size", [(12, 10), (13, 11), (7, 16)])
@pytest.mark.parametrize("dst", [np.uint8, np.int8])
def test_by_winograd_a_block_of_outputs_is_a_window(size, dst, monkeypatch):
    """A 3×3 layer by Winograd (forced: LPT_WINOGRAD=1) and a 2×2 pool: each 2×2 block's largest values, a last
    row or column of blocks half outside the output dropped (odd sizes); 16 input channels (Winograd's fewest), 24
    output channels (a half block)."""
    monkeypatch.setenv("LPT_WINOGRAD", "1")  # read when the operation is made
    rng = np.random.default_rng(size[0] * size[1])
    src = rng.integers(0, 256, (2, 16) + size).astype(np.uint8)
    weights = rng.integers(-128, 128, (24, 16, 3, 3)).astype(np.int8)
    for pads in ((1, 1, 1, 1), (0, 0, 0, 0)):
        conv = lpt.native.Conv(weights, pads=pads, src_zero_point=100,
                               multiplier=rng.uniform(1e-4, 1e-3, 24).astype(np.float32), post_ops=(Relu(),),
                               dst_scale=np.float32(0.05), dst_zero_point=-3 if dst == np.int8 else 3, dst_dtype=dst,
                               threads=2, route="s16")
        got, ran, expected = layer_then_pool(src, conv, (2, 2))
        assert np.array_equal(got, expected)
        assert ran == "lpt:s16_winograd_avx2_pooled"


def test_a_batch_runs_a_few_images_at_a_time():
    """Two images of 3072×3072 (each its own chunk within the layer's 64 MB of scratch): the second image's
    windows land after the first's."""
    rng = np.random.default_rng(1)
    src = rng.integers(0, 256, (2, 1, 3072, 3072)).astype(np.uint8)
    conv = lpt.native.Conv(np.array([[[[3]]], [[[-2]]]], np.int8), src_zero_point=9,
                           multiplier=np.array([0.01, 0.02], np.float32), post_ops=(Relu(),),
                           dst_scale=np.float32(0.05), dst_dtype=np.uint8, threads=2, route="s16")
    got, ran, expected = layer_then_pool(src, conv, (2, 2))
    assert ran == POOLED and np.array_equal(got, expected)
