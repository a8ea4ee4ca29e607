"""FakeQuantize: OpenVINO's f32 affine form (what lpt computes) and the spec formula (the readable reference).

The affine form below reproduces OpenVINO's CPU runtime bit for bit on the shared test vectors
(tests/numerics/test_fq_openvino_vectors.py). Two details decide the last bit:

- the input side is two f32 roundings, `x·isc` then `+ ish`, not one fused multiply-add;
- the output side is one fused multiply-add, `q·osc + osh`, and `osh` is not `ol` itself but
  `−zp·osc` with `zp = −ol·(levels−1)/(oh−ol)` (the level of 0.0): OpenVINO dequantizes as
  `(q − zp)·osc` and then distributes the product. So the grid's ends are ol and oh only to
  within an ulp (1.0000001 for oh = 1), exactly as OpenVINO prints them.

Where the spec and OpenVINO's CPU plugin disagree (input_low ≥ input_high), lpt follows the spec.
"""

from __future__ import annotations

import numpy as np

from lpt.numerics.levels import check_levels


def fake_quantize(x, input_low, input_high, output_low, output_high, levels) -> np.ndarray:
    """y = fma(k, osc, osh) in f32, k = fake_quantize_levels(x, il, ih, levels), osc = (oh−ol)/(levels−1).

    osh is −zp·osc with zp = −ol·(levels−1)/(oh−ol), as OpenVINO computes it (see above).
    Limits broadcast against x (per tensor, or per channel such as shape [1, C, 1, 1]).
    """
    levels = check_levels(levels)
    ol, oh = (np.asarray(a, dtype=np.float32) for a in (output_low, output_high))
    return _level_value(fake_quantize_levels(x, input_low, input_high, levels), ol, oh, levels)


def fake_quantize_levels(x, input_low, input_high, levels) -> np.ndarray:
    """k = round(clip(x)·isc + ish) in f32, isc = (levels−1)/(ih−il), ish = −il·isc: the level of x.

    The spec's boundary rule is applied elementwise: x ≤ min(il, ih) takes level 0, x > max(il, ih)
    the last level; this also gives il == ih (a threshold at il) and il > ih (the spec formula
    inside the interval) their spec meaning. The levels, 0 … levels−1, come as whole numbers in f32.
    """
    levels = check_levels(levels)
    x, il, ih = (np.asarray(a, dtype=np.float32) for a in (x, input_low, input_high))
    steps = np.float32(levels - 1)
    low, high = np.minimum(il, ih), np.maximum(il, ih)
    with np.errstate(divide="ignore", invalid="ignore"):  # il == ih: the boundary rule decides every x
        isc = steps / (ih - il)
        ish = -il * isc
        k = np.rint(np.clip(x, low, high) * isc + ish)  # two f32 roundings, as OpenVINO: not an fma
    # When |il| ≫ ih − il the f32 affine form can land a level outside the grid; clipping keeps
    # the output on it and changes nothing otherwise.
    k = np.clip(k, 0, steps)
    return np.where(x <= low, np.float32(0), np.where(x > high, steps, k))


def fake_quantize_spec(x, input_low, input_high, output_low, output_high, levels) -> np.ndarray:
    """x ≤ min(il,ih) → ol; x > max(il,ih) → oh; else round((x−il)/(ih−il)·(levels−1))/(levels−1)·(oh−ol)+ol.

    The spec's formula, literally, in float64: the readable reference the affine form is tested against.
    """
    levels = check_levels(levels)
    x, il, ih, ol, oh = (np.asarray(a, dtype=np.float64)
                         for a in (x, input_low, input_high, output_low, output_high))
    steps = levels - 1
    with np.errstate(divide="ignore", invalid="ignore"):  # il == ih: every x takes a boundary branch
        inside = np.rint((x - il) / (ih - il) * steps) / steps * (oh - ol) + ol
    return np.where(x <= np.minimum(il, ih), ol, np.where(x > np.maximum(il, ih), oh, inside))


def _level_value(k, ol, oh, levels: int) -> np.ndarray:
    """y = fma(k, osc, osh) in f32, osc = (oh−ol)/(levels−1), osh = −zp·osc, zp = −ol·(levels−1)/(oh−ol)."""
    steps = np.float32(levels - 1)
    osc = (oh - ol) / steps
    with np.errstate(divide="ignore", invalid="ignore"):  # ol == oh has no zero point: y = ol
        zero_level = (-ol * steps) / (oh - ol)
        osh = np.where(ol == oh, ol, -zero_level * osc)
    return fma_f32(k, osc, osh)


def fma_f32(a, b, c) -> np.ndarray:
    """a·b + c rounded once to f32 (a fused multiply-add), for f32 inputs.

    a·b is exact in float64; the sum is rounded to float64 with round-to-odd (TwoSum gives the
    error) so that the final rounding to f32 is the correctly rounded result (Boldo & Melquiond).
    """
    a, b, c = (np.asarray(v, dtype=np.float32).astype(np.float64) for v in (a, b, c))
    product = a * b
    total = product + c
    rounded_part = total - product
    error = (product - (total - rounded_part)) + (c - rounded_part)
    inexact_even = (error != 0) & np.isfinite(total) & ((total.view(np.int64) & 1) == 0)
    total = np.where(inexact_even, np.nextafter(total, np.where(error > 0, np.inf, -np.inf)), total)
    return total.astype(np.float32)

