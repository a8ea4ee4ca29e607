"""Properties of fake_quantize (OpenVINO's f32 affine form) against the float64 spec formula."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lpt.errors import QuantizationError
from lpt.numerics import fake_quantize, fake_quantize_levels, fake_quantize_spec
from lpt.numerics.fake_quantize import fma_f32

LEVELS = st.sampled_from([2, 3, 5, 16, 255, 256, 1000, 65536])
f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


def grid_tolerance(ol, oh) -> float:
    """How far lpt's f32 grid may sit from the exact ol + k·(oh−ol)/(levels−1): 8 f32 ulps of the larger end.

    osc and osh are each rounded a few times in f32 and the fma rounds once more.
    """
    return 2.0**-21 * max(abs(float(ol)), abs(float(oh)))


@st.composite
def interval(draw, lo=-10.0, hi=10.0):
    """An f32 interval [a, b], a < b, no longer than 20 and no shorter than 0.1 (well conditioned)."""
    a = draw(st.floats(lo, hi, width=32))
    b = np.float32(a + draw(st.floats(0.1, 20.0)))
    assume(b > a)
    return np.float32(a), b


@st.composite
def fq_case(draw):
    """x with exact .5 ties of the spec formula mixed in, limits, and levels."""
    levels = draw(LEVELS)
    il, ih = draw(interval())
    ol, oh = draw(interval(-100.0, 100.0))
    if draw(st.booleans()):
        ol, oh = oh, ol  # inverted output intervals are legal
    random_x = draw(st.lists(st.floats(-40, 40, width=32), min_size=1, max_size=40))
    ks = draw(st.lists(st.integers(0, levels - 2), max_size=20))
    ties = [float(il) + (k + 0.5) * (float(ih) - float(il)) / (levels - 1) for k in ks]
    x = np.array(random_x + ties, dtype=np.float32)
    return x, il, ih, ol, oh, levels


@settings(max_examples=150, deadline=None)
@given(fq_case())
def test_affine_form_agrees_with_the_spec_except_one_step_at_ties(case):
    x, il, ih, ol, oh, levels = case
    y = fake_quantize(x, il, ih, ol, oh, levels).astype(np.float64)
    spec = fake_quantize_spec(x, il, ih, ol, oh, levels)

    steps = levels - 1
    step = abs(float(oh) - float(ol)) / steps
    tolerance = grid_tolerance(ol, oh)
    # Where the f32 affine form can round the other way: the spec's unrounded level is within
    # the f32 error of x·isc + ish (two roundings, plus isc and ish themselves) of a .5 tie.
    v = (x.astype(np.float64) - il) / (float(ih) - float(il)) * steps
    epsilon = 2.0**-21 * ((np.abs(x) + abs(float(il))) * steps / (float(ih) - float(il)) + steps)
    near_tie = np.abs(v - np.floor(v) - 0.5) <= epsilon

    difference = np.abs(y - spec)
    assert np.all(difference <= step + tolerance)
    mismatch = difference > tolerance
    assert np.all(near_tie[mismatch]), (x[mismatch], v[mismatch])


@settings(max_examples=100, deadline=None)
@given(fq_case())
def test_output_takes_at_most_levels_values_on_the_grid(case):
    x, il, ih, ol, oh, levels = case
    step = (float(oh) - float(ol)) / (levels - 1)
    # The grid exists in f32 only while a step is wider than f32's resolution at the output's ends.
    assume(step > 4 * float(np.spacing(np.float32(max(abs(float(ol)), abs(float(oh)))))))
    y = fake_quantize(x, il, ih, ol, oh, levels).astype(np.float64)
    k = np.rint((y - float(ol)) / step)
    assert np.all((0 <= k) & (k <= levels - 1))
    np.testing.assert_allclose(y, float(ol) + k * step, rtol=0, atol=grid_tolerance(ol, oh))
    assert np.unique(y).size <= levels


@settings(max_examples=100, deadline=None)
@given(fq_case())
def test_is_idempotent_when_the_output_interval_is_the_input_interval(case):
    x, il, ih, _, _, levels = case
    # Idempotent while the f32 affine form is accurate to well under half a level.
    assume((abs(float(il)) + abs(float(ih))) / (float(ih) - float(il)) * (levels - 1) < 2.0**19)
    once = fake_quantize(x, il, ih, il, ih, levels)
    np.testing.assert_array_equal(fake_quantize(once, il, ih, il, ih, levels), once)


@settings(max_examples=50, deadline=None)
@given(fq_case())
def test_levels_are_the_output_of_an_fq_onto_0_to_levels_minus_1(case):
    x, il, ih, _, _, levels = case
    k = fake_quantize_levels(x, il, ih, levels)
    assert k.dtype == np.float32 and np.all(k == np.rint(k)) and np.all((0 <= k) & (k <= levels - 1))
    np.testing.assert_array_equal(k, fake_quantize(x, il, ih, 0, levels - 1, levels))


def test_near_a_tie_the_affine_form_and_the_spec_pick_neighbouring_levels():
    """x = f32(−1 + 1.5·2/255) sits a hair below the tie between levels 1 and 2 (1.4999999 in float64);
    OpenVINO's f32 x·isc + ish rounds it up to 2, the spec's float64 formula down to 1 (ties_levels256)."""
    x = np.float32(-1 + 1.5 * 2 / 255)
    assert fake_quantize_levels(x, -1, 1, 256) == 2
    assert fake_quantize_spec(x, -1, 1, 0, 255, 256) == 1


def test_boundary_rule_x_at_or_below_min_takes_the_first_level_above_max_the_last():
    il, ih, ol, oh = np.float32(-0.39962575), np.float32(0.6123135), np.float32(-0.39962575), np.float32(0.6123135)
    x = np.array([-1e30, -5.0, il, np.nextafter(ih, np.float32(1)), 5.0, 1e30, np.inf, -np.inf], np.float32)
    y = fake_quantize(x, il, ih, ol, oh, 256)
    first, last = fake_quantize(np.array([il, ih], np.float32), il, ih, ol, oh, 256)
    np.testing.assert_array_equal(y, [first, first, first, last, last, last, last, first])
    # The grid's ends are OpenVINO's f32 values for ol and oh: within a few ulps, here one ulp off ol.
    assert abs(first - ol) <= grid_tolerance(ol, oh) and abs(last - oh) <= grid_tolerance(ol, oh)
    assert first == np.nextafter(ol, np.float32(1))


def test_an_ill_conditioned_interval_stays_on_the_grid():
    """|il| ≫ ih − il: at x = ih the f32 affine form x·isc + ish comes to 256 of 0 … 255; lpt keeps the last level."""
    il, ih = np.float32(1369.6168), np.float32(1369.631)
    isc = np.float32(255) / (ih - il)
    assert np.rint(ih * isc + -il * isc) == 256
    assert fake_quantize_levels(ih, il, ih, 256) == 255


def test_nan_stays_nan():
    assert np.isnan(fake_quantize(np.float32(np.nan), -1, 1, -1, 1, 256))


def test_zero_width_output_interval_gives_output_low():
    np.testing.assert_array_equal(fake_quantize(np.array([-2, 0, 2], np.float32), -1, 1, 0.5, 0.5, 256), [0.5] * 3)


def test_per_channel_limits_equal_a_loop_over_channels():
    """Per-channel limits of shape [1, C, 1] with ordinary, equal (il == ih) and inverted channels."""
    rng = np.random.default_rng(7)
    x = rng.uniform(-3, 3, (2, 5, 7)).astype(np.float32)
    x[:, :, 0] = 0.5  # exactly on the threshold of the il == ih channel
    il = np.array([-1.0, 0.5, 1.0, -2.0, 0.0], np.float32)
    ih = np.array([1.0, 0.5, -1.0, 2.5, 0.3], np.float32)
    ol = np.array([-1.0, 0.0, -1.0, 0.0, -5.0], np.float32)
    oh = np.array([1.0, 1.0, 1.0, 255.0, 5.0], np.float32)
    levels = 255
    shaped = [a.reshape(1, 5, 1) for a in (il, ih, ol, oh)]
    y = fake_quantize(x, *shaped, levels)
    looped = np.stack([fake_quantize(x[:, c], il[c], ih[c], ol[c], oh[c], levels) for c in range(5)], axis=1)
    np.testing.assert_array_equal(y, looped)
    np.testing.assert_array_equal(y[:, 1], np.where(x[:, 1] <= 0.5, 0.0, 1.0))  # il == ih: a threshold


@pytest.mark.parametrize("levels", [1, 0, 65537, 2.5, "256", None])
def test_levels_outside_2_to_65536_or_not_an_integer_raise(levels):
    with pytest.raises(QuantizationError, match=str(levels).replace(".", r"\.")):
        fake_quantize(np.zeros(3, np.float32), -1, 1, -1, 1, levels)


def test_levels_accepts_numpy_integers():
    np.testing.assert_array_equal(fake_quantize(np.float32(0.3), 0, 1, 0, 1, np.array(3)), 0.5)


def _exact_f32(value: Fraction) -> np.float32:
    """The f32 nearest to an exact rational, ties to even."""
    guess = np.float32(float(value))
    candidates = [guess, np.nextafter(guess, np.float32(np.inf)), np.nextafter(guess, np.float32(-np.inf))]
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - value), int(np.array(c).view(np.uint32)) & 1))


@settings(max_examples=200, deadline=None)
@given(f32.filter(lambda v: abs(v) < 1e15), f32.filter(lambda v: abs(v) < 1e15), f32.filter(lambda v: abs(v) < 1e30),
       st.booleans())
def test_fma_f32_rounds_once(a, b, c, cancel):
    if cancel:  # c ≈ −a·b: the hard case, where the result is all low-order bits
        c = float(-np.float32(a * b))
    exact = Fraction(a) * Fraction(b) + Fraction(float(np.float32(c)))
    got = fma_f32(a, b, c)
    assert got == _exact_f32(exact) or (got == 0 and exact == 0)


def test_fma_f32_is_not_double_rounding():
    """(1+2⁻²³)(1−2⁻²³) + (2²⁴+2) = 2²⁴+3−2⁻⁴⁶: just below a tie, which float64 rounds onto the tie."""
    a, b, c = np.float32(1 + 2**-23), np.float32(1 - 2**-23), np.float32(2**24 + 2)
    assert np.float32(np.float64(a) * np.float64(b) + np.float64(c)) == 2**24 + 4  # the naive answer
    assert fma_f32(a, b, c) == 2**24 + 2
