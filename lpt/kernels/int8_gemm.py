"""u8 × (s8 or u8) → int32 products with a constant right-hand side, on onnxruntime's MLAS integer GEMM.

Why MLAS: its integer GEMM is 2–8× faster than the f32 BLAS route of lpt.kernels.gemm
(bench/resnet18.py measures it), and its results are int32 sums, not floats. It is reached
through a one-node onnxruntime session running MatMulInteger, whose constant B onnxruntime
packs once, when the session is built.

Two routes, the same integers:
- "u8s8": B as int8. On a CPU with VNNI or AMX, MLAS multiplies u8 by s8 in hardware. On AVX2
  without VNNI its u8 × s8 kernel adds pairs of products in int16 with saturation (vpmaddubsw;
  onnxruntime's quantization guide describes it): not exact, so lpt does not take it there.
- "u8u8": B shifted to uint8 (b + 128) with zero point 128, which leaves b − zb as it was. MLAS's
  u8 × u8 kernels widen to int16 before they multiply and add (vpmaddwd): exact on AVX2 too, and
  as fast there as the saturating u8s8 kernel.

Exactness, proven rather than hoped for:
- every term is a product a·b with |a − za| ≤ 255 and |b − zb| ≤ 128, so with
  K ≤ MAX_REDUCTION = ⌊(2^31 − 1) / (255·128)⌋ = 65 793 the result fits int32 (callers check K).
  The zero-point terms MLAS adds (−za·Σb, −zb·Σa, K·za·zb) may pass int32 on the way; its
  vector adds wrap, so the sum is right modulo 2^32 and, fitting int32, right;
- `exact_routes` runs each route once per process on the inputs that give every partial sum the
  largest magnitude its sign allows (a = 255 against b = 127, then b = −128, and a long K): a
  kernel that saturates some intermediate on some input saturates on these. A kernel's order of
  operations does not depend on the data, so an exact probe means exact results for all inputs.

`gemm_route()` is the route lpt takes: the first exact one of u8s8, u8u8, or None (the f32 BLAS
route). The environment variable LPT_INT8_GEMM forces a choice (read once per process):
`u8u8` makes lpt act as on a CPU without VNNI, `off` takes the f32 BLAS route, `u8s8` the VNNI
route; a forced route that is not exact on this CPU is refused with a warning.
"""

from __future__ import annotations

import functools
import logging
import os

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

logger = logging.getLogger(__name__)

MAX_REDUCTION = (2**31 - 1) // (255 * 128)
ROUTES = ("u8s8", "u8u8")
ROUTE_VARIABLE = "LPT_INT8_GEMM"


class ConstantInt8Gemm:
    """y[m, n] = Σ_k (a[m, k] − za)·b[k, n] as int32, for 8-bit a [M, K] and the int8 b [K, N] given here."""

    def __init__(self, weights: np.ndarray, threads: int = 0, route: str = "u8s8"):
        weights = np.asarray(weights)
        if weights.dtype != np.int8 or weights.ndim != 2:
            raise ValueError(f"the constant operand must be int8 [K, N], got {weights.dtype} {weights.shape}")
        if weights.shape[0] > MAX_REDUCTION:
            raise ValueError(f"K = {weights.shape[0]} could overflow int32 (at most {MAX_REDUCTION})")
        if route not in ROUTES:
            raise ValueError(f"unknown route {route!r}: one of {', '.join(ROUTES)}")
        self.reduction, self.columns = weights.shape
        self.route = route
        self._session = _session(weights, threads, route)

    def __call__(self, a: np.ndarray, a_zero_point: int = 0) -> np.ndarray:
        a, a_zero_point = as_unsigned(a, a_zero_point)
        return self._session.run(None, {"a": a, "a_zero_point": np.array(a_zero_point, np.uint8)})[0]


def as_unsigned(q: np.ndarray, zero_point: int) -> tuple[np.ndarray, int]:
    """An int8 q and its zero point as uint8 q + 128 and zp + 128, which leave q − zp as it was; uint8 as it is.

    MLAS's left operand is u8. A caller that gathers q into a larger array (im2col) shifts it first.
    """
    if q.dtype != np.int8:
        return q, zero_point
    return q.view(np.uint8) ^ np.uint8(128), zero_point + 128


def _session(weights: np.ndarray, threads: int, route: str) -> ort.InferenceSession:
    k, n = weights.shape
    inputs = ["a", "b", "a_zero_point"]
    if route == "u8s8":
        constants = [helper.make_tensor("b", TensorProto.INT8, [k, n], weights.tobytes(), raw=True)]
    else:
        shifted, _ = as_unsigned(weights, 0)
        constants = [helper.make_tensor("b", TensorProto.UINT8, [k, n], shifted.tobytes(), raw=True),
                     helper.make_tensor("b_zero_point", TensorProto.UINT8, [], [128])]
        inputs.append("b_zero_point")
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", inputs, ["y"])], "int8_gemm",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, k]),
         helper.make_tensor_value_info("a_zero_point", TensorProto.UINT8, [])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [None, n])], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Spinning threads would steal the cores from the numpy work between two GEMMs.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@functools.cache
def exact_routes() -> tuple[str, ...]:
    """The routes whose MLAS kernel on this CPU is free of intermediate saturation (see the module doc).

    This is the CPU's fact, not lpt's choice: LPT_INT8_GEMM does not change it. "u8s8" missing
    means onnxruntime's own u8 × s8 kernels (QLinearConv, ConvInteger, QDQ models) saturate here.
    """
    return tuple(route for route in ROUTES if _probe(route))


def _probe(route: str) -> bool:
    for k, n, row_counts in ((300, 37, (1, 5, 64)), (MAX_REDUCTION, 3, (1,))):  # odd sizes reach edge handling
        for value in (127, -128):
            gemm = ConstantInt8Gemm(np.full((k, n), value, np.int8), threads=1, route=route)
            for rows in row_counts:
                if not np.all(gemm(np.full((rows, k), 255, np.uint8)) == 255 * value * k):
                    return False
    return True


@functools.cache
def gemm_route() -> str | None:
    """The MLAS route lpt's kernels take in this process: forced by LPT_INT8_GEMM, else the first exact one."""
    forced = os.environ.get(ROUTE_VARIABLE, "auto").strip().lower()
    if forced == "off":
        return None
    if forced in ROUTES:
        if forced in exact_routes():
            return forced
        logger.warning("%s=%s: that route saturates int16 pair sums on this CPU, so lpt does not take it",
                       ROUTE_VARIABLE, forced)
    elif forced != "auto":
        logger.warning("%s=%s is not one of auto, %s, off: ignored", ROUTE_VARIABLE, forced, ", ".join(ROUTES))
    return next(iter(exact_routes()), None)


def onnxruntime_saturation_note() -> str | None:
    """Why onnxruntime's int8 results may differ from lpt's on this CPU, or None where its u8s8 kernels are exact."""
    if "u8s8" in exact_routes():
        return None
    return "onnxruntime's u8s8 kernels saturate pair sums in int16 on this CPU (no VNNI); lpt's results are the exact ones"
