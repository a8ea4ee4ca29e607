"""The f32 BLAS chunking bound: proven in lpt.kernels.gemm, demonstrated here by breaking it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpt.kernels import conv_accumulate, gemm, integer_matmul, pack_conv
from lpt.kernels.gemm import chunk_slices, exact_chunk

# 624 products 255·(−128) and one 1·1: the exact sum −20 367 359 is odd and beyond 2^24, so no f32
# holds it, and an f32 reduction over all 625 products in one go must be wrong.
K = 625
ROW = np.array([255] * (K - 1) + [1], dtype=np.uint8)
COLUMN = np.array([-128] * (K - 1) + [1], dtype=np.int8)
EXACT = (K - 1) * 255 * -128 + 1


def test_the_bound_for_u8_times_s8_is_514():
    assert exact_chunk(255, 128) == 514
    assert 514 * 255 * 128 <= 2**24 < 515 * 255 * 128
    assert (exact_chunk(128, 128), exact_chunk(255, 255), exact_chunk(255, 127)) == (1024, 258, 518)


def test_the_example_cannot_be_an_f32():
    assert abs(EXACT) > 2**24 and int(np.float32(EXACT)) != EXACT


@given(k=st.integers(0, 3000), chunk=st.integers(1, 600))
@settings(max_examples=60, deadline=None)
def test_chunks_cover_the_reduction_in_the_fewest_pieces(k, chunk):
    slices = chunk_slices(k, chunk)
    assert [i for s in slices for i in range(k)[s]] == list(range(k))
    assert all(s.stop - s.start <= chunk for s in slices)
    assert len(slices) == max(1, -(-k // chunk))


def test_the_shipped_chunks_are_exact():
    a, b = ROW.astype(np.float32)[None, :], COLUMN.astype(np.float32)[:, None]
    assert integer_matmul(a, b, 255, 128)[0, 0] == EXACT


def test_a_chunk_past_the_bound_is_not(monkeypatch):
    monkeypatch.setattr(gemm, "F32_EXACT_INTEGERS", 2**25)  # as if f32 had one more bit: chunk 1028 > K
    a, b = ROW.astype(np.float32)[None, :], COLUMN.astype(np.float32)[:, None]
    assert integer_matmul(a, b, 255, 128)[0, 0] != EXACT


@pytest.mark.parametrize("layout", ["im2col", "depthwise"])
def test_convolution_stays_within_the_bound(layout, monkeypatch):
    """A 1×1 convolution over 625 channels (im2col), or a 25×25 depthwise kernel (625 taps), holding the example."""
    if layout == "im2col":
        src, weights = ROW.reshape(1, K, 1, 1), COLUMN.reshape(1, K, 1, 1)
    else:
        src, weights = ROW.reshape(1, 1, 25, 25), COLUMN.reshape(1, 1, 25, 25)
    assert conv_accumulate(src, pack_conv(weights, int8_gemm=False))[0, 0, 0, 0] == EXACT
    monkeypatch.setattr(gemm, "F32_EXACT_INTEGERS", 2**25)
    assert conv_accumulate(src, pack_conv(weights, int8_gemm=False))[0, 0, 0, 0] != EXACT


@given(st.integers(1, 6), st.integers(1, 400), st.integers(1, 5000), st.integers(0, 2**31 - 1))
@settings(max_examples=40, deadline=None)
def test_exact_chunks_keep_every_output_row_under_the_limit_and_are_greedy(rows, k, limit, seed):
    from lpt.kernels.conv import exact_chunks

    magnitudes = np.random.default_rng(seed).integers(0, 128, (rows, k))
    slices = exact_chunks(magnitudes, limit)
    assert [i for s in slices for i in range(k)[s]] == list(range(k))
    for s in slices:
        widest = magnitudes[:, s].sum(axis=1).max()
        assert widest <= limit or s.stop - s.start == 1  # a single column over the limit stands alone
        if s.stop < k:  # taking one more column would have crossed the limit
            assert magnitudes[:, s.start:s.stop + 1].sum(axis=1).max() > limit
