"""lpt.native.MatMul against lpt's NumPy oracle: int32 accumulators and the output stage, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lpt.native
from lpt.kernels import Clip, Gelu, HardSwish, LeakyRelu, Relu, Sigmoid, Silu
from lpt.kernels.output_stage import output_stage
from lpt.kernels.matmul import matmul_accumulate
from lpt.kernels.reference import conv_reference, matmul_reference

ROUTES = sorted(set(lpt.native.exact_routes()) | {"split"})

GELU = Gelu(1.4142135, 1.0, 0.5)  # x·(erf(x / √2) + 1)·0.5, PaddleOCR's


@st.composite
def matmul_cases(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    leading = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    k, n = draw(st.integers(1, 300)), draw(st.integers(1, 40))
    src_dtype = draw(st.sampled_from([np.uint8, np.int8]))
    info = np.iinfo(src_dtype)
    kind = draw(st.sampled_from(["random", "random", "extremes", "one-hot", "one-hot and a dense row"]))
    zero_point = draw(st.sampled_from([0, int(info.min), int(info.max), int(rng.integers(info.min, info.max + 1))]))
    weights = rng.integers(-128, 128, (k, n)).astype(np.int8)
    if kind == "extremes":
        src = np.full(leading + (k,), info.max, src_dtype)
        weights = rng.choice(np.array([-128, 127], np.int8), (k, n))
    elif kind.startswith("one-hot"):  # rows of the zero point but for one value, or none (the engine's gather)
        src = np.full(leading + (k,), zero_point, src_dtype).reshape(-1, k)
        hot = rng.random(len(src)) < 0.8
        src[hot, rng.integers(0, k, hot.sum())] = rng.integers(info.min, int(info.max) + 1, hot.sum())
        if kind.endswith("dense row"):  # the kernel then runs every row
            src[rng.integers(0, len(src))] = rng.integers(info.min, int(info.max) + 1, k)
        src = src.reshape(leading + (k,))
    else:
        src = rng.integers(info.min, int(info.max) + 1, leading + (k,)).astype(src_dtype)
    return src, weights, zero_point, rng


@pytest.mark.parametrize("route", ROUTES)
@given(case=matmul_cases())
@settings(max_examples=60, deadline=None)
def test_accumulators_equal_the_reference(route, case):
    src, weights, zero_point, _ = case
    matmul = lpt.native.MatMul(weights, src_zero_point=zero_point, route=route, threads=1)
    assert np.array_equal(matmul.accumulate(src), matmul_reference(src, zero_point, weights, 0))


@pytest.mark.parametrize("route", ROUTES)
@given(case=matmul_cases(), later=st.lists(st.integers(0, 255), min_size=1, max_size=3))
@settings(max_examples=30, deadline=None)
def test_a_zero_point_given_at_each_run(route, case, later):
    src, weights, zero_point, _ = case
    matmul = lpt.native.MatMul(weights, src_zero_point=zero_point, route=route, threads=1)
    shift = 0 if src.dtype == np.uint8 else 128
    for run_zero_point in [z - shift for z in later] + [0]:
        assert np.array_equal(matmul.accumulate(src, src_zero_point=run_zero_point),
                              matmul_reference(src, run_zero_point, weights, 0))
    assert np.array_equal(matmul.accumulate(src), matmul_reference(src, zero_point, weights, 0))


@pytest.mark.parametrize("route", ROUTES)
@given(case=matmul_cases(), per_column=st.booleans(), bias=st.booleans(),
       destination=st.sampled_from([(None, 0, None), (0.03, 7, np.uint8), (0.5, -3, np.int8)]),
       post_ops=st.lists(st.sampled_from([Relu(), Clip(-0.5, 0.7), LeakyRelu(0.2), Sigmoid(), Silu(), HardSwish(float(np.float32(1 / 6)), 0.5), GELU]), max_size=2))
@settings(max_examples=30, deadline=None)
def test_output_stage_equals_lpts_numpy_output_stage(route, case, per_column, bias, destination, post_ops):
    src, weights, zero_point, rng = case
    columns = weights.shape[1]
    multiplier = rng.uniform(1e-4, 1e-2, columns if per_column else 1).astype(np.float32)
    bias = rng.normal(0, 1, columns).astype(np.float32) if bias else None
    dst_scale, dst_zero_point, dst_dtype = destination
    matmul = lpt.native.MatMul(weights, src_zero_point=zero_point, multiplier=multiplier, bias=bias,
                               post_ops=tuple(post_ops), dst_scale=dst_scale, dst_zero_point=dst_zero_point,
                               dst_dtype=dst_dtype, route=route, threads=1)
    info = np.iinfo(dst_dtype) if dst_dtype else np.iinfo(np.uint8)
    acc = matmul_reference(src, zero_point, weights, 0).astype(np.int32)
    expected = output_stage(acc, multiplier, bias, tuple(post_ops),
                            None if dst_scale is None else np.float32(dst_scale), np.int32(dst_zero_point),
                            int(info.min), int(info.max), axis=-1)
    got = matmul(src)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert np.array_equal(got.view(np.uint8), np.ascontiguousarray(expected).view(np.uint8))


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("columns", [1, 2, 4, 8])
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 300), narrow=st.booleans(),
       destination=st.sampled_from([(None, 0, None), (0.03, 7, np.uint8), (0.5, -3, np.int8)]),
       post_ops=st.sampled_from([(), (Relu(),), (Clip(-0.5, 0.7),), (Sigmoid(),), (GELU,), (LeakyRelu(0.2),)]))
@settings(max_examples=12, deadline=None)
def test_a_head_of_few_columns_stages_its_rows_sixteen_values_at_a_time(route, columns, seed, rows, narrow,
                                                                        destination, post_ops):
    """Rows of 1, 2, 4 or 8 channels one after the other are staged as rows of sixteen values, each lane with its
    channel's multiplier and bias (PaddleOCR's detector's last upsampling: four a pixel and a Sigmoid), the rows
    past the last whole register one by one: every value the reference's. Multipliers and biases differ from
    channel to channel, and `narrow` ones leave each level one margin (the fused stage's)."""
    rng = np.random.default_rng(seed)
    weights = rng.integers(-128, 128, (24, columns)).astype(np.int8)
    src = rng.integers(0, 256, (rows, 24)).astype(np.uint8)
    dst_scale, dst_zero_point, dst_dtype = destination
    multiplier = rng.uniform(1e-4, 1e-2, columns).astype(np.float32)
    if narrow and dst_scale is not None:  # each channel's largest accumulator at 50-200 levels
        largest = 255.0 * np.abs(weights.astype(np.float64)).sum(axis=0)
        multiplier = (rng.uniform(50, 200, columns) * dst_scale / np.maximum(largest, 1)).astype(np.float32)
    bias = rng.normal(0, 1, columns).astype(np.float32)
    matmul = lpt.native.MatMul(weights, src_zero_point=100, multiplier=multiplier, bias=bias, post_ops=post_ops,
                               dst_scale=dst_scale, dst_zero_point=dst_zero_point, dst_dtype=dst_dtype, route=route,
                               threads=2)
    info = np.iinfo(dst_dtype) if dst_dtype else np.iinfo(np.uint8)
    expected = output_stage(matmul_reference(src, 100, weights, 0).astype(np.int32), multiplier, bias, post_ops,
                            None if dst_scale is None else np.float32(dst_scale), np.int32(dst_zero_point),
                            int(info.min), int(info.max), axis=-1)
    got = matmul(src)
    assert got.dtype == expected.dtype
    assert np.array_equal(got.view(np.uint8), np.ascontiguousarray(expected).view(np.uint8))


@pytest.mark.parametrize("route", sorted(set(lpt.native.exact_routes()) - {"s16"}))  # oneDNN's: s16 has no bands
@pytest.mark.parametrize("rows", [2, 3, 7])
def test_rows_in_bands_sum_what_one_primitive_does(route, rows):
    """Over a million products, each of two threads runs a band of the rows (an odd count splits unevenly)."""
    rng = np.random.default_rng(rows)
    weights = rng.integers(-128, 128, (1024, 600)).astype(np.int8)
    src = rng.integers(0, 256, (rows, 1024)).astype(np.uint8)
    matmul = lpt.native.MatMul(weights, src_zero_point=7, route=route, threads=2)
    assert np.array_equal(matmul.accumulate(src), matmul_reference(src, 7, weights, 0))


@pytest.mark.parametrize("rows", [1, 40])
def test_a_head_of_few_rows_splits_its_columns(rows):
    """Weights of 300 KB against a source of a few rows (a classifier head): on route u8s8 each thread computes and
    stages a band of columns (496 + 504) with those columns' weights; the NumPy levels and accumulators."""
    rng = np.random.default_rng(rows)
    weights = rng.integers(-128, 128, (300, 1000)).astype(np.int8)
    src = rng.integers(0, 256, (rows, 300)).astype(np.uint8)
    multiplier = rng.uniform(1e-5, 3e-5, 1000).astype(np.float32)
    bias = rng.normal(0, 0.5, 1000).astype(np.float32)
    matmul = lpt.native.MatMul(weights, src_zero_point=7, multiplier=multiplier, bias=bias, post_ops=(Relu(),),
                               dst_scale=np.float32(0.02), dst_zero_point=3, dst_dtype=np.uint8, threads=2)
    accumulators = matmul_reference(src, 7, weights, 0)
    expected = output_stage(accumulators.astype(np.int32), multiplier, bias, (Relu(),), np.float32(0.02), np.int32(3),
                            0, 255, axis=-1)
    assert 0.2 < np.count_nonzero(expected > 3) / expected.size < 0.8
    assert np.array_equal(matmul(src), expected)
    assert np.array_equal(matmul.accumulate(src), accumulators)


def test_a_long_reduction_at_the_extremes():
    k = 5000
    weights = np.tile(np.array([[127, -128, 1]], np.int8), (k, 1))
    src = np.full((3, k), 255, np.uint8)
    matmul = lpt.native.MatMul(weights, threads=2)
    assert np.array_equal(matmul.accumulate(src), matmul_reference(src, 0, weights, 0))


@st.composite
def product_cases(draw):
    """Two operands that both arrive at run time: [..., M, K] × [..., K, N], u8 or s8 each, at the extremes too."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    leading = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    m, k, n = draw(st.integers(1, 20)), draw(st.integers(1, 70)), draw(st.integers(1, 40))
    operands, zero_points = [], []
    for shape in (leading + (m, k), leading + (k, n)):
        info = np.iinfo(draw(st.sampled_from([np.uint8, np.int8])))
        if draw(st.sampled_from(["random", "random", "extremes"])) == "extremes":
            operands.append(rng.choice(np.array([info.min, info.max], info.dtype), shape))
        else:
            operands.append(rng.integers(info.min, int(info.max) + 1, shape).astype(info.dtype))
        zero_points.append(draw(st.sampled_from([0, int(info.min), int(info.max)])))
    return operands, zero_points, rng


@given(case=product_cases(), per_column=st.booleans(), bias=st.booleans(),
       destination=st.sampled_from([(None, 0, None), (0.03, 7, np.uint8), (0.5, -3, np.int8)]),
       post_ops=st.lists(st.sampled_from([Relu(), Clip(-0.5, 0.7), LeakyRelu(0.2), Sigmoid(), Silu(), HardSwish(float(np.float32(1 / 6)), 0.5), GELU]), max_size=2),
       threads=st.sampled_from([1, 2]))
@settings(max_examples=60, deadline=None)
def test_a_product_of_two_activations_equals_lpts_kernels(case, per_column, bias, destination, post_ops, threads):
    (a, b), (za, zb), rng = case
    columns = b.shape[-1]
    multiplier = rng.uniform(1e-4, 1e-2, columns if per_column else 1).astype(np.float32)
    bias = rng.normal(0, 1, columns).astype(np.float32) if bias else None
    dst_scale, dst_zero_point, dst_dtype = destination
    product = lpt.native.Product(a_zero_point=za, b_zero_point=zb, multiplier=multiplier, bias=bias,
                                 post_ops=tuple(post_ops), dst_scale=dst_scale, dst_zero_point=dst_zero_point,
                                 dst_dtype=dst_dtype, threads=threads)
    info = np.iinfo(dst_dtype) if dst_dtype else np.iinfo(np.uint8)
    acc = matmul_accumulate(a, za, b, zb).astype(np.int32)
    expected = output_stage(acc, multiplier, bias, tuple(post_ops),
                            None if dst_scale is None else np.float32(dst_scale), np.int32(dst_zero_point),
                            int(info.min), int(info.max), axis=-1)
    got = product(a, b)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert np.array_equal(got.view(np.uint8), np.ascontiguousarray(expected).view(np.uint8))


def test_a_product_that_would_broadcast_is_refused_for_lpts_kernels():
    product = lpt.native.Product(multiplier=np.float32(0.5))
    with pytest.raises(lpt.native.Unsupported, match="broadcasting"):
        product(np.ones((2, 3, 4), np.uint8), np.ones((1, 4, 5), np.uint8))
    with pytest.raises(lpt.native.Unsupported, match="per-row or per-column"):
        lpt.native.Product(a_zero_point=np.array([1, 2], np.uint8))


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("dst_dtype, zero_point", [(np.uint8, 3), (np.int8, -7)])
def test_levels_on_and_next_to_halves_round_as_lpts_numpy_output_stage(route, dst_dtype, zero_point):
    """Every value one or two float32 steps either side of k + 1/2, where any shortcut for x / scale
    (a product with 1 / scale, say) would round some of them the other way."""
    scale = np.float32(0.0373)
    acc = np.arange(-128, 128, dtype=np.int32)  # q − 128 for every q: every odd one a half
    src = np.repeat((acc + 128).astype(np.uint8)[:, None], 2, axis=1)
    steps = np.arange(-24, 24, dtype=np.int32)  # multipliers 24 float32 steps either side of scale / 2
    multiplier = (np.float32(scale / 2).view(np.int32) + steps).view(np.float32)
    weights = np.zeros((2, steps.size), np.int8)
    weights[0] = 1
    stage = dict(multiplier=multiplier, dst_scale=scale, dst_zero_point=zero_point, dst_dtype=dst_dtype)
    got = lpt.native.MatMul(weights, src_zero_point=128, route=route, threads=1, **stage)(src)
    info = np.iinfo(dst_dtype)
    expected = output_stage(acc[:, None] * np.ones(steps.size, np.int32), multiplier, None, (), scale, zero_point,
                            int(info.min), int(info.max), axis=-1)
    assert got.dtype == dst_dtype and np.array_equal(got, expected)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("rows", [1, 19])  # less than a tile of s16, and whole tiles with a remainder
def test_sigmoid_in_the_output_stage_is_lpts_numpy_sigmoid_over_the_float_range(route, rows):
    """x = acc·m + bias over float32 from 1e−30 to beyond overflow, both signs, ±0, ±inf and NaN: the
    engine's Sigmoid (scalar and eight lanes) gives the bits of lpt.numerics.exp, and with a destination
    the same levels."""
    rng = np.random.default_rng(3)
    magnitudes = np.float32(10.0) ** np.linspace(-30, 3, 63, dtype=np.float32)
    bias = np.concatenate([magnitudes, -magnitudes, np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 86.5, -87.5])])
    multiplier = np.where(rng.random(bias.size) < 0.5, np.float32(0.0), rng.uniform(1e-3, 0.2, bias.size)).astype(np.float32)
    weights = np.ones((1, bias.size), np.int8)
    src = rng.integers(0, 256, (rows, 1)).astype(np.uint8)
    acc = (src.astype(np.int32) - 128) * np.ones(bias.size, np.int32)
    for destination in [dict(), dict(dst_scale=np.float32(1 / 255), dst_zero_point=0, dst_dtype=np.uint8)]:
        matmul = lpt.native.MatMul(weights, src_zero_point=128, multiplier=multiplier, bias=bias, post_ops=(Sigmoid(),),
                                   route=route, threads=1, **destination)
        expected = output_stage(acc, multiplier, bias, (Sigmoid(),), destination.get("dst_scale"), np.int32(0), 0, 255,
                                axis=-1)
        got = matmul(src)
        assert got.dtype == expected.dtype and np.array_equal(got.view(np.uint8), expected.view(np.uint8))


@pytest.mark.skipif(lpt.native.available() and not lpt.native.engine.s16_supported(),
                    reason="this CPU has no AVX2, so it has no s16 route, the one with row tiles")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("k, n", [(1, 16), (7, 40), (33, 64), (300, 149), (1031, 530)])
def test_one_row_takes_row_tiles_with_the_same_values(k, n, threads):
    """One row (a recurrence's step at batch 1) runs on s16's row tiles, up to four blocks of sixteen
    outputs per broadcast (149 outputs: groups of 4, 4 and 2 blocks, the last block of 5 outputs), and
    past 256 kB of int16 weights on an int8 copy of them ([1031, 530], also enough work for two threads),
    at the extremes too: the accumulators and output stage of the reference, as the same weights give
    with three rows (tiles of positions, the int16 weights)."""
    rng = np.random.default_rng(k * n)
    weights = rng.integers(-128, 128, (k, n)).astype(np.int8)
    weights[:, :3] = -128
    src = rng.integers(0, 256, (3, k)).astype(np.uint8)
    src[0, ::2] = 255
    multiplier = rng.uniform(1e-5, 1e-4, n).astype(np.float32)
    bias = rng.normal(0, 1, n).astype(np.float32)
    native = lpt.native.MatMul(weights, src_zero_point=9, multiplier=multiplier, bias=bias, dst_scale=np.float32(0.02),
                               dst_zero_point=np.int32(3), dst_dtype=np.uint8, route="s16", threads=threads)
    reference = matmul_reference(src, 9, weights, 0).astype(np.int32)
    expected = output_stage(reference, multiplier, bias, (), np.float32(0.02), np.int32(3), 0, 255, axis=-1)
    for row in range(len(src)):
        assert np.array_equal(native.accumulate(src[row:row + 1]), reference[row:row + 1])
        assert np.array_equal(native(src[row:row + 1]), expected[row:row + 1])
    assert np.array_equal(native(src), expected)


@pytest.mark.skipif(lpt.native.available() and not lpt.native.engine.s16_supported(),
                    reason="this CPU has no AVX2, so it has no s16 route, the one with row tiles")
@pytest.mark.parametrize("one_d", [False, True])
def test_a_convolution_of_one_output_position_takes_row_tiles(one_d):
    """A 3×3 (or 3) convolution padded over a 1×1 (or 1) map has one output position per image: s16's row
    tiles walk its kernel rows over the padded source, for each image of a batch."""
    rng = np.random.default_rng(5)
    kernel = (3,) if one_d else (3, 3)
    weights = rng.integers(-128, 128, (70, 21) + kernel).astype(np.int8)
    src = rng.integers(0, 256, (3, 21) + (1,) * len(kernel)).astype(np.uint8)
    pads = (1, 1) * len(kernel)
    native = lpt.native.Conv(weights, pads=pads, src_zero_point=200, route="s16", threads=2)
    assert np.array_equal(native.accumulate(src), conv_reference(src, weights, 200, pads=list(pads)))


@pytest.mark.skipif(lpt.native.available() and not lpt.native.engine.s16_supported(),
                    reason="this CPU has no AVX2, so it has no s16 route, the one that keeps large weights as int8")
@pytest.mark.parametrize("layer", ["matmul", "1x1 conv"])
@pytest.mark.parametrize("n", [7003, 6997])  # a last block of 11 outputs, and one of 5 (walked with the block before it)
def test_weights_past_the_caches_read_as_int8_give_the_same_values(layer, n):
    """Weights over 4 MB as int16 (a classifier of thousands of classes) are kept as int8 and widened by
    the s16 kernel as it reads them: the accumulators and the output stage are those of the reference,
    at the extremes of both operands too, in whole and partial blocks of sixteen outputs and position tiles."""
    rng = np.random.default_rng(17)
    k = 300  # 2.1 M weights: 4.2 MB as int16
    weights = rng.integers(-128, 128, (k, n)).astype(np.int8)
    weights[:, :5] = -128  # the extremes: the widened products' largest magnitude
    src = rng.integers(0, 256, (13, k)).astype(np.uint8)
    src[0] = 255
    multiplier = rng.uniform(1e-5, 1e-4, n).astype(np.float32)
    if layer == "matmul":
        native = lpt.native.MatMul(weights, src_zero_point=0, multiplier=multiplier, route="s16", threads=2)
        accumulators = native.accumulate(src)
        values = native(src)
        reference = matmul_reference(src, 0, weights, 0)
    else:  # [N, K, 1, 13] → [N, n, 1, 13]
        conv_weights = np.ascontiguousarray(weights.T).reshape(n, k, 1, 1)
        native = lpt.native.Conv(conv_weights, src_zero_point=0, multiplier=multiplier, route="s16", threads=2)
        image = np.ascontiguousarray(src.T).reshape(1, k, 1, 13)
        accumulators = native.accumulate(image)[0, :, 0, :].T
        values = native(image)[0, :, 0, :].T
        reference = matmul_reference(src, 0, weights, 0)
    assert np.array_equal(accumulators, reference)
    assert np.array_equal(values, output_stage(reference.astype(np.int32), multiplier, None, (), None, np.int32(0), 0, 255, axis=-1))


@pytest.mark.skipif(lpt.native.available() and not lpt.native.engine.s16_supported(),
                    reason="this CPU has no AVX2, which the gather of weight rows is written for")
@pytest.mark.parametrize("route", sorted(set(ROUTES) | {"u8s8"}))
def test_a_one_hot_source_is_a_gather_of_weight_rows(route):
    """magika's bytes as a one-hot of 257 classes times its first Dense: each row of the source is its zero
    point but for one value (or none), so the engine adds one weight row per source row instead of all K,
    on any route; the same accumulators and output stage. A row of two values sends it to the kernel. Weights
    within ±60 keep u8s8's int16 pair sums exact on any CPU, so the VNNI route's kernel runs here too."""
    rng = np.random.default_rng(23)
    k, n, rows, zero_point = 257, 128, 600, 3
    weights = rng.integers(-60, 61, (k, n)).astype(np.int8)
    src = np.full((rows, k), zero_point, np.uint8)
    src[np.arange(rows - 1), rng.integers(0, k, rows - 1)] = 255  # the last row: zero points only
    multiplier = rng.uniform(1e-3, 1e-2, n).astype(np.float32)
    matmul = lpt.native.MatMul(weights, src_zero_point=zero_point, multiplier=multiplier, dst_scale=np.float32(0.05),
                               dst_zero_point=2, dst_dtype=np.uint8, route=route, threads=2)
    for source, implementation in ((src, "lpt:rows_avx2"), (np.vstack([src, np.full((1, k), 9, np.uint8)]), None)):
        acc = matmul_reference(source, zero_point, weights, 0).astype(np.int32)
        assert np.array_equal(matmul.accumulate(source), acc)
        expected = output_stage(acc, multiplier, None, (), np.float32(0.05), np.int32(2), 0, 255, axis=-1)
        assert np.array_equal(matmul(source), expected)
        assert (matmul.implementation == "lpt:rows_avx2") == (implementation is not None)
