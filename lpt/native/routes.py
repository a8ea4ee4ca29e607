"""Which oneDNN route computes exact int32 accumulators on this CPU, probed once per process.

- "u8s8": the plain u8 × s8 primitive. With VNNI/AMX oneDNN multiplies and adds in int32 and is
  exact (and about twice as fast as the split); on AVX2 without VNNI it adds pairs of products in
  int16 with saturation (vpmaddubsw), and almost every accumulator of a real layer is wrong.
- "s16": lpt's own AVX2 kernel (s16.cpp), not oneDNN: the source widened to int16 and pairs of
  products added in int32 (vpmaddwd), exact by construction. It runs convolutions of one group
  (1-D, 2-D) and matmuls; grouped, depthwise and 3-D convolutions take the split route.
- "split": the weights as 64·hi + lo, lo in [0, 63], hi in [−2, 1]; no pair sum can reach 2^15,
  and lpt's engine forms acc = 64·acc_hi + acc_lo in integers. Exact wherever u8s8 is, and on AVX2,
  but two passes.

Exactness is proven as lpt.kernels.int8_gemm proves MLAS's: `exact_routes` runs each route once per
process on the inputs that give every partial sum the largest magnitude its sign allows (source
255 against weights 127, then −128), over the kinds of kernels oneDNN picks by shape (3×3, 1×1,
depthwise, grouped, strided, 1-D, a long reduction, matmul with edge sizes). A kernel's order of
operations does not depend on the data, so a kernel exact on these is exact on all inputs.

`route()` is the route lpt takes: the first exact one of u8s8, s16, split, or None (the engine is
not used). u8s8 comes first where exact (VNNI: one pass of int8 dot products); on AVX2, s16 runs a
ResNet-18's convolutions about 1.5× faster than split (bench/native_conv.py). LPT_ONEDNN=auto|u8s8|s16|split|off
forces a choice (read once per process), so CI runs each route on any CPU; a forced route that is
not exact here (u8s8 without VNNI) is refused with a warning.
"""

from __future__ import annotations

import functools
import logging
import os

import numpy as np

from lpt.native._library import DISABLE_VARIABLE, engine

logger = logging.getLogger(__name__)

ROUTES = ("u8s8", "s16", "split")  # in order of preference
ROUTE_VARIABLE = DISABLE_VARIABLE

# (weights shape [OC, IC/groups, *kernel], groups, strides, input spatial shape): no padding, so
# every output sums all K = IC/groups·∏kernel products.
_PROBE_CONVS = (
    ((37, 64, 3, 3), 1, (1, 1), (6, 6)),  # jit 3×3, odd OC
    ((19, 512, 1, 1), 1, (1, 1), (5, 5)),  # 1×1
    ((24, 1, 3, 3), 24, (1, 1), (7, 7)),  # depthwise
    ((32, 16, 3, 3), 2, (1, 1), (5, 5)),  # grouped
    ((16, 64, 3, 3), 1, (2, 2), (9, 9)),  # strided
    ((8, 100, 5), 1, (1,), (12,)),  # 1-D
    ((4, 2048, 3, 3), 1, (1, 1), (3, 3)),  # a long reduction, K = 18 432
)
_PROBE_MATMULS = ((300, 37, (1, 5, 64)), (4000, 3, (1,)))  # (K, N, row counts)


@functools.cache
def exact_routes() -> tuple[str, ...]:
    """The routes whose oneDNN kernels on this CPU are free of intermediate saturation (see the module doc).

    The CPU's fact, not lpt's choice: LPT_ONEDNN does not change it. Empty without the engine.
    """
    if engine is None:
        return ()
    return tuple(route for route in ROUTES if (route != "s16" or engine.s16_supported()) and _probe(route))


def _probe(route: str) -> bool:
    for value in (127, -128):
        for shape, groups, strides, spatial in _PROBE_CONVS:
            if not runs(route, groups, len(spatial)):
                continue
            rank = len(spatial)
            weights = np.full(shape, value, np.int8)
            operation = engine.conv(weights, shape, groups, strides, (1,) * rank, (0,) * rank, (0,) * rank, 0, route, 1,
                                    np.ones(shape[0], np.float32), None, np.zeros(0, np.float32), "f32", 1.0, 0, 0, 255)
            src = np.full((1, shape[1] * groups) + spatial, 255, np.uint8)
            out_spatial = tuple((n - k) // s + 1 for n, k, s in zip(spatial, shape[2:], strides))
            acc = np.empty((1, shape[0]) + out_spatial, np.int32)
            engine.run(operation, src, acc, True)
            if not np.all(acc == 255 * value * int(np.prod(shape[1:]))):
                return False
        for k, n, row_counts in _PROBE_MATMULS:
            operation = engine.matmul(np.full((k, n), value, np.int8), (k, n), 0, route, 1, np.ones(n, np.float32),
                                      None, np.zeros(0, np.float32), "f32", 1.0, 0, 0, 255)
            for rows in row_counts:
                acc = np.empty((rows, n), np.int32)
                engine.run(operation, np.full((rows, k), 255, np.uint8), acc, True)
                if not np.all(acc == 255 * value * k):
                    return False
    return True


# Products per output value below which a u8s8 convolution of one group runs on s16 (conv_route).
FEW_PRODUCTS = 32


def conv_route(route: str, reduction: int, groups: int, spatial_axes: int, staged: bool = False) -> str:
    """The route of a convolution of `reduction` products per output value: `route`, except that on u8s8
    a layer of one group and fewer than FEW_PRODUCTS goes to s16, where exact, unless the operation made on
    u8s8 applies its output stage as it goes (`staged`, as the engine says: oneDNN's primitive, or lpt's own
    kernel for such layers where the CPU has AVX-512 VNNI, lpt/native/stem.h: 2.5-2.6 ms below). oneDNN 3.2's
    u8s8 kernels for such layers (jit_int8, for an input channel count below 4) run far under their
    peak, and lpt's stage of their many values after them cost more than s16, which fuses it. Measured on
    a Xeon with AMX, 2 threads, 3×3 to 128 channels over 900×161 with a Relu: from 1 channel 10.8 ms on
    u8s8 with lpt's stage, 5.3-6.6 on s16, 3.1-3.8 staged by oneDNN; from 3 channels 10.5, 8.1-9.2 and
    3.1. A 7×7 stem of 3 channels (147 products) and a 3×3 of 8 (72) are faster on u8s8 either way
    (0.53 against 0.98 ms, 0.78 against 1.40 ms), as are depthwise layers."""
    if (route == "u8s8" and not staged and groups == 1 and reduction < FEW_PRODUCTS and spatial_axes <= 2
            and "s16" in exact_routes()):
        return "s16"
    return route


def runs(route: str, groups: int, spatial_axes: int, depthwise: bool = False) -> bool:
    """Whether `route` runs a convolution of this kind (the others take the split route): s16 runs 1-D
    and 2-D convolutions of one group, and depthwise ones (one input and one output channel per group)."""
    return route != "s16" or (spatial_axes <= 2 and (groups == 1 or depthwise))


@functools.cache
def route() -> str | None:
    """The route lpt's native engine takes in this process: forced by LPT_ONEDNN, else the first exact one."""
    forced = os.environ.get(ROUTE_VARIABLE, "auto").strip().lower()
    if forced == "off" or engine is None:
        return None
    if forced in ROUTES:
        if forced in exact_routes():
            return forced
        logger.warning("%s=%s: that route is not exact on this CPU (int16 pair sums saturate), so lpt does not "
                       "take it", ROUTE_VARIABLE, forced)
    elif forced != "auto":
        logger.warning("%s=%s is not one of auto, %s, off: ignored", ROUTE_VARIABLE, forced, ", ".join(ROUTES))
    return next(iter(exact_routes()), None)
