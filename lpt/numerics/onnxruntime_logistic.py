"""onnxruntime's float32 logistic function (its Sigmoid, and the sigmoid inside its QuickGelu), bit for bit.

lpt defines its own Sigmoid (lpt.numerics.exp); this one is onnxruntime's, for the models whose outputs lpt
promises equal to onnxruntime's: a dynamically quantized model computes each layer's scale from the range of
the tensor before it, so one bit of difference at a range's end moves every level of the next layer (measured
on ddddocr_common_old_dynq: lpt's own Sigmoid took its output from onnxruntime's bits to 39.5 dB of them).

On x86-64 with AVX2 and FMA3 (AVX-512 CPUs too: no other kernel replaces it there) MLAS computes it as
MlasComputeLogisticF32KernelFma3, Eigen's rational approximation, each step one float32 operation:

    v = min(18, max(−18, x))        (as vmaxps/vminps take them: a NaN passes through)
    x2 = v·v
    p = fma(x2, α9, α7); p = fma(p, x2, α5); p = fma(p, x2, α3); p = fma(p, x2, α1); p = v·p
    q = fma(x2, β10, β8); q = fma(q, x2, β6); q = fma(q, x2, β4); q = fma(q, x2, β2); q = fma(q, x2, β0)
    logistic(x) = max(0, p / q + 0.5)          (a NaN, or −0, passes through)

fma is one rounding (lpt.numerics.fake_quantize.fma_f32); the native engine (integer_ops.cpp,
dynamic_stage) computes the same with vfmadd and std::fmaf. tests/numerics/test_onnxruntime_logistic.py checks
this against onnxruntime's Sigmoid and QuickGelu.

Its SiLU (QuickGelu with alpha 1, which Sigmoid then Mul by x fuse into) is x·logistic(x), except where MLAS has
an AVX-512F kernel for it (onnxruntime 1.32 on a Zen 4): that one clamps the logistic at 1 as well, x·min(1,
logistic(x)), and gives a NaN x back as it came. The two differ where p/q + 0.5 rounds above 1: on 20 float32
values, between 17.48 and 17.99.
"""

from __future__ import annotations

import numpy as np

from lpt.numerics.fake_quantize import fma_f32

_LOW, _HIGH = np.float32(-18.0), np.float32(18.0)
_ALPHA = tuple(np.float32(a) for a in (4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05,
                                       8.51377133304701e-03, 2.48287947061529e-01))  # α9, α7, α5, α3, α1
_BETA = tuple(np.float32(b) for b in (6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06,
                                      1.70198817374094e-03, 1.16817656904453e-01, 9.93151921023180e-01))  # β10 … β0


def logistic(x) -> np.ndarray:
    """onnxruntime's Sigmoid of float32 x (the table above)."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        v = np.where(_LOW > x, _LOW, x)  # max(−18, x) as vmaxps(−18, x): x unless −18 is greater
        v = np.where(_HIGH < v, _HIGH, v)
        x2 = v * v
        p = fma_f32(x2, _ALPHA[0], _ALPHA[1])
        for alpha in _ALPHA[2:]:
            p = fma_f32(p, x2, alpha)
        p = v * p
        q = fma_f32(x2, _BETA[0], _BETA[1])
        for beta in _BETA[2:]:
            q = fma_f32(q, x2, beta)
        y = p / q + np.float32(0.5)
        return np.where(np.float32(0) > y, np.float32(0), y).astype(np.float32)


def silu(x, clamped: bool = False) -> np.ndarray:
    """x·logistic(x): onnxruntime's Sigmoid then Mul (its QuickGelu with alpha 1 where MLAS has no AVX-512F SiLU);
    `clamped`, x·min(1, logistic(x)): its QuickGelu on an AVX-512F CPU."""
    x = np.asarray(x, dtype=np.float32)
    y = logistic(x)
    if clamped:
        y = np.where(y > np.float32(1), np.float32(1), y)  # a NaN stays, and so does the product
    with np.errstate(invalid="ignore"):  # ±inf·0
        return x * y
