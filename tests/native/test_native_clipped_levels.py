"""The 8-bit output stage of a layer with no post-op, a Relu or a Clip, which lpt's AVX2 stage computes as one
fused product per value (lpt/native/s16.cpp: clipped_levels, prepare_clipped_levels), against lpt's NumPy oracle.
The accumulators are those whose reference value lies nearest a half: where the product and the reference's
division round to different sides of it, only the margin sends the value to the reference's operations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lpt.native
from lpt.kernels import Clip, Relu
from lpt.kernels.output_stage import output_stage

# Every exact route on this CPU, and split always (exact wherever the engine is; conftest.py skips where it is not).
ROUTES = sorted(set(lpt.native.exact_routes()) | {"split"})
WIDE, SPAN = 127, 16000  # each accumulator is 127·d1 + d2 of a source's two values less their zero point 128


def nearest_halves(multiplier, bias, scale, count):
    """The `count` accumulators within ±SPAN whose x / scale (the reference's float32 operations) lies nearest a
    half."""
    candidates = np.arange(-SPAN, SPAN + 1, dtype=np.int32)
    y = (candidates.astype(np.float32) * multiplier + bias) / scale
    distance = np.abs(np.abs(y - np.floor(y)) - np.float32(0.5))
    return candidates[np.argsort(distance, kind="stable")[:count]]


def source_for(acc, idle_rows):
    """u8 rows (zero point 128) whose product with [127, 1, 127 × idle_rows] is acc: the idle rows hold the zero
    point, and only raise the largest accumulator the stage's margin is prepared for."""
    high = np.rint(acc / WIDE).astype(np.int64)
    src = np.full((len(acc), 2 + idle_rows), 128, np.uint8)
    src[:, 0] = 128 + high
    src[:, 1] = 128 + acc - WIDE * high
    return src


@pytest.mark.parametrize("route", ROUTES)
@given(seed=st.integers(0, 2**32 - 1), columns=st.sampled_from([5, 16, 24]), idle_rows=st.sampled_from([0, 200]),
       clip=st.sampled_from(["none", "relu", "clip"]), dst=st.sampled_from([np.uint8, np.int8]))
@settings(max_examples=40, deadline=None)
def test_values_next_to_a_half_quantize_as_the_reference(route, seed, columns, idle_rows, clip, dst):
    """Each column's values nearest a half, 4 000 / columns of 32 001 candidates; an output stage with no post-op, a
    Relu or a Clip between two random bounds; both margins (idle_rows 0: one for every value, 200: the largest
    accumulator's would be too wide, so each value's own); a column count that leaves a block of 16 partial."""
    rng = np.random.default_rng(seed)
    scale = np.float32(rng.uniform(0.01, 1.0))
    multiplier = (scale * rng.uniform(0.004, 0.02, columns)).astype(np.float32)  # x / scale within ±320
    bias = (rng.normal(0.0, 40.0, columns) * scale).astype(np.float32)
    low, high = np.sort(rng.normal(0.0, 100.0, 2) * scale).astype(np.float32)
    post_ops = {"none": (), "relu": (Relu(),), "clip": (Clip(float(low), float(high)),)}[clip]
    info = np.iinfo(dst)
    zero_point = int(rng.integers(info.min, int(info.max) + 1))
    acc = np.concatenate([nearest_halves(m, b, scale, 4000 // columns) for m, b in zip(multiplier, bias)]
                         + [rng.integers(-SPAN, SPAN + 1, 200).astype(np.int32)])  # and values anywhere
    weights = np.full((2 + idle_rows, columns), WIDE, np.int8)
    weights[1] = 1
    matmul = lpt.native.MatMul(weights, src_zero_point=128, multiplier=multiplier, bias=bias, post_ops=post_ops,
                               dst_scale=scale, dst_zero_point=zero_point, dst_dtype=dst, route=route, threads=1)
    accumulators = np.repeat(acc[:, None], columns, axis=1)
    expected = output_stage(accumulators, multiplier, bias, post_ops, scale, np.int32(zero_point), int(info.min),
                            int(info.max), axis=-1)
    got = matmul(source_for(acc, idle_rows))
    wrong = np.argwhere(got != expected)
    assert wrong.size == 0, f"{len(wrong)} values differ, the first accumulator {acc[wrong[0][0]]}"
