"""The C one-pass forms (lpt/kernels/_elementwise.c) against the numpy forms they replace: bit for bit."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpt.kernels import Clip, Relu, Sigmoid, join_q, output_stage

OUTPUT_STAGE = sys.modules["lpt.kernels.output_stage"]  # the module: the package re-exports the function's name
ELEMENTWISE = sys.modules["lpt.kernels.elementwise"]

# setup.py builds the extension as optional: without a C compiler lpt installs and runs the numpy
# forms (which the other kernel tests cover). CI has a compiler, so there a missing build fails.
pytestmark = pytest.mark.skipif(OUTPUT_STAGE._native is None and not os.environ.get("CI"),
                                reason="lpt was installed without its C extension (no C compiler): the numpy "
                                       "forms run instead, and the other kernel tests cover them")

DESTINATIONS = [(None, 0, 0, 255), (0.013, 3, 0, 255), (0.02, -5, -128, 127), (0.02, 0, -127, 127), (0.5, 255, 0, 255)]


class CountingCalls:
    """Stands in for the C module and counts the calls that reach it."""

    def __init__(self, module):
        self.module, self.native, self.calls = module, module._native, 0

    def __getattr__(self, name):
        self.calls += 1
        return getattr(self.native, name)

    def __enter__(self):
        self.module._native = self
        return self

    def __exit__(self, *exc):
        self.module._native = self.native


def numpy_form(module, function, *args, **kwargs):
    native, module._native = module._native, None
    try:
        return function(*args, **kwargs)
    finally:
        module._native = native


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


@st.composite
def accumulators(draw):
    """int32 accumulators, channels-last in memory as the MLAS route leaves them, with the extremes mixed in."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    channels = draw(st.integers(1, 40))
    magnitude = draw(st.sampled_from([2**8, 2**20, 2**24 + 3, 2**31 - 1]))
    acc = rng.integers(-magnitude, magnitude, (draw(st.integers(1, 2)), 5, 3, channels), dtype=np.int64)
    acc.reshape(-1)[: 4] = [2**24 + 1, -(2**31), 2**31 - 1, 0][: acc.size]
    return acc.astype(np.int32).transpose(0, 3, 1, 2), rng


@given(case=accumulators(), scale=st.floats(1e-9, 1e-2), destination=st.sampled_from(DESTINATIONS),
       bias=st.sampled_from(["per-channel", "one", "none"]),
       post_ops=st.lists(st.sampled_from([Relu(), Clip(-0.5, 0.7), Clip(0.0, 6.0)]), max_size=3))
@settings(max_examples=150, deadline=None)
def test_output_stage_in_one_pass_equals_the_numpy_form(case, scale, destination, bias, post_ops):
    acc, rng = case
    channels = acc.shape[1]
    multiplier = rng.uniform(scale / 4, scale, channels).astype(np.float32)
    bias = {"per-channel": rng.normal(0, 2, channels).astype(np.float32), "one": np.float32(0.25), "none": None}[bias]
    dst_scale, dst_zp, qmin, qmax = destination
    args = (acc, multiplier, bias, tuple(post_ops), None if dst_scale is None else np.float32(dst_scale),
            np.int32(dst_zp), qmin, qmax)
    with CountingCalls(OUTPUT_STAGE) as c_form:
        fast = output_stage(*args, axis=1)
    assert c_form.calls == 1
    assert same_bits(fast, numpy_form(OUTPUT_STAGE, output_stage, *args, axis=1))


def test_ties_round_half_to_even():
    """x / s lands on k + 0.5 exactly: 0.5 → 0, 1.5 → 2, 2.5 → 2, −0.5 → −0, −1.5 → −2."""
    acc = np.array([[1, 3, 5, -1, -3, 255 * 2 + 1]], np.int32)
    expected = np.array([[0, 2, 2, 0, -2, 127]], np.int8)
    ones = np.ones(6, np.float32)
    with CountingCalls(OUTPUT_STAGE) as c_form:
        result = output_stage(acc, ones * 0.5, None, (), np.float32(1), np.int32(0), -128, 127, axis=-1)
    assert c_form.calls == 1
    np.testing.assert_array_equal(result, expected)


@pytest.mark.parametrize("first", [np.uint8, np.int8])
@pytest.mark.parametrize("second", [np.uint8, np.int8])
@given(seed=st.integers(0, 2**32 - 1), multiply=st.booleans(), relu=st.booleans(),
       destination=st.sampled_from(DESTINATIONS[1:]), shifts=st.sampled_from([(None, None), (3.0, -7.0), (0.5, 128.25)]))
@settings(max_examples=40, deadline=None)
def test_join_in_one_pass_equals_the_numpy_form(first, second, seed, multiply, relu, destination, shifts):
    rng = np.random.default_rng(seed)
    shape = (2, 7, 9, 5)  # stored channels-last, read as [N, C, H, W]
    q1 = rng.integers(np.iinfo(first).min, np.iinfo(first).max + 1, shape).astype(first).transpose(0, 3, 1, 2)
    q2 = rng.integers(np.iinfo(second).min, np.iinfo(second).max + 1, shape).astype(second).transpose(0, 3, 1, 2)
    dst_scale, dst_zp, qmin, qmax = destination
    shift1, shift2 = (None if s is None else np.float32(s) for s in shifts)
    args = (multiply, q1, shift1, np.float32(0.02), q2, shift2, np.float32(0.07), relu, np.float32(dst_scale),
            np.int32(dst_zp), qmin, qmax)
    with CountingCalls(ELEMENTWISE) as c_form:
        fast = join_q(*args)
    assert c_form.calls == 1
    assert same_bits(fast, numpy_form(ELEMENTWISE, join_q, *args))
    assert fast.strides == q1.strides  # the inputs' layout kept


def test_the_numpy_form_takes_what_the_c_form_does_not():
    """Per-channel destinations and Sigmoid stay in numpy, with the same results as before."""
    acc = np.arange(-12, 12, dtype=np.int32).reshape(1, 2, 3, 4)
    with CountingCalls(OUTPUT_STAGE) as c_form:
        output_stage(acc, np.float32(0.1), None, (Relu(), Sigmoid()), axis=1)
    assert c_form.calls == 0
    per_channel = output_stage(acc, np.float32(0.1), None, (), np.array([0.1, 0.2], np.float32).reshape(1, 2, 1, 1),
                               np.int32(0), -128, 127, axis=1)
    np.testing.assert_array_equal(per_channel[0, 1], np.rint(acc[0, 1] * np.float32(0.1) / np.float32(0.2)))
