"""ConstantInt8Gemm (MLAS through onnxruntime) against int64 products, and the saturation probe."""

from __future__ import annotations

import numpy as np
import pytest

from lpt.kernels import int8_gemm
from lpt.kernels.int8_gemm import MAX_REDUCTION, ConstantInt8Gemm, mlas_is_exact

# On a CPU whose MLAS kernel clamps pair sums (AVX2 without VNNI) lpt never uses MLAS, so there is
# nothing of it to check there; the probe test below runs everywhere.
needs_exact_mlas = pytest.mark.skipif(not mlas_is_exact(), reason="this CPU's MLAS u8·s8 kernel clamps int16 pair "
                                      "sums, so lpt takes its f32 BLAS route (tested in test_exact_gemm.py)")


@needs_exact_mlas
@pytest.mark.parametrize("zero_point", [0, 1, 128, 255])
def test_random_products_are_exact(zero_point):
    rng = np.random.default_rng(zero_point)
    a = rng.integers(0, 256, (37, 300)).astype(np.uint8)
    b = rng.integers(-128, 128, (300, 19)).astype(np.int8)
    expected = (a.astype(np.int64) - zero_point) @ b.astype(np.int64)
    result = ConstantInt8Gemm(b)(a, zero_point)
    assert result.dtype == np.int32
    np.testing.assert_array_equal(result, expected)


@needs_exact_mlas
def test_extremes_over_a_long_reduction():
    """255·(−128) summed over K = 20 000: −652 800 000, every int16 pair sum far past its limit."""
    gemm = ConstantInt8Gemm(np.full((20000, 3), -128, np.int8))
    assert np.all(gemm(np.full((2, 20000), 255, np.uint8)) == 20000 * 255 * -128)
    assert np.all(gemm(np.full((2, 20000), 0, np.uint8), 255) == 20000 * -255 * -128)


def test_a_reduction_that_could_overflow_int32_is_refused():
    with pytest.raises(ValueError, match="overflow"):
        ConstantInt8Gemm(np.zeros((MAX_REDUCTION + 1, 1), np.int8))
    assert MAX_REDUCTION * 255 * 128 <= 2**31 - 1 < (MAX_REDUCTION + 1) * 255 * 128


def test_the_probe_catches_a_kernel_that_saturates_pair_sums(monkeypatch):
    """A stand-in for AVX2's vpmaddubsw: products summed in pairs, each pair clamped to int16."""

    class PairSaturating:
        def __init__(self, weights, threads=0):
            self.weights = weights.astype(np.int64)

        def __call__(self, a, a_zero_point=0):
            products = a.astype(np.int64)[:, :, None] * self.weights[None]
            k = products.shape[1] // 2 * 2
            pairs = np.clip(products[:, :k:2] + products[:, 1:k:2], -32768, 32767)
            return (pairs.sum(axis=1) + products[:, k:].sum(axis=1)).astype(np.int32)

    monkeypatch.setattr(int8_gemm, "ConstantInt8Gemm", PairSaturating)
    mlas_is_exact.cache_clear()
    try:
        assert not int8_gemm.mlas_is_exact()
    finally:
        monkeypatch.undo()
        mlas_is_exact.cache_clear()
