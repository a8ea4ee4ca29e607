"""lpt's kernel for matmuls of a few rows (lpt/native/few_rows.cpp: a recurrent layer's h·R at each step, a batch of
one through a dense layer) against lpt's NumPy oracle, bit for bit. Each case runs on the route this process takes:
where the CPU has no AVX-512 VNNI (a Zen 3, or LPT_AVX512=off, or a forced LPT_ONEDNN=s16 or split) the kernel is
not used, and oneDNN's primitive or lpt's s16 kernel runs the same cases and must give the same bits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lpt.native
from lpt.kernels import Gelu, Relu, Sigmoid
from lpt.kernels.output_stage import output_stage
from lpt.kernels.reference import matmul_reference

FEW_ROWS = "lpt:few_rows_avx512_vnni"


def runs_here() -> bool:
    """Whether this process takes the kernel: a matmul of one row, on a CPU with AVX-512 VNNI, on route u8s8."""
    matmul = lpt.native.MatMul(np.ones((8, 16), np.int8))
    matmul.accumulate(np.arange(8, dtype=np.uint8)[None])  # not one value (a row the engine gathers instead)
    return lpt.native.engine.implementation(matmul._operation) == FEW_ROWS


@st.composite
def few_rows_cases(draw):
    """1-4 rows against weights whose columns fill one to eight blocks of sixteen, or several tiles of them, and
    whose reduction is not always a multiple of the kernel's four-byte words."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rows = draw(st.integers(1, 4))
    k = draw(st.sampled_from([1, 3, 4, 5, 64, 127, 513]))
    n = draw(st.sampled_from([1, 15, 16, 17, 100, 128, 129, 300]))
    dtype = draw(st.sampled_from([np.uint8, np.int8]))
    info = np.iinfo(dtype)
    src = rng.integers(info.min, int(info.max) + 1, (rows, k)).astype(dtype)
    weights = rng.integers(-128, 128, (k, n)).astype(np.int8)
    if draw(st.booleans()):  # the largest sums: every product at its extreme
        src[:] = info.max if draw(st.booleans()) else info.min
        src[:, 0] ^= 1  # rows of one value go to the engine's gather of weight rows instead
        weights[:] = rng.choice(np.array([-128, 127], np.int8), (k, n))
    zero_point = draw(st.sampled_from([0, int(info.min), int(info.max), int(rng.integers(info.min, info.max + 1))]))
    return src, weights, zero_point, draw(st.sampled_from([1, 2])), rng


@given(case=few_rows_cases())
@settings(max_examples=80, deadline=None)
def test_accumulators_of_a_few_rows_equal_the_reference(case):
    src, weights, zero_point, threads, _ = case
    matmul = lpt.native.MatMul(weights, src_zero_point=zero_point, threads=threads)
    assert np.array_equal(matmul.accumulate(src), matmul_reference(src, zero_point, weights, 0))


@given(case=few_rows_cases(),
       destination=st.sampled_from([(None, 0, None), (0.03, 7, np.uint8), (0.5, -3, np.int8)]),
       post_ops=st.sampled_from([(), (Relu(),), (Sigmoid(),), (Gelu(1.4142135, 1.0, 0.5),)]))
@settings(max_examples=60, deadline=None)
def test_the_output_stage_of_a_few_rows_is_lpts(case, destination, post_ops):
    src, weights, zero_point, threads, rng = case
    columns = weights.shape[1]
    multiplier = rng.uniform(1e-4, 1e-2, columns).astype(np.float32)
    bias = rng.normal(0, 1, columns).astype(np.float32)
    dst_scale, dst_zero_point, dst_dtype = destination
    matmul = lpt.native.MatMul(weights, src_zero_point=zero_point, multiplier=multiplier, bias=bias, post_ops=post_ops,
                               dst_scale=dst_scale, dst_zero_point=dst_zero_point, dst_dtype=dst_dtype, threads=threads)
    info = np.iinfo(dst_dtype) if dst_dtype else np.iinfo(np.uint8)
    acc = matmul_reference(src, zero_point, weights, 0).astype(np.int32)
    expected = output_stage(acc, multiplier, bias, post_ops, None if dst_scale is None else np.float32(dst_scale),
                            np.int32(dst_zero_point), int(info.min), int(info.max), axis=-1)
    got = matmul(src)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert np.array_equal(got.view(np.uint8), np.ascontiguousarray(expected).view(np.uint8))


@pytest.mark.parametrize("rows", [1, 4, 5])
def test_the_kernel_takes_up_to_four_rows_where_the_cpu_runs_it(rows):
    """Rows past four go to oneDNN; each way, a step repeated with the same weights (a recurrence) gives the
    reference at every call, its threads taking the same columns or not."""
    rng = np.random.default_rng(rows)
    weights = rng.integers(-128, 128, (512, 2048)).astype(np.int8)
    matmul = lpt.native.MatMul(weights, src_zero_point=3, threads=2)
    for _ in range(3):
        src = rng.integers(0, 256, (rows, 512)).astype(np.uint8)
        assert np.array_equal(matmul.accumulate(src), matmul_reference(src, 3, weights, 0))
    implementation = lpt.native.engine.implementation(matmul._operation)
    assert (implementation == FEW_ROWS) == (runs_here() and rows <= 4)
