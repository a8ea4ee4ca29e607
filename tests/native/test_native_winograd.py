"""s16's 3×3 stride-1 convolutions by integer Winograd F(2×2, 3×3), dilated ones phase by phase: the same
bits as the NumPy oracle and as the direct kernel (LPT_WINOGRAD=0), on the extremes where its transforms
are tightest. LPT_WINOGRAD=1 forces it on maps too small for it to pay."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lpt.native
from lpt.kernels import Relu
from lpt.kernels.output_stage import output_stage
from lpt.kernels.reference import conv_reference

# (Without the engine, tests/native/conftest.py skips these, or fails them in CI, which builds it.)
pytestmark = pytest.mark.skipif(lpt.native.available() and not lpt.native.engine.s16_supported(),
                                reason="this CPU has no AVX2, so it has no s16 route to run Winograd on")

MAX_CHANNELS = 1824  # s16.h: WINOGRAD_MAX_CHANNELS, where 4·acc still fits int32 at the extremes


def conv(weights, zero_point, pads, winograd, monkeypatch, dilations=(1, 1), **stage):
    monkeypatch.setenv("LPT_WINOGRAD", "1" if winograd else "0")  # read when the operation is made: forced either way
    return lpt.native.Conv(weights, src_zero_point=zero_point, pads=pads, dilations=dilations, route="s16", threads=2,
                           **stage)


@st.composite
def cases(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = draw(st.sampled_from([np.uint8, np.int8]))
    info = np.iinfo(dtype)
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    dilations = draw(st.sampled_from([(1, 1), (1, 1), (2, 1), (1, 2), (2, 3), (3, 3)]))
    h = draw(st.integers(max(1, 2 * dilations[0] + 1 - pads[0] - pads[2]), 13))
    w = draw(st.integers(max(1, 2 * dilations[1] + 1 - pads[1] - pads[3]), 13))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 40)), h, w)
    kind = draw(st.sampled_from(["random", "random", "ends", "max", "min"]))
    if kind == "random":
        src = rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)
        weights = rng.integers(-128, 128, (draw(st.integers(1, 40)), shape[1], 3, 3)).astype(np.int8)
    else:
        pick = {"ends": lambda s, lo, hi: rng.choice(np.array([lo, hi]), s), "max": lambda s, lo, hi: np.full(s, hi),
                "min": lambda s, lo, hi: np.full(s, lo)}[kind]
        src = pick(shape, info.min, info.max).astype(dtype)
        weights = pick((draw(st.integers(1, 40)), shape[1], 3, 3), -128, 127).astype(np.int8)
    zero_point = draw(st.sampled_from([0, int(info.min), int(info.max), int(rng.integers(info.min, info.max + 1))]))
    if draw(st.booleans()):  # a channels-last source, as a previous layer leaves it, seen as [N, C, H, W]
        src = np.moveaxis(np.ascontiguousarray(np.moveaxis(src, 1, -1)), -1, 1)
    channels_last = draw(st.booleans())  # the output's layout
    return src, weights, zero_point, pads, dilations, channels_last


@given(case=cases())
@settings(max_examples=80, deadline=None)
def test_accumulators_equal_the_reference_and_the_direct_kernel(case):
    src, weights, zero_point, pads, dilations, channels_last = case
    expected = conv_reference(src, weights, zero_point, pads=pads, dilations=dilations)
    with pytest.MonkeyPatch.context() as monkeypatch:
        for winograd in (True, False):
            operation = conv(weights, zero_point, pads, winograd, monkeypatch, dilations)
            got = operation.accumulate(src, channels_last=channels_last)
            assert np.array_equal(got, expected), f"winograd={winograd}"
            assert (operation.implementation == "lpt:s16_winograd_avx2") == (winograd and src.shape[1] >= 16)


@given(case=cases())
@settings(max_examples=40, deadline=None)
def test_the_output_stage_in_registers_equals_lpts_numpy_output_stage(case):
    src, weights, zero_point, pads, dilations, channels_last = case
    rng = np.random.default_rng(int(weights.size))
    multiplier = rng.uniform(1e-4, 1e-2, weights.shape[0]).astype(np.float32)
    bias = rng.normal(0, 1, weights.shape[0]).astype(np.float32)
    stage = dict(multiplier=multiplier, bias=bias, post_ops=(Relu(),), dst_scale=0.05, dst_zero_point=7,
                 dst_dtype=np.uint8)
    accumulators = conv_reference(src, weights, zero_point, pads=pads, dilations=dilations)
    expected = output_stage(accumulators, multiplier, bias, (Relu(),), 0.05, 7, 0, 255)
    with pytest.MonkeyPatch.context() as monkeypatch:
        got = conv(weights, zero_point, pads, True, monkeypatch, dilations, **stage)(src, channels_last=channels_last)
    assert got.dtype == np.uint8 and np.array_equal(got, expected)


@pytest.mark.parametrize("channels, implementation", [(MAX_CHANNELS, "lpt:s16_winograd_avx2"),
                                                      (MAX_CHANNELS + 2, "lpt:s16_avx2")])
def test_the_largest_sums_stay_exact_and_longer_reductions_take_the_direct_kernel(channels, implementation,
                                                                                 monkeypatch):
    # every product at its largest, (0 − 255)·(−128): 4× the accumulator is within a hair of 2^31
    src = np.zeros((1, channels, 4, 4), np.uint8)
    weights = np.full((3, channels, 3, 3), -128, np.int8)
    operation = conv(weights, 255, (0, 0, 0, 0), True, monkeypatch)
    got = operation.accumulate(src)
    assert operation.implementation == implementation
    assert np.all(got == channels * 9 * 255 * 128)
    assert np.array_equal(got, conv_reference(src, weights, 255))


def test_by_default_winograd_runs_on_maps_where_it_pays(monkeypatch):
    monkeypatch.delenv("LPT_WINOGRAD", raising=False)
    monkeypatch.setenv("LPT_S16_BYTES", "0")  # the int16 direct kernel, whatever CI's s16 pass sets
    rng = np.random.default_rng(3)
    weights = rng.integers(-128, 128, (24, 16, 3, 3)).astype(np.int8)
    operation = lpt.native.Conv(weights, pads=(1, 1, 1, 1), src_zero_point=9, route="s16", threads=2)
    for size, implementation in ((3, "lpt:s16_avx2"), (7, "lpt:s16_winograd_avx2"), (3, "lpt:s16_avx2")):
        src = rng.integers(0, 256, (1, 16, size, size)).astype(np.uint8)
        assert np.array_equal(operation.accumulate(src), conv_reference(src, weights, 9, pads=(1, 1, 1, 1)))
        assert operation.implementation == implementation


@pytest.mark.parametrize("dilations", [(2, 1), (1, 2), (3, 2)])
def test_a_dilated_layer_takes_winograd_by_default_with_the_references_bits(dilations, monkeypatch):
    """plcmos_v2's layers: 3×3 dilated along time. Each phase of the map (rows and columns modulo the
    dilations) is an undilated convolution; the phases' maps differ in size by up to a row and a column."""
    monkeypatch.delenv("LPT_WINOGRAD", raising=False)
    rng = np.random.default_rng(5)
    weights = rng.integers(-128, 128, (40, 32, 3, 3)).astype(np.int8)
    src = rng.integers(0, 256, (2, 32, 23, 17)).astype(np.uint8)
    operation = lpt.native.Conv(weights, pads=(1, 1, 1, 1), dilations=dilations, src_zero_point=100, route="s16",
                                threads=2)
    expected = conv_reference(src, weights, 100, pads=(1, 1, 1, 1), dilations=dilations)
    assert np.array_equal(operation.accumulate(src), expected)
    assert operation.implementation == "lpt:s16_winograd_avx2"


def test_the_report_names_the_layers_winograd_computed(monkeypatch):
    import lpt as toolkit
    from lpt.backend import compile_model
    from lpt.native import routes
    from tests.transformations.builders import Graph

    monkeypatch.setattr(routes, "route", lambda: "s16")  # the plan's layers on s16 on any CPU, VNNI too

    g = Graph()
    wide = g.op("Relu", [g.fq(g.op("Conv", [g.fq("x", 0.02, np.uint8(100)), g.weight((16, 3, 3, 3))], pads=[1] * 4),
                              0.05, np.uint8(0))])
    g.op("Conv", [wide, g.weight((8, 16, 3, 3))], pads=[1, 1, 1, 1], name="y")  # 16 channels in: Winograd
    _, m = g.build({"x": [1, 3, 8, 8]}, ["y"])
    toolkit.transform(m)
    plan = compile_model(m)
    plan.run({"x": np.random.default_rng(0).uniform(-2, 3, (1, 3, 8, 8)).astype(np.float32)})
    assert plan.engine_counts() == {lpt.native.engine_name("s16"): 1, lpt.native.WINOGRAD_ENGINE: 1}
