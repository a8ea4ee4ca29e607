"""ConstantInt8Gemm (MLAS through onnxruntime) against int64 products, the saturation probe and the route choice."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from lpt.kernels import int8_gemm
from lpt.kernels.int8_gemm import MAX_REDUCTION, ROUTE_VARIABLE, ConstantInt8Gemm, exact_routes, gemm_route

# A route that saturates on this CPU is one lpt never takes, so there is nothing of it to check here.
EXACT_ROUTES = [pytest.param(route, marks=pytest.mark.skipif(
    route not in exact_routes(), reason=f"this CPU's MLAS {route} kernel clamps int16 pair sums, so lpt never takes it"))
    for route in int8_gemm.ROUTES]


@pytest.mark.parametrize("route", EXACT_ROUTES)
@pytest.mark.parametrize("zero_point", [0, 1, 128, 255])
def test_random_products_are_exact(zero_point, route):
    rng = np.random.default_rng(zero_point)
    a = rng.integers(0, 256, (37, 300)).astype(np.uint8)
    b = rng.integers(-128, 128, (300, 19)).astype(np.int8)
    expected = (a.astype(np.int64) - zero_point) @ b.astype(np.int64)
    result = ConstantInt8Gemm(b, route=route)(a, zero_point)
    assert result.dtype == np.int32
    np.testing.assert_array_equal(result, expected)


@pytest.mark.parametrize("route", EXACT_ROUTES)
def test_extremes_over_a_long_reduction(route):
    """255·(−128) summed over K = 20 000: −652 800 000, every int16 pair sum far past its limit."""
    gemm = ConstantInt8Gemm(np.full((20000, 3), -128, np.int8), route=route)
    assert np.all(gemm(np.full((2, 20000), 255, np.uint8)) == 20000 * 255 * -128)
    assert np.all(gemm(np.full((2, 20000), 0, np.uint8), 255) == 20000 * -255 * -128)


def test_a_cpu_has_at_least_one_exact_route():
    """u8 × s8 with VNNI, u8 × u8 (widened before it multiplies) without: MLAS's fast route exists on AVX2 too."""
    assert exact_routes(), "neither MLAS route is exact on this CPU: lpt runs its f32 BLAS route only"


def test_a_reduction_that_could_overflow_int32_is_refused():
    with pytest.raises(ValueError, match="overflow"):
        ConstantInt8Gemm(np.zeros((MAX_REDUCTION + 1, 1), np.int8))
    assert MAX_REDUCTION * 255 * 128 <= 2**31 - 1 < (MAX_REDUCTION + 1) * 255 * 128


def test_the_probe_catches_a_kernel_that_saturates_pair_sums(monkeypatch):
    """A stand-in for AVX2's vpmaddubsw: products summed in pairs, each pair clamped to int16."""

    class PairSaturating:
        def __init__(self, weights, threads=0, route="u8s8"):
            self.weights = weights.astype(np.int64)

        def __call__(self, a, a_zero_point=0):
            products = a.astype(np.int64)[:, :, None] * self.weights[None]
            k = products.shape[1] // 2 * 2
            pairs = np.clip(products[:, :k:2] + products[:, 1:k:2], -32768, 32767)
            return (pairs.sum(axis=1) + products[:, k:].sum(axis=1)).astype(np.int32)

    monkeypatch.setattr(int8_gemm, "ConstantInt8Gemm", PairSaturating)
    assert not int8_gemm._probe("u8s8")


@pytest.fixture
def fresh_route(monkeypatch):
    """gemm_route() read again under the environment the test sets, and forgotten afterwards."""
    gemm_route.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    gemm_route.cache_clear()


@pytest.mark.parametrize("value, expected", [("off", None), ("u8u8", "u8u8"), ("auto", exact_routes()[0])])
def test_the_route_can_be_forced(fresh_route, value, expected):
    fresh_route.setenv(ROUTE_VARIABLE, value)
    assert gemm_route() == expected


def test_a_forced_route_that_saturates_here_is_refused(fresh_route, caplog):
    fresh_route.setattr(int8_gemm, "exact_routes", lambda: ("u8u8",))
    fresh_route.setenv(ROUTE_VARIABLE, "u8s8")
    with caplog.at_level(logging.WARNING):
        assert gemm_route() == "u8u8"
    assert "saturates" in caplog.text
