"""lpt.native.Conv against lpt's NumPy oracle: int32 accumulators and the whole output stage, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lpt.native
from lpt.kernels import Clip, Gelu, HardSwish, LeakyRelu, Relu, Sigmoid, Silu
from lpt.kernels.output_stage import output_stage
from lpt.kernels.reference import conv_reference, output_stage_reference

# Every exact route on this CPU (the one this process takes among them), and the split route
# always: it is the one a CPU without VNNI runs, and CI may have VNNI.
ROUTES = sorted(set(lpt.native.exact_routes()) | {"split"})

GELU = Gelu(1.4142135, 1.0, 0.5)  # x·(erf(x / √2) + 1)·0.5, PaddleOCR's
HARD_SWISH = HardSwish(float(np.float32(0.2)), 0.5)  # x·HardSigmoid(x), its default α and β
ON_S16 = pytest.mark.skipif(lpt.native.available() and not lpt.native.engine.s16_supported(),
                            reason="this CPU has no AVX2, so it has no s16 route, whose depthwise kernel this tests")


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


def values(rng, draw, dtype, shape, extremes):
    info = np.iinfo(dtype)
    kind = draw(extremes)
    if kind == "max":
        return np.full(shape, info.max, dtype)
    if kind == "min":
        return np.full(shape, info.min, dtype)
    if kind == "ends":
        return rng.choice(np.array([info.min, info.max], dtype), shape)
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


@st.composite
def conv_cases(draw):
    """A convolution and its source: 1-3 spatial axes, groups (depthwise too), strides, dilations, pads, zero points."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rank = draw(st.sampled_from([1, 2, 2, 2, 3]))
    depthwise = draw(st.booleans())
    groups = draw(st.integers(1, 6)) if depthwise else draw(st.integers(1, 3))
    in_per_group = 1 if depthwise else draw(st.integers(1, 7))
    out_per_group = draw(st.integers(1, 2)) if depthwise else draw(st.integers(1, 6))
    small = rank == 3
    kernel = tuple(draw(st.integers(1, 2 if small else 3)) for _ in range(rank))
    strides = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    dilations = tuple(draw(st.integers(1, 2)) for _ in range(rank))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(2 * rank))
    extents = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    spatial = tuple(max(draw(st.integers(1, 4 if small else 8)), e - pads[i] - pads[rank + i])
                    for i, e in enumerate(extents))
    src_dtype = draw(st.sampled_from([np.uint8, np.int8]))
    extremes = st.sampled_from(["random", "random", "max", "min", "ends"])
    src = values(rng, draw, src_dtype, (draw(st.integers(1, 2)), groups * in_per_group) + spatial, extremes)
    if draw(st.booleans()):  # a channels-last source, as lpt's MLAS route leaves it, seen as [N, C, *spatial]
        src = np.moveaxis(np.ascontiguousarray(np.moveaxis(src, 1, -1)), -1, 1)
    weights = values(rng, draw, np.int8, (groups * out_per_group, in_per_group) + kernel, extremes)
    info = np.iinfo(src_dtype)
    zero_point = draw(st.sampled_from([0, int(info.min), int(info.max), int(rng.integers(info.min, info.max + 1))]))
    window = dict(groups=groups, strides=strides, dilations=dilations, pads=pads)
    return src, weights, zero_point, window, rng


@pytest.mark.parametrize("route", ROUTES)
@given(case=conv_cases())
@settings(max_examples=60, deadline=None)
def test_accumulators_equal_the_reference(route, case):
    src, weights, zero_point, window, _ = case
    conv = lpt.native.Conv(weights, src_zero_point=zero_point, route=route, threads=1, **window)
    expected = conv_reference(src, weights, zero_point, **window)
    assert np.array_equal(conv.accumulate(src), expected)
    assert np.array_equal(conv.accumulate(src, channels_last=True), expected)


@pytest.mark.parametrize("route", ROUTES)
@given(case=conv_cases(), later=st.lists(st.integers(0, 255), min_size=1, max_size=3))
@settings(max_examples=30, deadline=None)
def test_a_zero_point_given_at_each_run(route, case, later):
    """A dynamic quantization's source zero point arrives with each run: every run subtracts its own, the
    padding holds it (adds nothing), and a run without one takes the operation's again."""
    src, weights, zero_point, window, _ = case
    conv = lpt.native.Conv(weights, src_zero_point=zero_point, route=route, threads=1, **window)
    shift = 0 if src.dtype == np.uint8 else 128
    for run_zero_point in [zero_point] + [z - shift for z in later] + [0]:
        expected = conv_reference(src, weights, run_zero_point, **window)
        assert np.array_equal(conv.accumulate(src, src_zero_point=run_zero_point), expected)
    assert np.array_equal(conv.accumulate(src), conv_reference(src, weights, zero_point, **window))
    with pytest.raises(ValueError, match="outside"):
        conv.accumulate(src, src_zero_point=256 - shift)


@given(case=conv_cases(), later=st.lists(st.integers(0, 255), min_size=1, max_size=3))
@settings(max_examples=30, deadline=None)
def test_a_zero_point_given_at_each_run_on_onednns_u8s8_route_on_any_cpu(case, later):
    """The route a VNNI CPU takes, forced on this one: weights within ±63 keep every pair of u8·s8
    products within int16, so its AVX2 kernel adds them exactly too, and the run-time zero point (a
    primitive with one, then without: 0) is what is checked."""
    src, weights, zero_point, window, _ = case
    weights = np.clip(weights, -63, 63)
    conv = lpt.native.Conv(weights, src_zero_point=zero_point, route="u8s8", threads=1, **window)
    shift = 0 if src.dtype == np.uint8 else 128
    for run_zero_point in [z - shift for z in later] + [-shift, zero_point]:
        assert np.array_equal(conv.accumulate(src, src_zero_point=run_zero_point),
                              conv_reference(src, weights, run_zero_point, **window))


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("kernel, dilations, strides", [((3, 3), (1, 1), (1, 1)), ((7, 7), (1, 1), (1, 1)),
                                                        ((2, 2), (1, 1), (2, 2)), ((3, 3), (2, 2), (2, 1))])
def test_a_depthwise_convolution_over_several_blocks_of_sixteen_channels(route, kernel, dilations, strides):
    """Past 16 channels (conv_cases draws at most 6 groups): every lane of a block, a partial last block,
    odd and even tap counts, and the largest products (255·−128 on every tap) where the first channels
    are extreme."""
    rng = np.random.default_rng(11)
    channels = 40
    weights = rng.integers(-128, 128, (channels, 1) + kernel).astype(np.int8)
    weights[:3] = -128
    src = rng.integers(0, 256, (2, channels, 9, 11)).astype(np.uint8)
    src[:, :3] = 255
    window = dict(groups=channels, strides=strides, dilations=dilations, pads=(1, 2, 0, 1))
    conv = lpt.native.Conv(weights, src_zero_point=0, route=route, threads=2, **window)
    expected = conv_reference(src, weights, 0, **window)
    assert np.array_equal(conv.accumulate(src), expected)
    assert np.array_equal(conv.accumulate(src, channels_last=True), expected)


@ON_S16
@pytest.mark.parametrize("kernel, strides, dilations", [((3, 3), (1, 1), (1, 1)), ((7, 7), (1, 1), (1, 1)),
                                                        ((3, 3), (2, 2), (1, 1)), ((5, 3), (1, 2), (2, 3)),
                                                        ((1, 5), (1, 1), (1, 1))])
@pytest.mark.parametrize("src_dtype, zero_point", [(np.uint8, 7), (np.int8, -5)])
def test_a_depthwise_layer_wider_than_a_band_on_s16(kernel, strides, dilations, src_dtype, zero_point):
    """s16 pairs the source rows a band of output rows reads as long as they fit 192 kB: over a map 400 wide
    a band is a few rows, and each band reads rows the one before it read too. 20 channels (a block and a part
    of one), the extremes in the first channels and on the map's last rows, a channels-first source as well as
    a channels-last one; the accumulators and the staged levels equal the reference."""
    rng = np.random.default_rng(sum(kernel) + strides[0])
    channels, info = 20, np.iinfo(src_dtype)
    weights = rng.integers(-128, 128, (channels, 1) + kernel).astype(np.int8)
    weights[:2] = -128
    src = rng.integers(info.min, int(info.max) + 1, (2, channels, 23, 400)).astype(src_dtype)
    src[:, :2], src[:, :, -3:] = info.max, info.min
    window = dict(groups=channels, strides=strides, dilations=dilations, pads=(2, 1, 1, 3))
    expected = conv_reference(src, weights, zero_point, **window).astype(np.int32)
    stage = dict(multiplier=rng.uniform(1e-4, 3e-4, channels).astype(np.float32), dst_scale=np.float32(0.1),
                 dst_zero_point=np.int32(128))
    conv = lpt.native.Conv(weights, src_zero_point=zero_point, route="s16", threads=2, dst_dtype=np.uint8,
                           **stage, **window)
    channels_last = np.moveaxis(np.ascontiguousarray(np.moveaxis(src, 1, -1)), -1, 1)
    for source in (src, channels_last):
        assert np.array_equal(conv.accumulate(source), expected)
        assert same_bits(np.ascontiguousarray(conv(source, channels_last=True)),
                         output_stage(expected, bias=None, qmin=0, qmax=255, **stage))


@ON_S16
@pytest.mark.parametrize("channels, kernel, stride, dilation", [(16, 7, 1, 1), (9, 5, 2, 3), (16, 4, 3, 1)])
def test_a_one_dimensional_depthwise_layer_runs_in_strips_on_s16(channels, kernel, stride, dilation):
    """One row of one block is one band: s16 cuts it into strips of columns for its threads, each pairing the
    columns it reads (a strip's first and last pairs reach into its neighbours' columns and the pads)."""
    rng = np.random.default_rng(channels + kernel)
    weights = rng.integers(-128, 128, (channels, 1, kernel)).astype(np.int8)
    src = rng.integers(0, 256, (1, channels, 3001)).astype(np.uint8)
    src[:, :, -40:] = 255
    window = dict(groups=channels, strides=(stride,), dilations=(dilation,), pads=(4, 2))
    expected = conv_reference(src, weights, 9, **window).astype(np.int32)
    stage = dict(multiplier=rng.uniform(1e-4, 3e-4, channels).astype(np.float32), dst_scale=np.float32(0.1),
                 dst_zero_point=np.int32(128))
    conv = lpt.native.Conv(weights, src_zero_point=9, route="s16", threads=2, dst_dtype=np.uint8, **stage, **window)
    assert np.array_equal(conv.accumulate(src), expected)
    assert same_bits(conv(src), output_stage(expected, bias=None, qmin=0, qmax=255, **stage))


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("channels", [24, 17, 40])
@pytest.mark.parametrize("kernel, strides, pads", [((3, 3), (2, 2), (1, 1, 1, 1)), ((2, 2), (1, 1), (0, 0, 1, 1)),
                                                   ((1, 3), (1, 1), (0, 1, 0, 1))])
def test_a_last_block_of_at_most_eight_channels_with_the_block_before_it(route, channels, kernel, strides, pads):
    """Past 16 output channels (conv_cases draws at most 6 a group), a last block of at most eight: s16 walks
    it with the block before it as one tile of 24 channels. Accumulators and the output stage equal the
    reference in both layouts, at the extremes (255·127 and 255·−128 on every tap, in the first and the
    last channels), over maps whose positions end in a partial tile."""
    rng = np.random.default_rng(channels)
    weights = rng.integers(-128, 128, (channels, 5) + kernel).astype(np.int8)
    weights[0], weights[-1] = 127, -128
    src = rng.integers(0, 256, (2, 5, 9, 11)).astype(np.uint8)
    src[0] = 255
    window = dict(strides=strides, pads=pads)
    expected = conv_reference(src, weights, 0, **window)
    multiplier = rng.uniform(1e-5, 4e-5, channels).astype(np.float32)
    stage = dict(multiplier=multiplier, post_ops=(Relu(),), dst_scale=np.float32(0.02), dst_zero_point=np.int32(3))
    conv = lpt.native.Conv(weights, src_zero_point=0, route=route, threads=2, dst_dtype=np.uint8, **stage, **window)
    assert np.array_equal(conv.accumulate(src), expected)
    assert np.array_equal(conv.accumulate(src, channels_last=True), expected)
    levels = output_stage(expected.astype(np.int32), bias=None, qmin=0, qmax=255, **stage)
    assert 0 < np.count_nonzero(levels == 255) < levels.size  # the first channel saturates, not all do
    assert same_bits(conv(src), levels)
    assert same_bits(np.ascontiguousarray(conv(src, channels_last=True)), levels)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("dst_dtype", [np.uint8, np.float32])
def test_every_width_of_a_last_block_is_stored_whole_and_alone(route, dst_dtype):
    """1 to 33 output channels: every count of valid channels in a last block (stored by 8, 4, 2 and 1 values
    on s16), each channel equal to the reference in both layouts. In the channels-last output each position's
    channels lie next to the following position's, so a store past a block's valid channels, or one short of
    them, changes a value the reference fixes."""
    rng = np.random.default_rng(7)
    src = rng.integers(0, 256, (1, 6, 5, 7)).astype(np.uint8)
    for channels in range(1, 34):
        weights = rng.integers(-128, 128, (channels, 6, 1, 1)).astype(np.int8)
        stage = dict(multiplier=rng.uniform(1e-4, 3e-4, channels).astype(np.float32),
                     bias=rng.normal(0, 1, channels).astype(np.float32), post_ops=(Relu(),))
        if dst_dtype == np.uint8:
            stage.update(dst_scale=np.float32(0.05), dst_zero_point=np.int32(0))
        conv = lpt.native.Conv(weights, src_zero_point=3, route=route, threads=1, dst_dtype=dst_dtype, **stage)
        acc = conv_reference(src, weights, 3).astype(np.int32)
        expected = output_stage(acc, qmin=0, qmax=255, **stage)
        assert same_bits(conv(src), expected), channels
        assert same_bits(np.ascontiguousarray(conv(src, channels_last=True)), expected), channels


DESTINATIONS = [  # (dst_scale, dst_zero_point, dst_dtype, qmin, qmax)
    (None, 0, None, None, None),
    (0.05, 3, np.uint8, None, None),
    (0.02, -5, np.int8, None, None),
    (0.02, 0, np.int8, -127, 127),
    (1.0, 0, np.int8, None, None),  # with a multiplier of 0.5: every odd accumulator is a tie
]


@pytest.mark.parametrize("route", ROUTES)
@given(case=conv_cases(), destination=st.sampled_from(DESTINATIONS), per_channel=st.booleans(),
       bias=st.booleans(), post_ops=st.lists(st.sampled_from([Relu(), Clip(-0.5, 0.7), Clip(0.0, 6.0), LeakyRelu(0.2),
                                                              Sigmoid(), Silu(), HARD_SWISH, GELU]), max_size=2))
@settings(max_examples=40, deadline=None)
def test_output_stage_equals_lpts_numpy_output_stage(route, case, destination, per_channel, bias, post_ops):
    src, weights, zero_point, window, rng = case
    out_channels = weights.shape[0]
    dst_scale, dst_zero_point, dst_dtype, qmin, qmax = destination
    if dst_scale == 1.0:
        multiplier = np.float32(0.5)
    else:
        multiplier = rng.uniform(1e-5, 1e-3, out_channels if per_channel else 1).astype(np.float32)
    bias = rng.normal(0, 2, out_channels).astype(np.float32) if bias else None
    conv = lpt.native.Conv(weights, src_zero_point=zero_point, multiplier=multiplier, bias=bias,
                           post_ops=tuple(post_ops), dst_scale=dst_scale, dst_zero_point=dst_zero_point,
                           dst_dtype=dst_dtype, qmin=qmin, qmax=qmax, route=route, threads=1, **window)
    info = np.iinfo(dst_dtype) if dst_dtype else None
    qmin = info.min if qmin is None and info else qmin
    qmax = info.max if qmax is None and info else qmax
    acc = conv_reference(src, weights, zero_point, **window).astype(np.int32)
    stage = dict(multiplier=multiplier, bias=bias, post_ops=tuple(post_ops),
                 dst_scale=None if dst_scale is None else np.float32(dst_scale),
                 dst_zero_point=np.int32(dst_zero_point), qmin=qmin or 0, qmax=qmax or 255)
    expected = output_stage(acc, **stage)
    got = conv(src)
    assert same_bits(got, expected)
    reference = output_stage_reference(acc, **stage)
    assert np.array_equal(got, reference.astype(got.dtype))
    assert same_bits(np.ascontiguousarray(conv(src, channels_last=True)), expected)


@pytest.mark.parametrize("route", ROUTES)
def test_a_resnet_layer_with_extreme_values(route):
    """255 against 127 and −128 over a 3×3×64 window: every int16 pair sum of the plain kernel would saturate."""
    rng = np.random.default_rng(7)
    weights = rng.choice(np.array([-128, 127], np.int8), (64, 64, 3, 3))
    src = np.full((1, 64, 28, 28), 255, np.uint8)
    src[0, :, ::3] = rng.integers(0, 256, (64, 10, 28))
    conv = lpt.native.Conv(weights, pads=(1, 1, 1, 1), src_zero_point=128, route=route, threads=2)  # parallel loops
    assert np.array_equal(conv.accumulate(src), conv_reference(src, weights, 128, pads=[1, 1, 1, 1]))


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("shape, kernel, pads", [((2, 7, 50), (3,), (1, 2)), ((1, 33, 3, 37), (3, 3), (1, 0, 1, 2)),
                                                 ((1, 512, 194), (1,), (0, 0))])
def test_wide_channels_first_sources(route, dtype, shape, kernel, pads):
    """A channels-first source is widened sixteen positions at a time (s16): rows of 50 and 37 positions end
    in a part of one, odd channel counts leave a padding channel, and plcmos_v2's 512-channel 1-D layer."""
    rng = np.random.default_rng(11)
    src = rng.integers(np.iinfo(dtype).min, int(np.iinfo(dtype).max) + 1, shape).astype(dtype)
    weights = rng.integers(-128, 128, (16, shape[1]) + kernel).astype(np.int8)
    zero_point = 5 if dtype == np.uint8 else -3
    conv = lpt.native.Conv(weights, pads=pads, src_zero_point=zero_point, route=route, threads=2)
    assert np.array_equal(conv.accumulate(src), conv_reference(src, weights, zero_point, pads=list(pads)))


UNIT_AXIS_LAYERS = {  # source shape, weights shape, window
    "magika": ((2, 24, 61, 1), (40, 24, 5, 1), {}),
    "conv1d-as-2d": ((1, 1, 1, 300), (12, 1, 1, 16), {"strides": (1, 2)}),
    "grouped": ((1, 6, 1, 20), (9, 2, 1, 3), {"groups": 3, "dilations": (1, 2)}),
    "two-of-three": ((1, 4, 1, 9, 1), (5, 4, 1, 3, 1), {"pads": (0, 1, 0, 0, 2, 0)}),
    "padded": ((1, 4, 1, 10), (6, 4, 1, 3), {"pads": (1, 0, 1, 0)}),  # padded along the unit axis: kept
    "in-bands": ((1, 64, 300, 1), (64, 64, 5, 1), {"pads": (2, 0, 2, 0)}),  # 6 M products: bands of rows
}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("layer", UNIT_AXIS_LAYERS.values(), ids=UNIT_AXIS_LAYERS.keys())
@pytest.mark.parametrize("src_dtype, zero_point", [(np.uint8, 9), (np.int8, -4)])
def test_spatial_axes_of_one_leave_the_bits_as_they_are(route, layer, src_dtype, zero_point):
    """Axes where the source has extent 1 and the window spans 1 unpadded, which oneDNN's primitives run without:
    accumulators and the whole stage as lpt's NumPy computes them, from either layout."""
    shape, weight_shape, window = layer
    rng = np.random.default_rng(len(shape) + shape[1])
    info = np.iinfo(src_dtype)
    src = rng.integers(info.min, int(info.max) + 1, shape).astype(src_dtype)
    weights = rng.integers(-128, 128, weight_shape).astype(np.int8)
    spatial = len(shape) - 2
    window = {"strides": (1,) * spatial, "dilations": (1,) * spatial, "pads": (0,) * (2 * spatial), "groups": 1,
              **window}
    acc = conv_reference(src, weights, zero_point, **{k: list(v) if isinstance(v, tuple) else v
                                                      for k, v in window.items()}).astype(np.int32)
    conv = lpt.native.Conv(weights, src_zero_point=zero_point, route=route, threads=2, **window)
    assert np.array_equal(conv.accumulate(src), acc)
    channels_last = np.moveaxis(np.ascontiguousarray(np.moveaxis(src, 1, -1)), -1, 1)
    assert np.array_equal(conv.accumulate(channels_last, channels_last=True), acc)
    stage = dict(multiplier=rng.uniform(1e-4, 3e-4, weights.shape[0]).astype(np.float32),
                 bias=rng.normal(0, 2, weights.shape[0]).astype(np.float32), post_ops=(Relu(),),
                 dst_scale=np.float32(0.05), dst_zero_point=np.int32(3))
    staged = lpt.native.Conv(weights, src_zero_point=zero_point, route=route, threads=2, dst_dtype=np.uint8,
                             **stage, **window)
    expected = output_stage(acc, qmin=0, qmax=255, **stage)
    assert 0.2 < np.count_nonzero(expected > 3) / expected.size < 0.8  # neither all clipped nor all saturated
    assert same_bits(staged(src), expected)
    assert same_bits(np.ascontiguousarray(staged(src, channels_last=True)), expected)


ONE_CHANNEL_LAYERS = {  # source shape, weights shape, window, whether it runs over phases
    "basic-pitch": ((1, 1, 1, 3000), (1, 1, 1, 256), {"strides": (1, 2)}, True),
    "padded-three-outputs": ((2, 1, 700), (3, 1, 40), {"strides": (3,), "pads": (5, 7)}, True),
    "fewer-outputs-than-a-position": ((1, 1, 40), (1, 1, 20), {}, True),
    "one-output-in-the-padding": ((1, 1, 10), (2, 1, 16), {"pads": (3, 3)}, True),
    "eight-outputs": ((1, 1, 300), (8, 1, 17), {"strides": (2,)}, True),
    "rows-of-their-own": ((1, 1, 3, 300), (2, 1, 1, 32), {}, False),  # not one row: as it was
    "dilated": ((1, 1, 300), (1, 1, 32), {"dilations": (2,)}, False),
}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("layer", ONE_CHANNEL_LAYERS.values(), ids=ONE_CHANNEL_LAYERS.keys())
@pytest.mark.parametrize("src_dtype, zero_point", [(np.uint8, 9), (np.int8, -4)])
def test_a_long_window_over_one_channel_runs_over_phases_with_the_same_bits(route, layer, src_dtype, zero_point):
    """A convolution of one input channel and few outputs with a long window (prepare_polyphase): accumulators and
    8-bit and float32 stages as lpt's NumPy computes them, from and into either layout."""
    shape, weight_shape, window, phased = layer
    rng = np.random.default_rng(shape[-1] + weight_shape[-1])
    info = np.iinfo(src_dtype)
    src = rng.integers(info.min, int(info.max) + 1, shape).astype(src_dtype)
    weights = rng.integers(-128, 128, weight_shape).astype(np.int8)
    spatial = len(shape) - 2
    window = {"strides": (1,) * spatial, "dilations": (1,) * spatial, "pads": (0,) * (2 * spatial), **window}
    acc = conv_reference(src, weights, zero_point, **{k: list(v) for k, v in window.items()}).astype(np.int32)
    conv = lpt.native.Conv(weights, src_zero_point=zero_point, route=route, threads=2, **window)
    assert np.array_equal(conv.accumulate(src), acc)
    assert conv.implementation.endswith(" over phases") == phased
    assert np.array_equal(conv.accumulate(src, channels_last=True), acc)
    per_channel = np.moveaxis(acc, 1, 0).reshape(weights.shape[0], -1).astype(np.float64)
    multiplier = (2 / (per_channel.std(axis=1) + 1)).astype(np.float32)  # outputs of about ±2 around the bias
    bias = (-per_channel.mean(axis=1) * multiplier).astype(np.float32)
    for dst_dtype, dst_scale in [(np.uint8, np.float32(0.05)), (None, None)]:
        stage = dict(multiplier=multiplier, bias=bias, post_ops=(Relu(),), dst_scale=dst_scale,
                     dst_zero_point=np.int32(3))
        staged = lpt.native.Conv(weights, src_zero_point=zero_point, route=route, threads=2, dst_dtype=dst_dtype,
                                 **stage, **window)
        expected = output_stage(acc, qmin=0, qmax=255, **stage)
        assert same_bits(staged(src), expected)
        assert same_bits(np.ascontiguousarray(staged(src, channels_last=True)), expected)
        if dst_dtype is not None and expected.size > 100:
            assert 0.2 < np.count_nonzero(expected > 3) / expected.size < 0.8  # neither all clipped nor saturated


POINTWISE_SHAPES = [  # (in, out channels, spatial): one band; rows in bands; weights that split output channels
    (24, 40, (3, 5)), (48, 96, (40, 40)), (512, 512, (2, 2))]


@pytest.mark.parametrize("route", ROUTES)
@given(seed=st.integers(0, 2**32 - 1), shape=st.sampled_from(POINTWISE_SHAPES), one_d=st.booleans(),
       stride=st.sampled_from([1, 2]), images=st.integers(1, 2), src_dtype=st.sampled_from([np.uint8, np.int8]),
       destination=st.sampled_from(DESTINATIONS[:3]), post_ops=st.sampled_from([(), (Relu(),), (GELU,)]))
@settings(max_examples=12, deadline=None)
def test_a_pointwise_convolution_runs_as_a_matmul_with_the_same_bits(route, seed, shape, one_d, stride, images, src_dtype,
                                                                     destination, post_ops):
    """A 1×1 convolution (strided ones subsampled first) is a matmul of its channels-last source by its weights:
    on oneDNN's routes it runs as one (_engine.cpp: pointwise), in one band, in bands of rows, or in bands of
    output channels, staged by the primitive (Relu) or by lpt (GELU): the accumulators and the levels of lpt's
    NumPy stage in both layouts."""
    in_channels, out_channels, spatial = shape
    rng = np.random.default_rng(seed)
    spatial = (spatial[0] * spatial[1],) if one_d else spatial
    info = np.iinfo(src_dtype)
    src = rng.integers(info.min, int(info.max) + 1, (images, in_channels) + spatial).astype(src_dtype)
    weights = rng.integers(-128, 128, (out_channels, in_channels) + (1,) * len(spatial)).astype(np.int8)
    zero_point = int(rng.integers(info.min, int(info.max) + 1))
    dst_scale, dst_zero_point, dst_dtype, _, _ = destination
    stage = dict(multiplier=rng.uniform(1e-5, 1e-4, out_channels).astype(np.float32),
                 bias=rng.normal(0, 1, out_channels).astype(np.float32), post_ops=post_ops,
                 dst_scale=None if dst_scale is None else np.float32(dst_scale), dst_zero_point=np.int32(dst_zero_point))
    strides = (stride,) * len(spatial)
    conv = lpt.native.Conv(weights, src_zero_point=zero_point, strides=strides, dst_dtype=dst_dtype, route=route,
                           threads=2, **stage)
    accumulators = conv_reference(src, weights, zero_point, strides=list(strides)).astype(np.int32)
    dst_info = np.iinfo(dst_dtype) if dst_dtype else None
    expected = output_stage(accumulators, qmin=dst_info.min if dst_info else 0, qmax=dst_info.max if dst_info else 255,
                            **stage)
    assert np.array_equal(conv.accumulate(src), accumulators)
    assert same_bits(conv(src), expected)
    assert same_bits(np.ascontiguousarray(conv(src, channels_last=True)), expected)
    if route in ("u8s8", "split"):
        # oneDNN's matmul (brgemm with AVX-512, its gemm on AVX2), not its 1×1 convolution (brgconv_1x1, jit_1x1)
        assert conv.implementation.startswith(("brg:", "gemm:"))


@pytest.mark.parametrize("route", ["split", "u8s8"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_a_strided_1x1_convolution_is_right_at_every_run(route, channels_last):
    """oneDNN 3.2's jit_uni_int8_1x1:avx2 with a stride gave one output position (an image's first, here)
    wrong in 1 to 13 of 40 fresh runs of this layer; lpt subsamples the source itself and runs it with stride 1.
    Weights within ±60 keep u8s8's int16 pair sums exact on any CPU."""
    rng = np.random.default_rng(3)
    weights = rng.integers(-60, 61, (32, 8, 1, 1)).astype(np.int8)
    src = rng.integers(0, 256, (4, 8, 32, 32)).astype(np.uint8)
    if channels_last:
        src = np.moveaxis(np.ascontiguousarray(np.moveaxis(src, 1, -1)), -1, 1)
    expected = conv_reference(src, weights, 3, strides=[2, 2])
    for _ in range(25):  # fresh operations: the wrong position came at an operation's first run
        conv = lpt.native.Conv(weights, strides=(2, 2), src_zero_point=3, route=route, threads=2)
        assert np.array_equal(conv.accumulate(src), expected)


# Layers on which oneDNN 3.2's AMX kernels, where the CPU has them, crashed or summed wrong (found by a fuzzer):
# lpt takes its VNNI kernels there. (kernel, strides, dilations, pads, spatial, channels, zero point)
AMX_WRONG_LAYERS = {
    "3-D, wrong sums": ((1, 2, 1), (3, 3, 3), (1, 1, 2), (0, 1, 0, 0, 0, 2), (16, 14, 1), 64, 0),
    "3-D, no dilation, wrong sums": ((2, 1, 2), (2, 3, 2), (1, 1, 1), (0, 0, 2, 1, 1, 1), (14, 12, 13), 128, 0),
    "3-D, a crash": ((1, 3, 3), (3, 1, 2), (1, 1, 1), (0, 0, 1, 0, 1, 0), (1, 9, 2), 16, 3),
    "dilated, rows of padding only": ((2, 1), (3, 1), (2, 2), (1, 1, 2, 0), (1, 6), 128, 0),
    "dilated, a zero point": ((2, 2), (1, 1), (2, 2), (1, 0, 2, 0), (12, 3), 16, 3),
    "a zero point, the first axis padded, not the last": ((5, 3), (1, 1), (1, 1), (1, 0, 1, 0), (35, 37), 96, 3),
    "a zero point, more padding than half the window": ((7, 7), (1, 2), (1, 1), (6, 5, 6, 5), (21, 17), 64, 3),
}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("layer", AMX_WRONG_LAYERS.values(), ids=AMX_WRONG_LAYERS.keys())
def test_layers_oneDNNs_amx_kernels_get_wrong(route, layer):
    kernel, strides, dilations, pads, spatial, channels, zero_point = layer
    rng = np.random.default_rng(0)
    weights = rng.integers(-128, 128, (channels, channels) + kernel).astype(np.int8)
    src = rng.integers(0, 256, (1, channels) + spatial).astype(np.uint8)
    conv = lpt.native.Conv(weights, src_zero_point=zero_point, route=route, threads=1, strides=strides,
                           dilations=dilations, pads=pads)
    expected = conv_reference(src, weights, zero_point, strides=list(strides), dilations=list(dilations), pads=list(pads))
    for _ in range(3):  # the wrong sums differed from run to run
        assert np.array_equal(conv.accumulate(src), expected)
    assert "amx" not in conv.implementation


@st.composite
def banded_cases(draw):
    """A layer mostly large enough (2^20 products or more) that each of two threads runs a band of it: one image split
    along its first output axis, where a band may start or end in the padding, or a band of the images."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rank = draw(st.sampled_from([1, 2]))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    strides = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    dilations = tuple(draw(st.integers(1, 2)) for _ in range(rank))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(2 * rank))
    extents = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    spatial = tuple(max(draw(st.integers(1, 9)), e - pads[i] - pads[rank + i]) for i, e in enumerate(extents))
    channels = 768 if rank == 1 else 256
    src = rng.integers(0, 256, (draw(st.integers(1, 3)), channels) + spatial).astype(np.uint8)
    weights = rng.integers(-128, 128, (channels, channels) + kernel).astype(np.int8)
    return src, weights, {"strides": strides, "dilations": dilations, "pads": pads}


@pytest.mark.parametrize("route", sorted(set(lpt.native.exact_routes()) - {"s16"}))  # oneDNN's: s16 has no bands
@settings(max_examples=25, deadline=None)
@given(case=banded_cases(), zero_point=st.sampled_from([0, 3]))
def test_a_layer_in_bands_sums_what_one_primitive_does(route, case, zero_point):
    src, weights, window = case
    conv = lpt.native.Conv(weights, src_zero_point=zero_point, route=route, threads=2, **window)
    expected = conv_reference(src, weights, zero_point, strides=list(window["strides"]),
                              dilations=list(window["dilations"]), pads=list(window["pads"]))
    assert np.array_equal(conv.accumulate(src), expected)


@pytest.mark.parametrize("route", sorted(set(lpt.native.exact_routes()) - {"s16"}))  # oneDNN's: s16 has no bands
@pytest.mark.parametrize("images, size", [(3, 40), (1, 70)], ids=["bands-of-images", "bands-of-rows"])
def test_each_band_is_staged_by_the_thread_that_computed_it(route, images, size):
    """Over 512 KB of accumulators a layer runs in more bands than threads, each band's output stage right after
    its primitive: lpt's NumPy bits in both layouts, bands of rows ending inside a block of 64 positions too."""
    rng = np.random.default_rng(size)
    weights = rng.integers(-128, 128, (64, 16, 3, 3)).astype(np.int8)
    src = rng.integers(0, 256, (images, 16, size, size)).astype(np.uint8)
    stage = dict(multiplier=rng.uniform(2e-5, 6e-5, 64).astype(np.float32), bias=rng.normal(0, 0.5, 64).astype(np.float32),
                 post_ops=(Relu(),), dst_scale=np.float32(0.02), dst_zero_point=np.int32(0))
    conv = lpt.native.Conv(weights, pads=(1, 1, 1, 1), src_zero_point=128, route=route, threads=2, dst_dtype=np.uint8,
                           **stage)
    expected = output_stage(conv_reference(src, weights, 128, pads=[1, 1, 1, 1]).astype(np.int32), qmin=0, qmax=255,
                            **stage)
    assert 0.2 < np.count_nonzero(expected) / expected.size < 0.8  # neither all clipped nor all saturated
    assert same_bits(conv(src), expected)
    assert same_bits(np.ascontiguousarray(conv(src, channels_last=True)), expected)


@pytest.mark.parametrize("route", sorted(set(lpt.native.exact_routes()) - {"s16"}))
@pytest.mark.parametrize("dst_dtype", [np.uint8, None])
def test_a_depthwise_layer_of_a_recognizer_runs_in_bands_as_in_one(route, dst_dtype):
    """A depthwise product counts as eight dense ones in the choice of bands: the PaddleOCR recognizer's 192-channel
    3×3 over 6×80 (0.83 M products) runs in two bands of three rows, each reading the row beyond it; the NumPy bits,
    into 8 bits and into float32."""
    rng = np.random.default_rng(6)
    weights = rng.integers(-128, 128, (192, 1, 3, 3)).astype(np.int8)
    src = rng.integers(0, 256, (1, 192, 6, 80)).astype(np.uint8)
    stage = dict(multiplier=rng.uniform(2e-4, 6e-4, 192).astype(np.float32), bias=rng.normal(0, 0.5, 192).astype(np.float32))
    if dst_dtype is not None:
        stage.update(post_ops=(Relu(),), dst_scale=np.float32(0.02), dst_zero_point=np.int32(0))
    conv = lpt.native.Conv(weights, groups=192, pads=(1, 1, 1, 1), src_zero_point=100, route=route, threads=2,
                           dst_dtype=dst_dtype, **stage)
    acc = conv_reference(src, weights, 100, groups=192, pads=[1, 1, 1, 1]).astype(np.int32)
    expected = output_stage(acc, qmin=0, qmax=255, **stage) if dst_dtype else output_stage(acc, **stage)
    assert same_bits(conv(src), expected)


@pytest.mark.parametrize("out_channels", [256, 200])
def test_a_deep_layer_of_few_positions_splits_its_output_channels(out_channels):
    """Weights of 256 KB and more that outweigh the accumulators (a deep layer over 6×6): on route u8s8 each thread
    computes and stages a band of output channels with those channels' weights (200 splits as 96 + 104); the
    NumPy bits in the channels-last layout that takes channel bands, the accumulators, and channels-first."""
    rng = np.random.default_rng(out_channels)
    weights = rng.integers(-128, 128, (out_channels, 256, 3, 3)).astype(np.int8)
    src = rng.integers(0, 256, (1, 256, 6, 6)).astype(np.uint8)
    stage = dict(multiplier=rng.uniform(1e-5, 3e-5, out_channels).astype(np.float32),
                 bias=rng.normal(0, 0.5, out_channels).astype(np.float32), post_ops=(Relu(),),
                 dst_scale=np.float32(0.05), dst_zero_point=np.int32(0))
    conv = lpt.native.Conv(weights, pads=(1, 1, 1, 1), src_zero_point=128, threads=2, dst_dtype=np.uint8, **stage)
    accumulators = conv_reference(src, weights, 128, pads=[1, 1, 1, 1]).astype(np.int32)
    expected = output_stage(accumulators, qmin=0, qmax=255, **stage)
    assert 0.2 < np.count_nonzero(expected) / expected.size < 0.8
    assert same_bits(np.ascontiguousarray(conv(src, channels_last=True)), expected)
    assert np.array_equal(conv.accumulate(src, channels_last=True), accumulators)
    assert same_bits(conv(src), expected)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("post_ops", [(), (Relu(),), (GELU,), (Sigmoid(),), (Silu(),), (HARD_SWISH,),
                                      (LeakyRelu(0.2), Clip(-1.5, 4.0)), (Sigmoid(), GELU)],
                         ids=["none", "relu", "gelu", "sigmoid", "silu", "hard-swish", "leaky-clip", "sigmoid-gelu"])
def test_subnormal_values_before_the_post_ops_give_the_numpy_levels(route, post_ops):
    """Channels of tiny multipliers or a subnormal bias (a detector's dead channels) put values below 2^-96
    before the post-ops, which the vector stage takes as 0 for an 8-bit destination: the same levels as lpt's
    NumPy stage, which computes them as they are; a float32 destination keeps them, bit for bit."""
    rng = np.random.default_rng(7)
    weights = rng.integers(-128, 128, (32, 8, 3, 3)).astype(np.int8)
    src = rng.integers(0, 256, (1, 8, 12, 12)).astype(np.uint8)
    multiplier = rng.uniform(1e-5, 3e-5, 32).astype(np.float32)
    bias = rng.normal(0, 0.5, 32).astype(np.float32)
    multiplier[0::4], bias[0::4] = np.float32(1e-36), np.float32(0.0)  # x about 1e-32: normal, below 2^-96
    multiplier[1::4], bias[1::4] = np.float32(3e-45), np.float32(0.0)  # subnormal
    multiplier[2::4], bias[2::4] = np.float32(0.0), np.float32(3e-41)  # the bias alone, subnormal
    accumulators = conv_reference(src, weights, 128, pads=[1, 1, 1, 1]).astype(np.int32)
    for dst_scale, dst_dtype in ((np.float32(0.02), np.uint8), (None, np.float32)):
        stage = dict(multiplier=multiplier, bias=bias, post_ops=post_ops, dst_scale=dst_scale,
                     dst_zero_point=np.int32(7 if dst_scale is not None else 0))
        conv = lpt.native.Conv(weights, pads=(1, 1, 1, 1), src_zero_point=128, route=route, threads=2,
                               dst_dtype=dst_dtype, **stage)
        expected = output_stage(accumulators, qmin=0, qmax=255, **stage)
        assert same_bits(np.ascontiguousarray(conv(src, channels_last=True)), expected)
    assert np.count_nonzero((expected != 0) & (np.abs(expected) < np.finfo(np.float32).tiny)) > 0 or post_ops[:1] in (
        (Relu(),), (Sigmoid(),))  # the float32 output holds subnormals, but where a Relu or Sigmoid takes them away


def test_runs_again_on_another_shape_and_keeps_the_first():
    weights = np.arange(-60, 60, dtype=np.int8).reshape(4, 3, 10)
    conv = lpt.native.Conv(weights, strides=(2,), pads=(3, 1), src_zero_point=5, threads=1)
    for length in (12, 31, 12):
        src = np.arange(3 * length, dtype=np.uint8).reshape(1, 3, length)
        assert np.array_equal(conv.accumulate(src), conv_reference(src, weights, 5, strides=[2], pads=[3, 1]))
    assert conv.implementation  # the oneDNN kernel's name, e.g. jit_uni_int8:avx2


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("post_ops", [(LeakyRelu(0.2),), (LeakyRelu(0.2), Clip(-1.5, 4.0)), (LeakyRelu(0.1), Clip(-0.3, np.inf))])
def test_a_leaky_relu_and_a_clip_after_it_into_int8(route, post_ops):
    """A LeakyRelu and the clip after it are one post-op of the engine (TensorFlow's LeakyRelu → Max(c), as
    openWakeWord's embedding model writes it), which s16's one-clip stage computes: lpt's NumPy bits, a
    full block of sixteen channels and a half one, in both layouts."""
    rng = np.random.default_rng(12)
    weights = rng.integers(-128, 128, (24, 6, 3, 3)).astype(np.int8)
    src = rng.integers(0, 256, (2, 6, 9, 11)).astype(np.uint8)
    multiplier = rng.uniform(1e-5, 4e-5, 24).astype(np.float32)  # x within about ±3: few levels saturate
    bias = rng.normal(0, 0.5, 24).astype(np.float32)
    stage = dict(multiplier=multiplier, bias=bias, post_ops=post_ops, dst_scale=np.float32(0.02),
                 dst_zero_point=np.int32(3))
    conv = lpt.native.Conv(weights, pads=(1, 1, 1, 1), src_zero_point=128, route=route, threads=2, dst_dtype=np.int8,
                           **stage)
    expected = output_stage(conv_reference(src, weights, 128, pads=[1, 1, 1, 1]).astype(np.int32), qmin=-128,
                            qmax=127, **stage)
    assert np.count_nonzero((expected < 3) & (expected > -128)) > 100  # below 0, not saturated: the slope's
    assert same_bits(conv(src), expected)
    assert same_bits(np.ascontiguousarray(conv(src, channels_last=True)), expected)


@pytest.mark.parametrize("route", ROUTES)
def test_a_sigmoid_head_in_both_layouts(route):
    """A detector's probability map: Conv → Sigmoid in f32. Channels-first outputs take the engine's scalar
    stage and channels-last ones its eight-lane stage on every route: both give lpt's NumPy Sigmoid's bits."""
    rng = np.random.default_rng(11)
    weights = rng.integers(-128, 128, (24, 5, 3, 3)).astype(np.int8)
    src = rng.integers(0, 256, (2, 5, 9, 7)).astype(np.uint8)
    multiplier, bias = np.float32(2e-3), rng.normal(0, 4, 24).astype(np.float32)
    conv = lpt.native.Conv(weights, pads=(1, 1, 1, 1), src_zero_point=128, multiplier=multiplier, bias=bias,
                           post_ops=(Sigmoid(),), route=route, threads=2)
    acc = conv_reference(src, weights, 128, pads=[1, 1, 1, 1]).astype(np.int32)
    expected = output_stage(acc, multiplier, bias, (Sigmoid(),))
    assert same_bits(conv(src), expected)
    assert same_bits(np.ascontiguousarray(conv(src, channels_last=True)), expected)


@pytest.mark.parametrize("route", ROUTES)
def test_a_gelu_into_uint8_in_both_layouts(route):
    """Conv → GELU → QuantizeLinear (PaddleOCR's blocks) as one output stage: the scalar stage (channels-first)
    and the eight-lane one (channels-last, and s16's tiles) give the bits of lpt.kernels.gelu, then its levels."""
    rng = np.random.default_rng(12)
    weights = rng.integers(-128, 128, (40, 6, 3, 3)).astype(np.int8)
    src = rng.integers(0, 256, (2, 6, 9, 7)).astype(np.uint8)
    multiplier, bias = np.float32(1e-3), rng.normal(0, 2, 40).astype(np.float32)
    for destination in [dict(), dict(dst_scale=np.float32(0.02), dst_zero_point=10, dst_dtype=np.uint8)]:
        conv = lpt.native.Conv(weights, pads=(1, 1, 1, 1), src_zero_point=128, multiplier=multiplier, bias=bias,
                               post_ops=(GELU,), route=route, threads=2, **destination)
        acc = conv_reference(src, weights, 128, pads=[1, 1, 1, 1]).astype(np.int32)
        expected = output_stage(acc, multiplier, bias, (GELU,), destination.get("dst_scale"),
                                np.int32(destination.get("dst_zero_point", 0)), 0, 255)
        assert same_bits(conv(src), expected)
        assert same_bits(np.ascontiguousarray(conv(src, channels_last=True)), expected)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("dst_dtype, dst_zero_point", [(np.uint8, 0), (np.uint8, 200), (np.int8, -5)])
def test_a_gelu_stage_at_its_extremes(route, dst_dtype, dst_zero_point):
    """The GELU stage where its levels clamp at both ends, where erf's argument passes 4 and float32's range
    (a multiplier of 1e34 makes x infinite, and a bias of −inf then NaN), and in blocks of positions and a
    tail of 1 to 3: every level that of lpt's NumPy stage, channels-first and channels-last."""
    rng = np.random.default_rng(dst_zero_point + 7)
    weights = rng.integers(-128, 128, (37, 5, 3, 3)).astype(np.int8)
    multiplier = rng.choice(np.array([1e-5, 1e-3, 0.05, 1e34], np.float32), 37)
    bias = rng.normal(0, 3, 37).astype(np.float32)
    bias[:3] = [np.inf, -np.inf, 0.0]
    multiplier[:3] = 1e34
    for side in (5, 6, 7):  # 25, 36 and 49 positions per image: no tail, and tails of 1 and 3 (with two images)
        src = rng.integers(0, 256, (2, 5, side, side)).astype(np.uint8)
        conv = lpt.native.Conv(weights, pads=(1, 1, 1, 1), src_zero_point=128, multiplier=multiplier, bias=bias,
                               post_ops=(GELU,), dst_scale=np.float32(0.013), dst_zero_point=dst_zero_point,
                               dst_dtype=dst_dtype, route=route, threads=2)
        acc = conv_reference(src, weights, 128, pads=[1, 1, 1, 1]).astype(np.int32)
        info = np.iinfo(dst_dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            expected = output_stage(acc, multiplier, bias, (GELU,), np.float32(0.013), np.int32(dst_zero_point),
                                    info.min, info.max)
        assert {info.min, info.max} <= set(np.unique(expected).tolist())
        assert same_bits(conv(src), expected)
        assert same_bits(np.ascontiguousarray(conv(src, channels_last=True)), expected)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("post_ops", [(), (Relu(),), (Clip(0.5, 6.0),)], ids=["none", "relu", "clip"])
def test_channels_of_zero_weights_and_subnormal_biases(route, post_ops):
    """Dead channels (zero weights) whose biases are subnormal, as in PaddleOCR's detector: into 8 bits
    (where oneDNN stages them with subnormals taken as zero) every level is the reference's; into float32
    the subnormal values themselves come out, as IEEE arithmetic gives them."""
    rng = np.random.default_rng(41)
    weights = rng.integers(-128, 128, (48, 16, 1, 1)).astype(np.int8)
    dead = rng.choice(48, 20, replace=False)
    weights[dead] = 0
    bias = rng.normal(0, 0.5, 48).astype(np.float32)
    bias[dead] = rng.choice(np.array([1e-41, -3e-40, 2e-45, 0.0], np.float32), 20)
    multiplier = np.float32(2e-4)
    src = rng.integers(0, 256, (1, 16, 20, 20)).astype(np.uint8)
    acc = conv_reference(src, weights, 128).astype(np.int32)
    for destination in [dict(), dict(dst_scale=np.float32(0.01), dst_zero_point=3, dst_dtype=np.uint8)]:
        conv = lpt.native.Conv(weights, src_zero_point=128, multiplier=multiplier, bias=bias, post_ops=post_ops,
                               route=route, threads=2, **destination)
        expected = output_stage(acc, multiplier, bias, post_ops, destination.get("dst_scale"),
                                np.int32(destination.get("dst_zero_point", 0)), 0, 255)
        assert same_bits(np.ascontiguousarray(conv(src, channels_last=True)), expected)
        assert same_bits(conv(src), expected)
        if not destination and not post_ops:  # the float32 outputs hold the subnormal biases themselves
            assert np.any((expected != 0) & (np.abs(expected) < np.finfo(np.float32).tiny))


@pytest.mark.parametrize("route", sorted(set(lpt.native.exact_routes()) - {"s16"}))  # s16 widens by itself
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("images, side", [(1, 9), (2, 23)])  # 81 and 529 positions: sixteens and a tail
def test_a_three_channel_image_goes_channels_last_as_any_other(route, dtype, images, side):
    """An RGB stem's channels-first source is interleaved sixteen positions at a time (an s8 one flipped to
    u8 on the way); the sums are the reference's, as from the same source given channels-last."""
    rng = np.random.default_rng(side)
    info = np.iinfo(dtype)
    src = rng.integers(info.min, info.max + 1, (images, 3, side, side)).astype(dtype)
    weights = rng.integers(-128, 128, (5, 3, 3, 3)).astype(np.int8)
    zero_point = 7 if dtype == np.uint8 else -9
    conv = lpt.native.Conv(weights, src_zero_point=zero_point, route=route, threads=2, pads=(1, 1, 1, 1))
    expected = conv_reference(src, weights, zero_point, pads=(1, 1, 1, 1))
    assert np.array_equal(conv.accumulate(src), expected)
    lying_channels_last = np.moveaxis(np.ascontiguousarray(np.moveaxis(src, 1, -1)), -1, 1)  # read in place
    assert np.array_equal(conv.accumulate(lying_channels_last), expected)
