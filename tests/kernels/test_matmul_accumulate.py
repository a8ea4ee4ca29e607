"""matmul_accumulate(_packed) against the int64 twin, onnxruntime's MatMulInteger, and extreme values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpt.kernels import matmul_accumulate, matmul_accumulate_packed, pack_matmul_weights
from lpt.kernels.reference import matmul_reference
from tests.kernels.cases import FILLS, filled, zero_points
from tests.kernels.ort_models import run_node
from tests.kernels.test_conv_accumulate import halved


@st.composite
def matmul_case(draw, per_row: bool = True):
    """a [..., M, K] and b [..., K, N] with broadcasting batch axes, per-tensor/per-row/per-column zero points."""
    m, k, n = draw(st.integers(1, 5)), draw(st.integers(1, 40)), draw(st.integers(1, 5))
    batch = draw(st.lists(st.integers(1, 3), max_size=2))
    batch_a = [draw(st.sampled_from([d, 1])) for d in batch]
    batch_b = [draw(st.sampled_from([d, 1])) for d in batch][draw(st.integers(0, len(batch))):]
    a_dtype, b_dtype = draw(st.sampled_from([np.uint8, np.int8])), draw(st.sampled_from([np.int8, np.uint8]))
    a_zp = draw(st.one_of(zero_points(a_dtype), st.lists(zero_points(a_dtype), min_size=m, max_size=m))
                if per_row else zero_points(a_dtype))
    b_zp = draw(st.one_of(zero_points(b_dtype), st.lists(zero_points(b_dtype), min_size=n, max_size=n)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    a = filled(rng, batch_a + [m, k], a_dtype, draw(st.sampled_from(FILLS)), np.ravel(a_zp)[0])
    b = filled(rng, batch_b + [k, n], b_dtype, draw(st.sampled_from(FILLS)), np.ravel(b_zp)[0])
    return a, np.asarray(a_zp), b, np.asarray(b_zp)


@given(matmul_case())
@settings(max_examples=60, deadline=None)
def test_two_activations_match_the_int64_twin(case):
    a, a_zp, b, b_zp = case
    acc = matmul_accumulate(a, a_zp, b, b_zp)
    assert acc.dtype == np.int32
    np.testing.assert_array_equal(acc, matmul_reference(a, a_zp, b, b_zp))


@pytest.mark.parametrize("int8_gemm", [True, False], ids=["mlas", "f32-blas"])
@given(case=matmul_case(), trans_a=st.booleans(), trans_b=st.booleans())
@settings(max_examples=50, deadline=None)
def test_packed_weights_match_the_int64_twin(case, trans_a, trans_b, int8_gemm):
    """Also Gemm's transA/transB: the operands are stored transposed and the kernel told so."""
    a, a_zp, b, b_zp = case
    stored_a = np.swapaxes(a, -1, -2) if trans_a else a
    stored_b = np.swapaxes(b, -1, -2) if trans_b else b
    packed = pack_matmul_weights(stored_b, b_zp, a_zp, trans_b=trans_b, int8_gemm=int8_gemm)
    np.testing.assert_array_equal(matmul_accumulate_packed(stored_a, packed, trans_a=trans_a),
                                  matmul_reference(a, a_zp, b, b_zp))
    np.testing.assert_array_equal(matmul_accumulate(stored_a, a_zp, stored_b, b_zp, trans_a, trans_b),
                                  matmul_reference(a, a_zp, b, b_zp))


def test_extremes_are_exact_over_a_long_reduction():
    """u8 255 · s8 −128 over K = 4096: −133 693 440, far past 2^24 and past every int16 pair sum."""
    a = np.full((2, 4096), 255, dtype=np.uint8)
    b = np.full((4096, 3), -128, dtype=np.int8)
    assert np.all(matmul_accumulate(a, 0, b, 0) == 4096 * 255 * -128)
    assert np.all(matmul_accumulate_packed(a, pack_matmul_weights(b)) == 4096 * 255 * -128)
    assert np.all(matmul_accumulate_packed(a, pack_matmul_weights(b, int8_gemm=False)) == 4096 * 255 * -128)
    assert np.all(matmul_accumulate(a, 255, b, 127) == 4096 * 0 * -255)


def test_the_accumulator_widens_only_past_the_int32_bound():
    a = np.full((1, 70000), 255, dtype=np.uint8)  # 70000 · 255 · 128 > 2^31 − 1: no int32 proof
    b = np.full((70000, 1), -128, dtype=np.int8)
    acc = matmul_accumulate(a, 0, b, 0)
    assert acc.dtype == np.int64 and acc[0, 0] == 70000 * 255 * -128


@given(matmul_case(per_row=False))
@settings(max_examples=20, deadline=None)
def test_matches_onnxruntime_matmul_integer(case):
    """Exact int32 equality with MatMulInteger (one zero point for a: onnxruntime's only kind); int8
    tensors within [−64, 63], for the reason the ConvInteger test gives."""
    a, a_zp, b, b_zp = case
    a, a_zp = halved(a, a_zp)
    b, b_zp = halved(b, b_zp)
    if b_zp.size > 1 and b.ndim > 2:  # onnxruntime wants a batched B's per-column zero points as [..., 1, N]
        b_zp = np.broadcast_to(b_zp, b.shape[:-2] + (1, b.shape[-1]))
    inputs = {"A": a, "B": b, "a_zero_point": np.asarray(a_zp, a.dtype), "b_zero_point": np.asarray(b_zp, b.dtype)}
    np.testing.assert_array_equal(matmul_accumulate(a, a_zp, b, b_zp), run_node("MatMulInteger", inputs, np.int32))
