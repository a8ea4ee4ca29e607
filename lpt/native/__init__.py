"""lpt's native int8 engine: convolution and matmul on oneDNN 3.2, exact to the integer (issue 12, first piece).

    conv = lpt.native.Conv(weights_s8, groups=1, strides=(1, 1), pads=(1, 1, 1, 1), src_zero_point=zp,
                           multiplier=s_src * s_wei, bias=bias, post_ops=(Relu(),),
                           dst_scale=s_dst, dst_zero_point=zp_dst, dst_dtype=np.uint8, threads=2)
    dst = conv(src_u8_nchw)            # [N, OC, *out], lpt.kernels.output_stage's integers, bit for bit
    acc = conv.accumulate(src_u8_nchw)  # the int32 accumulators, = lpt.kernels.reference.conv_reference

    lpt.native.MatMul(weights_s8_kn, ...)    the same for u8/s8 [..., K] × constant s8 [K, N]
    lpt.native.Product(a_zero_point=za, ...) u8/s8 [..., M, K] × u8/s8 [..., K, N], both at run time
    lpt.native.dynamic_quantize(x)           ONNX DynamicQuantizeLinear: (q, scale, zero point)
    lpt.native.route()                       "u8s8", "s16", "split" or None: what this process runs (routes.py)
    lpt.native.engine_name(route)            how reports name it: "oneDNN (u8s8)", "lpt AVX2 (s16)", ...
    lpt.native.layer_engine(name, native)    what computed a layer in its last run: s16 by Winograd, say
    lpt.native.available(), unavailable_reason()
    with lpt.native.workers_held(): ...     the workers spin between the engine's loops (a plan's run)

Where the engine cannot run a step (see operations.py), creating it raises `Unsupported` with the
reason, and lpt's NumPy/MLAS kernels run it. Without the engine (built without a C++ compiler or
oneDNN, or LPT_ONEDNN=off) lpt says so once, here, and runs as before.
"""

from __future__ import annotations

import contextlib
import logging

from lpt.native._library import engine, reason
from lpt.native.operations import Conv, MatMul, Product, Unsupported, dynamic_quantize
from lpt.native.routes import exact_routes, route

logger = logging.getLogger(__name__)

__all__ = ["Conv", "MatMul", "PRODUCT_ENGINE", "Product", "Unsupported", "WINOGRAD_ENGINE", "available",
           "dynamic_quantize", "engine_name", "exact_routes", "is_native_engine", "layer_engine", "onednn_version",
           "route", "unavailable_reason"]

_ENGINE_NAMES = {"u8s8": "oneDNN (u8s8)", "split": "oneDNN (split)", "s16": "lpt AVX2 (s16)"}
PRODUCT_ENGINE = "lpt int32 (product)"  # what computes a Product, on every route
WINOGRAD_ENGINE = "lpt AVX2 (s16, Winograd)"  # an s16 convolution whose last run took Winograd's F(2×2, 3×3)


def engine_name(route: str) -> str:
    """The name reports give the engine of a route: oneDNN's primitives, or lpt's own s16 kernel."""
    return _ENGINE_NAMES[route]


def is_native_engine(name: str) -> bool:
    """Whether a step's engine (lpt.backend.step.Step.engine) is one of the native engine's routes."""
    return name in _ENGINE_NAMES.values() or name in (PRODUCT_ENGINE, WINOGRAD_ENGINE)


def layer_engine(name: str, native: tuple | None) -> str:
    """What computed an int8 layer in its last run: `name`, its step's engine, or WINOGRAD_ENGINE for
    an s16 convolution that took Winograd then (s16 decides per source shape). `native` is the
    step's instruction (Step.native)."""
    if engine is not None and native is not None and native[0] == "layer" and \
            engine.implementation(native[1]) == "lpt:s16_winograd_avx2":
        return WINOGRAD_ENGINE
    return name


class _WorkersHeld:
    """lpt_parallel::hold for as long as a `with` block lasts (nothing without the engine)."""

    __slots__ = ()

    def __enter__(self):
        if engine is not None:
            engine.hold_pool()

    def __exit__(self, *exception):
        if engine is not None:
            engine.release_pool()


_WORKERS_HELD = _WorkersHeld()


def workers_held() -> _WorkersHeld:
    """The engine's workers spin between its loops while this lasts (a plan's run), instead of sleeping
    between two of its steps: lpt/native/parallel.cpp's SPIN_YIELDING says why."""
    return _WORKERS_HELD


@contextlib.contextmanager
def workers_let_go():
    """For as long as the block lasts, one hold on the engine's workers (workers_held: a plan's run) is lifted,
    so that they sleep after a moment instead of spinning on, and leave both cores to an onnxruntime region of
    two threads that runs meanwhile (held, a worker spins and yields its CPU at each look, and that region ran
    slower so: lpt/backend/fallback.py's RegionRunner gives the figures)."""
    if engine is None or engine.pool_holds() <= 0:
        yield
        return
    engine.release_pool()
    try:
        yield
    finally:
        engine.hold_pool()


def available() -> bool:
    """Whether the compiled engine and oneDNN loaded (not whether a route is exact here: see route())."""
    return engine is not None


def unavailable_reason() -> str | None:
    """Why the engine is not available, or None."""
    return reason


def onednn_version() -> str | None:
    """oneDNN's version as major.minor.patch, or None without the engine."""
    return None if engine is None else "{}.{}.{}".format(*engine.version()[:3])


if engine is None:
    (logger.info if reason and reason.endswith("=off") else logger.warning)(
        "lpt's native int8 engine is not available (%s): lpt runs its NumPy/MLAS kernels", reason)
