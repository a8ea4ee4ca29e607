"""conv_accumulate against its int64 twin, against onnxruntime's ConvInteger, and on extreme values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpt.kernels import conv_accumulate, pack_conv
from lpt.kernels.reference import conv_reference
from tests.kernels.cases import FILLS, filled, zero_points
from tests.kernels.ort_models import run_node


@st.composite
def conv_case(draw):
    """A small 1-D or 2-D convolution: groups (1, 2 or depthwise), strides, dilations, pads, zero points, fills."""
    rank = draw(st.sampled_from([1, 2]))
    kernel = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    strides = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    dilations = draw(st.lists(st.integers(1, 2), min_size=rank, max_size=rank))
    pads = draw(st.lists(st.integers(0, 2), min_size=2 * rank, max_size=2 * rank))
    extent = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    spatial = [draw(st.integers(max(1, e - pads[i] - pads[rank + i]), e + 5)) for i, e in enumerate(extent)]
    layout = draw(st.sampled_from(["dense", "grouped", "depthwise"]))
    groups = {"dense": 1, "grouped": 2, "depthwise": draw(st.integers(1, 4))}[layout]
    in_per_group = 1 if layout == "depthwise" else draw(st.integers(1, 3))
    out_channels = groups * draw(st.integers(1, 3))
    src_dtype = draw(st.sampled_from([np.uint8, np.int8]))
    weight_dtype = draw(st.sampled_from([np.int8, np.int8, np.uint8]))
    src_zp = draw(zero_points(src_dtype))
    weight_zp = draw(st.one_of(st.just(0), zero_points(weight_dtype),
                               st.lists(zero_points(weight_dtype), min_size=out_channels, max_size=out_channels)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    src = filled(rng, [draw(st.integers(1, 2)), groups * in_per_group] + spatial, src_dtype,
                 draw(st.sampled_from(FILLS)), src_zp)
    weights = filled(rng, [out_channels, in_per_group] + kernel, weight_dtype, draw(st.sampled_from(FILLS[:3])))
    return src, weights, src_zp, weight_zp, dict(groups=groups, strides=strides, dilations=dilations, pads=pads)


ROUTES = pytest.mark.parametrize("int8_gemm", [True, False], ids=["mlas", "f32-blas"])


@ROUTES
@given(case=conv_case())
@settings(max_examples=60, deadline=None)
def test_matches_the_int64_twin(case, int8_gemm):
    src, weights, src_zp, weight_zp, attributes = case
    packed = pack_conv(weights, weight_zp, src_zp, int8_gemm=int8_gemm, **attributes)
    acc = conv_accumulate(src, packed)
    assert acc.dtype == np.int32
    expected = conv_reference(src, weights, src_zp, weight_zp, **attributes)
    np.testing.assert_array_equal(acc, expected)
    # The f32 form holds the very same integers (or, past 2^24, falls back to integers).
    np.testing.assert_array_equal(conv_accumulate(src, packed, exact_float=True), expected)


def test_exact_float_falls_back_to_integers_past_two_to_the_24():
    """K = 1152 u8·s8 products can reach 1152·255·128 > 2^24: no f32 shortcut there."""
    src = np.full((1, 128, 3, 3), 255, dtype=np.uint8)
    weights = np.full((4, 128, 3, 3), -128, dtype=np.int8)
    acc = conv_accumulate(src, pack_conv(weights, pads=[1, 1, 1, 1]), exact_float=True)
    assert acc.dtype == np.int32 and acc[0, 0, 1, 1] == 1152 * 255 * -128


@ROUTES
@pytest.mark.parametrize("depthwise", [False, True], ids=["dense", "depthwise"])
@pytest.mark.parametrize("src_value, weight_value", [(255, -128), (255, 127), (0, -128)])
def test_extremes_that_saturate_int16_pair_sums_are_exact(src_value, weight_value, depthwise, int8_gemm):
    """u8 255 · s8 −128 over K = 64·3·3 = 576 (or 7·7 taps): AVX2's vpmaddubsw would clamp each pair to −32768."""
    channels, kernel = (3, 7) if depthwise else (64, 3)
    src = np.full((1, channels, 9, 9), src_value, dtype=np.uint8)
    weights = np.full((channels, 1 if depthwise else channels, kernel, kernel), weight_value, dtype=np.int8)
    acc = conv_accumulate(src, pack_conv(weights, groups=channels if depthwise else 1, int8_gemm=int8_gemm))
    taps = kernel * kernel * (1 if depthwise else channels)
    assert np.all(acc == taps * src_value * weight_value)


def test_zero_point_padding_contributes_nothing():
    src = np.full((1, 2, 3, 3), 128, dtype=np.uint8)
    acc = conv_accumulate(src, pack_conv(np.full((1, 2, 3, 3), 100, np.int8), 0, 128, pads=[2, 2, 2, 2]))
    assert acc.shape == (1, 1, 5, 5) and not acc.any()


@ROUTES
def test_one_pack_serves_many_runs_and_batches(int8_gemm):
    rng = np.random.default_rng(1)
    weights = rng.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8)
    packed = pack_conv(weights, 0, 7, strides=[2, 2], pads=[1, 1, 1, 1], int8_gemm=int8_gemm)
    for batch in (1, 3):
        src = rng.integers(0, 256, (batch, 3, 8, 8)).astype(np.uint8)
        np.testing.assert_array_equal(conv_accumulate(src, packed),
                                      conv_reference(src, weights, 7, 0, 1, [2, 2], None, [1, 1, 1, 1]))


@pytest.mark.parametrize("layout", ["channels-first", "channels-last"])
def test_any_memory_layout_gives_the_same_integers(layout):
    """The MLAS route reads its source channels-last and leaves its result so; neither changes a value."""
    rng = np.random.default_rng(3)
    src = rng.integers(0, 256, (2, 9, 9, 5)).astype(np.uint8).transpose(0, 3, 1, 2)  # channels-last memory
    if layout == "channels-first":
        src = np.ascontiguousarray(src)
    weights = rng.integers(-128, 128, (6, 5, 3, 3)).astype(np.int8)
    packed = pack_conv(weights, 0, 3, pads=[1, 0, 2, 1])
    acc = conv_accumulate(src, packed)
    np.testing.assert_array_equal(acc, conv_reference(src, weights, 3, 0, 1, None, None, [1, 0, 2, 1]))
    if packed.int8_gemm is not None:  # MLAS leaves channels innermost: what the next convolution reads best
        assert acc.strides[1] == acc.itemsize


def test_the_mlas_route_is_taken_only_where_it_is_exact(monkeypatch):
    from lpt.kernels import conv as conv_module

    weights = np.ones((4, 2, 3, 3), np.int8)
    assert (pack_conv(weights).int8_gemm is not None) == (conv_module.gemm_route() is not None)
    assert pack_conv(weights, groups=2).int8_gemm is None  # one GEMM per group: the f32 route
    assert pack_conv(np.full((4, 2, 3, 3), 200, np.uint8)).int8_gemm is None  # W' = 200: beyond int8
    assert pack_conv(weights, int8_gemm=False).int8_gemm is None
    monkeypatch.setattr(conv_module, "gemm_route", lambda: None)
    assert pack_conv(weights).int8_gemm is None


def halved(q: np.ndarray, zero_point: int) -> tuple[np.ndarray, int]:
    """An int8 tensor and its zero point moved into [−64, 63]; uint8 ones unchanged."""
    if q.dtype != np.int8:
        return q, zero_point
    return (q // 2).astype(np.int8), zero_point // 2


@given(data=st.data())
@settings(max_examples=20, deadline=None)
def test_matches_onnxruntime_conv_integer(data):
    """Exact int32 equality with ConvInteger (per-tensor weight zero point: onnxruntime's only kind).

    int8 tensors stay within [−64, 63] so that no u8·s8 pair sum can reach int16's limits: on CPUs
    without VNNI onnxruntime's AVX2 kernel saturates those (DESIGN.md), and this test must not
    depend on the machine. The full range is covered by the twin test and the extremes above.
    """
    src, weights, src_zp, _, attributes = data.draw(conv_case())
    src, src_zp = halved(src, src_zp)
    weights, weight_zp = halved(weights, data.draw(zero_points(weights.dtype.type)))
    inputs = {"x": src, "w": weights, "x_zero_point": np.array(src_zp, src.dtype),
              "w_zero_point": np.array(weight_zp, weights.dtype)}
    groups = attributes.pop("groups")
    expected = run_node("ConvInteger", inputs, np.int32, {**attributes, "group": groups})
    np.testing.assert_array_equal(conv_accumulate(src, pack_conv(weights, weight_zp, src_zp, groups, **attributes)),
                                  expected)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("int8_gemm", [True, False], ids=["mlas", "f32-blas"])
def test_auto_pad_matches_onnx(auto_pad, int8_gemm):
    """Pads from the input's size: 5×7 with a 2×3 kernel and stride 2 needs an odd total pad along H."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(5)
    src = rng.integers(0, 256, (2, 3, 5, 7)).astype(np.uint8)
    weights = rng.integers(-128, 128, (4, 3, 2, 3)).astype(np.int8)
    node = helper.make_node("ConvInteger", ["x", "w", "xz"], ["y"], auto_pad=auto_pad, strides=[2, 2])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, None) for n, t in
                                            (("x", TensorProto.UINT8), ("w", TensorProto.INT8), ("xz", TensorProto.UINT8))],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, None)])
    expected = ReferenceEvaluator(helper.make_model(graph)).run(None, {"x": src, "w": weights, "xz": np.uint8(9)})[0]
    acc = conv_accumulate(src, pack_conv(weights, 0, 9, strides=[2, 2], auto_pad=auto_pad, int8_gemm=int8_gemm))
    assert acc.shape == expected.shape == ((2, 4, 3, 4) if auto_pad != "VALID" else (2, 4, 2, 3))
    np.testing.assert_array_equal(acc, expected)


def test_the_mlas_route_gathers_in_blocks_with_the_same_integers(monkeypatch):
    """A budget of a few rows: every image and every block of output rows is its own GEMM."""
    from lpt.kernels import conv as conv_module

    rng = np.random.default_rng(6)
    src = rng.integers(0, 256, (3, 4, 9, 7)).astype(np.uint8)
    weights = rng.integers(-128, 128, (5, 4, 3, 3)).astype(np.int8)
    packed = pack_conv(weights, 0, 17, strides=[2, 1], pads=[1, 1, 1, 1])
    if packed.int8_gemm is None:
        pytest.skip("LPT_INT8_GEMM=off: lpt takes no MLAS route here, so there is no block gather to check")
    whole = conv_accumulate(src, packed)
    monkeypatch.setattr(conv_module, "IM2COL_BYTES", 2 * 7 * 36)  # two output rows of 7 positions, 36 taps·C
    np.testing.assert_array_equal(conv_accumulate(src, packed), whole)
    np.testing.assert_array_equal(whole, conv_reference(src, weights, 17, 0, 1, [2, 1], None, [1, 1, 1, 1]))


@pytest.mark.parametrize("int8_gemm", [True, False], ids=["mlas", "f32-blas"])
def test_weights_packed_once_serve_a_zero_point_known_only_at_run_time(int8_gemm):
    from lpt.kernels.conv import with_src_zero_point

    rng = np.random.default_rng(8)
    src = rng.integers(0, 256, (2, 3, 6, 6)).astype(np.uint8)
    weights = rng.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8)
    packed = pack_conv(weights, 0, 0, pads=[1, 1, 1, 1], int8_gemm=int8_gemm)
    for zero_point in (0, 77, 255):
        np.testing.assert_array_equal(conv_accumulate(src, with_src_zero_point(packed, zero_point)),
                                      conv_reference(src, weights, zero_point, 0, 1, None, None, [1, 1, 1, 1]))
