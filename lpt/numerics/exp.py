"""lpt's float32 exp, Sigmoid, tanh, erf and log: fixed sequences of float32 operations, so that NumPy and the native
engine (lpt/native/exp.h) compute them to the same bit on every CPU.

numpy's exp is not such a sequence: it dispatches to SIMD code chosen by the CPU, and the C library's
expf is another approximation again. A Sigmoid inside a layer's output stage, or a Softmax between two
int8 layers, needs one definition that both lpt's kernels (the reference) and its engine follow, so
it is spelled out here:

    t = clamp(t, −86, 87)               (fmax/fmin: a NaN becomes −86; the result is NaN again below)
    n = rint(t·log2(e))                 (the float32 add of 1.5·2^23 and its subtraction: ties to even)
    r = (t − n·LN2_HI) − n·LN2_LO       (Cody and Waite: n·LN2_HI is exact, LN2_HI has 9 bits)
    p = P0; p = p·r + P1; ... p = p·r + P5        (Cephes' expf polynomial on |r| ≤ ln 2 / 2)
    exp(t) = ((p·(r·r) + r) + 1)·2^n    (2^n from its exponent bits: n is within [−124, 126]; t where t is NaN)
    sigmoid(x) = 1 / (1 + exp(−x))      (x where x is NaN)

    tanh(x), a = |x|:  a < 0.625:  T(z)·z·x + x, z = x·x     (T: Cephes' tanhf polynomial, degree 4, Horner)
                       else:       1 − 2 / (exp(a + a) + 1)
                       then x's sign (copysign: −0 stays −0), and x where x is NaN

    erf(x), a = |x|:  k = trunc(fmin(a·2, 7))          (the half-unit interval a is in; a NaN: 7)
                      t = a − (k/2 + 1/4)               (from its centre)
                      p = E[k][0]; p = p·t + E[k][1]; ... p = p·t + E[k][6]     (degree 6, Horner)
                      a < 1:  a·p     (p ≈ erf(a)/a: relative accuracy down to the smallest a)
                      a < 4:  1 − p   (p ≈ erfc(a): absolute accuracy where erf is near 1)
                      else:   1
                      then x's sign (copysign), and x where x is NaN

    log(x):  x < 2^−126: x·2^23, and 23 less in e below       (a subnormal made normal, exactly)
             m = x's mantissa in [0.5, 1), e its exponent       (from its bits: x = m·2^e)
             m < √½: m = m + m, e = e − 1                        (then m − 1 is in [−0.29, 0.41))
             f = m − 1, z = f·f
             q = L0; q = q·f + L1; ... q = q·f + L8      (Cephes' logf polynomial, degree 8, Horner)
             y = (q·f)·z;  y = y + e·LN2_LO;  y = y − 0.5·z;  log(x) = (f + y) + e·LN2_HI
             then NaN below 0 and for NaN, −inf at ±0, +inf at +inf

Every step is one float32 operation, rounded to nearest even, with no fused multiply-add. The clamp
keeps every value normal: exp(t) for t < −86 is 4.4e−38 instead of smaller, sigmoid(x) for x < −87
is 1.6e−38, and for x > 86 it is 1, as float32 rounds it anyway. Measured against float64 on 20
million evenly spaced inputs in [−90, 90]: sigmoid within 2.4 ulp where it is at least 1e−30
(numpy's exp gives 3.6; onnxruntime's Sigmoid, an approximation cut off in the tails, differs from
this by at most 1.8e−7). Each interval's E[k] is a least-squares fit (at 400 Chebyshev points, in
float64) of erf(a)/a, weighted relatively, on [0, 0.5) and [0.5, 1), and of erfc(a) on the six half
units of [1, 4). Evaluated as above in float32, erf is within 1.6 ulp of float64's on [0, 1) and
within 0.9 ulp on [1, 4) (4 million evenly spaced inputs and 200 000 logarithmically spaced down to
1e−30). An earlier form (a polynomial in a² below 1, 1 − exp(−a²)·Q(1/(1 + a/2)) above) was within
2.4 and 1.4 ulp and cost the native engine's GELU about twice the operations: an exp, a division and
two polynomials where the lanes of a vector fall on both sides of 1. Here every lane takes one
polynomial, its coefficients picked by k (the engine: vpermps from eight-lane tables).
"""

from __future__ import annotations

import numpy as np

LOW, HIGH = np.float32(-86.0), np.float32(87.0)
LOG2E = np.float32(1.44269504088896341)
ROUND = np.float32(12582912.0)  # 1.5·2^23: adding and subtracting it rounds |y| ≤ 2^22 to an integer, ties to even
LN2_HI, LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)
POLYNOMIAL = tuple(np.float32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                                           1.6666665459e-1, 5.0000001201e-1))
ONE = np.float32(1.0)
# ERF_TERMS[j][k]: the coefficient of t^(6 − j) on interval k (exp.h holds the same table)
ERF_TERMS = np.array([
    (-1.797866449e-02, 1.421151496e-02, -2.059773728e-02, -9.049494751e-03, 2.779565286e-03, 1.667850534e-03,
     2.737584582e-04, 2.069242328e-05),
    (-3.496961668e-02, -3.727068380e-02, 4.677693173e-02, -5.969540216e-03, -1.058114227e-02, -2.825833391e-03,
     -3.326159786e-04, -2.020526335e-05),
    (8.901758492e-02, -2.486116998e-02, 6.132035051e-03, 4.810552299e-02, 1.908825710e-02, 3.257710487e-03,
     2.861694375e-04, 1.378540856e-05),
    (1.046917588e-01, 1.693242341e-01, -1.675230861e-01, -9.017766267e-02, -2.172697894e-02, -2.758207032e-03,
     -1.952192833e-04, -7.911728062e-06),
    (-3.353509605e-01, -1.002174690e-01, 2.956517339e-01, 9.235620499e-02, 1.607015729e-02, 1.612267457e-03,
     9.486933413e-05, 3.306070994e-06),
    (-1.811654866e-01, -4.070351124e-01, -2.365212291e-01, -5.277483538e-02, -7.142299786e-03, -5.862942780e-04,
     -2.919364670e-05, -8.818866490e-07),
    (1.105305552e+00, 9.482074976e-01, 7.709987462e-02, 1.332832873e-02, 1.462716726e-03, 1.006219100e-04,
     4.302769867e-06, 1.137258892e-07),
], np.float32)
ERF_CENTRES = np.arange(8, dtype=np.float32) / np.float32(2) + np.float32(0.25)
ERF_LAST_INTERVAL = np.float32(7.0)
TANH_NEAR = tuple(np.float32(c) for c in (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
                                          -3.33332819422e-1))
TANH_SPLIT, TWO = np.float32(0.625), np.float32(2.0)
ERF_ONE = np.float32(4.0)  # and above: 1
LOG_TERMS = tuple(np.float32(c) for c in (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
                                          1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
                                          3.3333331174e-1))
SQRT_HALF, HALF = np.float32(0.707106781186547524), np.float32(0.5)
SMALLEST_NORMAL, TWO_TO_23 = np.float32(2.0**-126), np.float32(2.0**23)


def exp(t: np.ndarray) -> np.ndarray:
    """e^t of a float32 array, as the sequence above (a new array)."""
    t = np.asarray(t, dtype=np.float32)
    clamped = np.fmin(np.fmax(t, LOW), HIGH)
    n = (clamped * LOG2E + ROUND) - ROUND
    r = (clamped - n * LN2_HI) - n * LN2_LO
    p = np.full_like(r, POLYNOMIAL[0])
    for c in POLYNOMIAL[1:]:
        p = p * r + c
    two_to_n = ((n.astype(np.int32) + 127) << 23).view(np.float32)
    e = ((p * (r * r) + r) + ONE) * two_to_n
    return np.where(np.isnan(t), t, e)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(−x)) of a float32 array, as the sequence above (a new array)."""
    x = np.asarray(x, dtype=np.float32)
    return np.where(np.isnan(x), x, ONE / (ONE + exp(np.negative(x))))


def tanh(x: np.ndarray) -> np.ndarray:
    """The hyperbolic tangent of a float32 array, as the sequence above (a new array)."""
    x = np.asarray(x, dtype=np.float32)
    a = np.abs(x)
    with np.errstate(over="ignore", invalid="ignore"):  # the range a value does not take may overflow
        z = x * x
        near = (_horner(TANH_NEAR, z) * z) * x + x
        far = ONE - TWO / (exp(a + a) + ONE)
    return np.where(np.isnan(x), x, np.copysign(np.where(a < TANH_SPLIT, near, far), x))


def erf(x: np.ndarray) -> np.ndarray:
    """The error function of a float32 array, as the sequence above (a new array)."""
    x = np.asarray(x, dtype=np.float32)
    a = np.abs(x)
    k = np.fmin(a * np.float32(2), ERF_LAST_INTERVAL).astype(np.int32)
    with np.errstate(over="ignore", invalid="ignore"):  # past 4 (where 1 is taken) t may overflow
        t = a - ERF_CENTRES[k]
        p = ERF_TERMS[0][k]
        for terms in ERF_TERMS[1:]:
            p = p * t + terms[k]
        y = np.where(a < ONE, a * p, ONE - p)
    y = np.where(a < ERF_ONE, y, ONE)
    return np.where(np.isnan(x), x, np.copysign(y, x))


def log(x: np.ndarray) -> np.ndarray:
    """The natural logarithm of a float32 array, as the sequence above (a new array)."""
    x = np.asarray(x, dtype=np.float32)
    subnormal = np.abs(x) < SMALLEST_NORMAL
    with np.errstate(over="ignore"):  # the large values, whose product is not taken
        bits = np.where(subnormal, x * TWO_TO_23, x).view(np.int32)
    e = ((bits >> 23) & 0xFF) - 126 - np.where(subnormal, 23, 0)
    m = ((bits & 0x007FFFFF) | 0x3F000000).view(np.float32)
    below = m < SQRT_HALF
    f = np.where(below, m + m, m) - ONE
    e = (e - below).astype(np.float32)
    z = f * f
    y = (_horner(LOG_TERMS, f) * f) * z
    y = y + e * LN2_LO
    y = y - HALF * z
    y = (f + y) + e * LN2_HI
    with np.errstate(invalid="ignore"):
        y = np.where(x < 0, np.float32(np.nan), y)
    y = np.where(x == 0, np.float32(-np.inf), y)
    y = np.where(x == np.inf, x, y)
    return np.where(np.isnan(x), x, y)


def _horner(coefficients, v):
    p = np.full_like(v, coefficients[0])
    for c in coefficients[1:]:
        p = p * v + c
    return p
