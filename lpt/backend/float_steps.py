"""The float32 ops between int8 layers, as steps of lpt's own, so that a network stays in one native program.

A model quantized around its convolutions leaves a few float32 ops between them: an average pool
after a ReLU that only the pool's output quantizes, a squeeze-excite's scale (x · sigmoid(...)), a
HardSwish, a Concat of two layers' float outputs, a global average before the classifier. Run by
onnxruntime, each is a session call (about 0.02 ms) and cuts the native program in two. Taken here,
each is a step with lpt.kernels' float32 function and the native engine's instruction that computes
the same bits:

    Identity (any type)          the same array                   "identity" (a view)
    Reshape, Transpose,          numpy's                          "reshape", "transpose", "squeeze",
      Squeeze, Unsqueeze, Slice,                                    "unsqueeze", "slice" (int8_steps.layout_step)
      Gather (one index)
    BatchNormalization           x·a[c] + b[c]                    "affine"
    Sigmoid                      lpt.numerics.exp.sigmoid         "sigmoid"
    Tanh                         lpt.numerics.exp.tanh            "tanh"
    GlobalAveragePool            kernels.global_average_pool      "mean"
    AveragePool (2-D, floor)     kernels.average_pool             "average_pool"
    Relu                         kernels.relu                     "relu"
    LeakyRelu, Clip, Max/Min(c)  kernels.slope_and_clip           "clip" (the output stage's post-op; a Clip's
                                                                    bound made at run time: its one value)
    HardSwish, HardSigmoid       kernels.hard_swish, hard_sigmoid "hard_swish", "hard_sigmoid"
    Erf (GELU's)                 lpt.numerics.exp.erf             "erf"
    Div, Erf, Add, Mul, Mul      kernels.gelu                     "gelu" (x·(erf(x / d) + 1)·0.5 in one pass)
    Mul, Mul, Mul, Add, Mul,     kernels.tanh_gelu                "tanh_gelu" (jax2tf's tanh GELU in one pass)
      Tanh, Add, Mul, Mul
    Mul, Add, Sub, Div           numpy's ·, +, −, /               "binary" (the broadcasts _engine_broadcasts lists;
                                                                    none where a shape is not known)
    Concat                       numpy's concatenate              "concat" (float32 or 8-bit; an axis, the channels' None)
    Softmax (last axis)          kernels.softmax                  "softmax"
    ReduceMax, Max, ... (10 ops) kernels.softmax                  "softmax" (jax2tf's softmax, chains.read_written_softmax)
    LayerNormalization (last)    kernels.layer_norm               "layer_norm"
    ReduceSum, Mul, ... (19 ops) kernels.moment_layer_norm        "moment_layer_norm" (jax2tf's LayerNorm over
                                                                    axis 1 of [N, C, T] or [N, C],
                                                                    chains.read_moment_layer_norm)
    ReduceMean (the positions)   kernels.global_average_pool      "mean"
    ReduceMean (the last axis)   kernels.mean_over_last_axis      "mean_last_axis"
    ReduceMean (axis 1, [N,T,C]) kernels.mean_over_axis_1         "mean_axis_1"
    ReduceMax, ReduceMin         kernels.extreme_over_middle_axes "extreme_middle" (keepdims, smallest)
      (the middle axes: [N, *positions, C], a channels-last global max pool)
    ReduceMax, ReduceMin (all)   kernels.extreme_over_middle_axes "extreme_all" (keepdims, smallest)
      (every value, as [1, values, 1])
    GlobalMaxPool                kernels.extreme_over_middle_axes "global_max" (of [N, C, *spatial])
    Pow(x, 2), Sqrt              x·x, numpy's sqrt                "binary" mul of x and x, "sqrt"
    Log                          lpt.numerics.exp.log             "log"
    Gather (a constant table)    numpy's take                     "gather"
    MatMul (constant [k, n])     kernels.dense                    "dense" (try_spectrum_step: of a power spectrum;
                                                                    in a specialized region, of FEW_ROWS rows)
    Conv ([N, C, L])             kernels.convolution_1d           "dense" of the frames (try_spectrum_step)
    MaxPool                      kernels.max_pool_q               "max_pool" (2-D; −inf padding)
    Pad (constant)               numpy's pad                      "pad" (int8_steps.pad_step)
    Greater, Less, Equal, ...    numpy's comparisons              none (an If's condition: if_steps)
    Cast between float32, bool   numpy's astype                   "identity" from float32 to float32, else none

The plan takes such a node only where an int8 step (or a step of this module) makes a tensor it reads,
where only native programs read its output (the end of an onnxruntime region: plan._ends_a_region),
a Gather from a constant table where the model's input holds its indices (a token embedding), and the
layers of a power spectrum that stays in float32 wherever they are (try_spectrum_step says why); elsewhere
float32 regions stay with onnxruntime. onnxruntime computes the same bits but for
OWN_FLOAT_RESULTS, whose sums and functions it computes in its own way: the last bits of a value
differ (kernels.float_ops says where). A plan with dynamic quantization takes none of those.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from lpt import kernels
from lpt.backend.chains import (read_convolution_1d, read_gelu, read_moment_layer_norm, read_post_op,
                                read_stft_convolution, read_tanh_gelu, read_written_softmax)
from lpt.backend.int8_steps import LAYOUT_OPS, _step, layout_step, max_pool_step, onnx_reshape_dims, pad_step
from lpt.errors import DataError
from lpt.graph.constants import const_array
from lpt.graph.ops import attribute
from lpt.numerics.exp import erf, log, sigmoid, tanh

_FLOAT = ir.DataType.FLOAT
_BINARY = {"Mul": (np.multiply, "mul"), "Add": (np.add, "add"), "Sub": (np.subtract, "sub"), "Div": (np.divide, "div")}
_COMPARISONS = {"Greater": np.greater, "GreaterOrEqual": np.greater_equal, "Less": np.less,
                "LessOrEqual": np.less_equal, "Equal": np.equal}
_CASTS = {ir.DataType.FLOAT: np.float32, ir.DataType.BOOL: np.bool_}  # to and from: NaN → True, as ONNX's
BACKEND = "lpt float32"  # Step.backend: float32 ops, not int8 kernels, and not onnxruntime's


def _float_step(run, inputs, node, native) -> tuple:
    return _step(run, inputs, [node], native=native, backend=BACKEND)


# The ops whose float32 results lpt defines for itself (its own exp, erf and orders of addition), a few
# float32 steps from onnxruntime's. Where a DynamicQuantizeLinear computes a scale from a tensor's range at
# run time, one such step at the range's end moves every value's level: measured on ddddocr_common_old_dynq
# (already quantized that way), lpt's Sigmoid took its output from onnxruntime's bits to 39.5 dB of them.
OWN_FLOAT_RESULTS = ("GlobalAveragePool", "AveragePool", "ReduceMean", "Sigmoid", "Tanh", "Erf", "Softmax",
                     "LayerNormalization", "BatchNormalization", "ReduceSum", "Log", "MatMul")

# In a region specialized to its inputs' shapes (lpt.backend.specialized_regions), a float32 MatMul by constant
# weights of at most FEW_ROWS rows and DENSE_WEIGHTS weights is lpt's: an unrolled LSTM cell's (lpt.graph.lstm_cell).
# onnxruntime's GEMM is faster on large products (try_spectrum_step), but on a row its session call costs more
# than the sums: silero_vad's cell, 1 × 256 by 256 × 512, was the one onnxruntime op left between two native
# programs. Elsewhere such MatMuls keep onnxruntime's bits.
FEW_ROWS, DENSE_WEIGHTS = 16, 1 << 20


def try_float_step(node: ir.Node, own_results: bool = True, small_products: bool = False) -> tuple | None:
    """The step for a float32 op between int8 layers (the table above), or None where lpt does not take it.
    Without `own_results`, only ops that give onnxruntime's bits (not OWN_FLOAT_RESULTS); with `small_products`,
    the small MatMuls FEW_ROWS says."""
    if not own_results and node.op_type in OWN_FLOAT_RESULTS:
        return None
    if node.op_type == "Gather" and node.domain in ("", "ai.onnx") and (lookup := _lookup(node)) is not None:
        return lookup
    if node.op_type == "Identity" and node.domain in ("", "ai.onnx") and node.inputs and node.inputs[0] is not None:
        return _float_step(lambda a: [a], [node.inputs[0]], node, ("identity", None))
    if node.op_type in LAYOUT_OPS and node.domain in ("", "ai.onnx") and node.inputs and node.inputs[0] is not None:
        return layout_step(node, BACKEND)
    if node.op_type == "Concat" and node.domain in ("", "ai.onnx"):
        return _concat(node)
    if node.op_type == "Resize" and node.domain in ("", "ai.onnx") and node.inputs and node.inputs[0] is not None:
        return _nearest_upsampling(node)
    if node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] is None:
        return None
    if node.op_type == "Cast" and node.inputs[0].dtype in _CASTS and ir.DataType(attribute(node, "to", 0)) in _CASTS:
        to = _CASTS[ir.DataType(attribute(node, "to"))]
        unchanged = node.inputs[0].dtype == _FLOAT and to is np.float32
        return _float_step(lambda a: [np.asarray(a).astype(to)], [node.inputs[0]], node,
                           ("identity", None) if unchanged else None)
    if node.inputs[0].dtype != _FLOAT:
        return None
    if node.op_type in _COMPARISONS and len(node.inputs) == 2 and node.inputs[1] is not None \
            and node.inputs[1].dtype == _FLOAT:
        compare = _COMPARISONS[node.op_type]
        return _float_step(lambda a, b: [np.asarray(compare(a, b))], list(node.inputs), node, None)
    if node.op_type in _BINARY and any(v is None or v.dtype != _FLOAT for v in node.inputs):
        return None
    x = node.inputs[0]
    if node.op_type == "MaxPool":
        return max_pool_step(node, BACKEND)
    if node.op_type == "Pad":
        return pad_step(node, BACKEND)
    if node.op_type == "GlobalAveragePool":
        return _float_step(lambda a: [kernels.global_average_pool(a)], [x], node, ("mean", None))
    if node.op_type == "HardSwish":
        return _float_step(lambda a: [kernels.hard_swish(a)], [x], node, ("hard_swish", None))
    if node.op_type == "HardSigmoid":
        alpha, beta = float(np.float32(attribute(node, "alpha", 0.2))), float(np.float32(attribute(node, "beta", 0.5)))
        return _float_step(lambda a: [kernels.hard_sigmoid(a, alpha, beta)], [x], node, ("hard_sigmoid", (alpha, beta)))
    if small_products and node.op_type == "MatMul" and x.shape is not None and x.shape.is_static() and \
            len(x.shape) >= 2 and math.prod(x.shape[:-1]) <= FEW_ROWS and \
            (weights := const_array(node.inputs[1])) is not None and weights.size <= DENSE_WEIGHTS:
        return _dense(node)
    if node.op_type == "Sigmoid":
        return _float_step(lambda a: [sigmoid(a)], [x], node, ("sigmoid", None))
    if node.op_type == "Tanh":
        return _float_step(lambda a: [tanh(a)], [x], node, ("tanh", None))
    if node.op_type == "BatchNormalization":
        return _batch_norm(node)
    if node.op_type in ("LeakyRelu", "Clip", "Max", "Min"):
        return _slope_and_clip(node)
    if node.op_type == "Relu":
        return _float_step(lambda a: [kernels.relu(a)], [x], node, ("relu", None))
    if node.op_type == "Sqrt":
        return _float_step(lambda a: [np.sqrt(a)], [x], node, ("sqrt", None))
    if node.op_type == "Log":
        return _float_step(lambda a: [log(a)], [x], node, ("log", None))
    if node.op_type == "Pow" and (exponent := const_array(node.inputs[1])) is not None and exponent.size == 1 \
            and float(exponent.reshape(())) == 2.0:  # x·x, one rounding, as pow(x, 2) rounds it
        return _float_step(lambda a, b: [a * b], [x, x], node, ("binary", "mul"))
    if node.op_type == "Erf":
        return _float_step(lambda a: [erf(a)], [x], node, ("erf", None))
    if node.op_type == "AveragePool":
        return _average_pool(node)
    if node.op_type == "Div" and own_results and (fused := _gelu(node)) is not None:  # its Erf is lpt's own
        return fused
    if node.op_type == "Mul" and own_results and (found := read_tanh_gelu(node)) is not None:  # its Tanh too
        (cube, root, one, half), source, chain = found
        return _step(lambda a: [kernels.tanh_gelu(a, cube, root, one, half)], [source], chain,
                     native=("tanh_gelu", (cube, root, one, half)), backend=BACKEND)
    if own_results and node.op_type in ("ReduceSum", "Mul") and (fused := _moment_layer_norm(node)) is not None:
        return fused
    if node.op_type in _BINARY and len(node.inputs) == 2:
        operation, name = _BINARY[node.op_type]
        # the engine's broadcasts; where a shape is not known (after a Squeeze of every 1, say), numpy's
        native = ("binary", name) if _engine_broadcasts(*node.inputs) else None
        if native is not None or any(v.shape is None for v in node.inputs):
            # asarray: numpy gives a scalar for two 0-d arrays (a dynamic quantization's scales)
            return _float_step(lambda a, b: [np.asarray(operation(a, b))], list(node.inputs), node, native)
    if node.op_type == "Softmax" and x.shape is not None and _is_last_axis(node, x, default=None):
        return _float_step(lambda a: [kernels.softmax(a)], [x], node, ("softmax", None))
    if node.op_type == "LayerNormalization":
        return _layer_norm(node)
    if node.op_type == "ReduceMean":
        return _reduce_mean(node)
    if node.op_type == "ReduceMax" and own_results and (fused := _written_softmax(node)) is not None:  # its Exp is lpt's
        return fused
    if node.op_type in ("ReduceMax", "ReduceMin"):
        return _reduce_extreme(node)
    if node.op_type == "GlobalMaxPool" and x.shape is not None and len(x.shape) >= 3:
        return _float_step(lambda a: [_global_max_pool(a)], [x], node, ("global_max", None))
    return None


def try_spectrum_step(node: ir.Node) -> tuple | None:
    """A layer the power-spectrum rule keeps in float32 (lpt.calibration.placement.spectral_power) as lpt's own
    product: a convolution of [N, C, length] (an STFT's, or the first layer of silero_vad_16k_op15's encoder, on its
    magnitudes), or a MatMul by constant weights (mel filters), or None.

    lpt's product of an STFT's frames is faster than onnxruntime's Conv on short signals: oww_melspectrogram's
    two (5 frames of 512 samples into 257 frequencies each) took 110-126 µs as a session of their own, 25-29 µs
    each in lpt's program of the model (13 µs alone, its weights in cache). Alone, against onnxruntime's Conv:
    0.35× at 5 frames, 0.82-0.89× at 100, but 1.23-1.27× at 1000 and 1.26-1.29× at 3000 frames of 400
    samples (two runs), where the program it keeps whole no longer pays for it. Not every float32 MatMul: on larger
    products (128×256 by 256×256) kernels.dense's order of sums took twice onnxruntime's time."""
    return _convolution_1d(node) if node.op_type == "Conv" else _dense(node) if node.op_type == "MatMul" else None


def frames_signals(node: ir.Node, layers: set[ir.Node]) -> bool:
    """Whether `node` is an Unsqueeze or Reshape (of the model's input, say) that only STFT convolutions among
    `layers` read: a view of lpt's before them; or a Pad that only such views read (silero_vad_16k_op15 reflects
    its signal's ends before framing it)."""
    readers = [reader for reader, _ in node.outputs[0].uses()] if node.outputs else []
    if node.domain not in ("", "ai.onnx") or not readers:
        return False
    if node.op_type == "Pad":
        return all(frames_signals(r, layers) for r in readers)
    return (node.op_type in ("Unsqueeze", "Reshape")
            and all(r in layers and read_stft_convolution(r) is not None for r in readers))


def _dense(node: ir.Node) -> tuple | None:
    """A float32 MatMul by constant weights [k, n] (of a source of rank 2 at least): kernels.dense."""
    x, weights = node.inputs[0], const_array(node.inputs[1]) if len(node.inputs) == 2 else None
    if weights is None or weights.dtype != np.float32 or weights.ndim != 2 or x.shape is None or len(x.shape) < 2:
        return None
    weights = np.ascontiguousarray(weights)
    return _float_step(lambda a: [kernels.dense(a, weights)], [x], node, ("dense", (weights, None, 0)))


def _convolution_1d(node: ir.Node) -> tuple | None:
    """A Conv of [N, C, length] (read_convolution_1d: an STFT's, or a layer reading a spectrum) as
    kernels.convolution_1d."""
    found = read_convolution_1d(node)
    if found is None:
        return None
    weights, bias, stride, pads = found
    name, k = node.name, weights.shape[2]
    sign = _dft_parity(weights)

    def convolve(signal):
        if signal.shape[-1] + sum(pads) < k:
            padding = f" and {sum(pads)} of padding" if any(pads) else ""
            raise DataError(f"node {name!r} (Conv): {signal.shape[-1]} samples{padding}, fewer than its kernel's {k}")
        if sign:
            return [kernels.folded_convolution_1d(signal, folded, k, sign, stride, bias, pads)]
        return [kernels.convolution_1d(signal, weights, stride, bias, pads)]

    if sign:
        folded = np.ascontiguousarray(weights[:, 0, :k // 2 + 1].T)  # [k // 2 + 1, O]
        return _float_step(convolve, [node.inputs[0]], node, ("dense", (folded, bias, stride, 1, *pads, k, sign)))
    rows = np.ascontiguousarray(weights.reshape(weights.shape[0], -1).T)  # [C·k, O]
    return _float_step(convolve, [node.inputs[0]], node, ("dense", (rows, bias, stride, weights.shape[1], *pads)))


# Kernels shorter than this are not folded (silero_vad_16k_op15's encoder reads 3 samples): a DFT's frames are
# hundreds of samples, and a short filter's products are few.
FOLDED_KERNEL = 64


def _dft_parity(weights: np.ndarray) -> int:
    """1 where the weights [O, 1, k] of a Conv of one channel are even about their middle, w[o, k − n] = w[o, n]
    for n = 1 … (k − 1) // 2 (an STFT's cosines times a symmetric window), −1 where odd (its sines), else 0 (and
    for kernels below FOLDED_KERNEL). A pair may also be two values below 2^-30 of the largest weight in
    magnitude: a DFT's zeros, computed at two arguments, round to tiny values of their own (oww_melspectrogram's
    weights: 844 of 65 535 pairs, at most 1.3e-13 apart, against weights up to 1); the folded product reads the
    first of the two."""
    _, channels, k = weights.shape
    if channels != 1 or k < FOLDED_KERNEL:
        return 0
    half = (k - 1) // 2
    first, second = weights[:, 0, 1:half + 1], weights[:, 0, k - 1:k - 1 - half:-1]
    tiny = np.float32(2.0 ** -30) * np.abs(weights).max()
    both_tiny = (np.abs(first) < tiny) & (np.abs(second) < tiny)
    for sign in (1, -1):
        if np.all((first == sign * second) | both_tiny):
            return sign
    return 0


def _global_max_pool(x: np.ndarray) -> np.ndarray:
    """GlobalMaxPool of float32 [N, C, *spatial]: each channel's extreme over its positions, by the fold
    kernels.extreme_over_middle_axes settles (which of equal values and of NaNs)."""
    x = np.asarray(x, dtype=np.float32)
    extreme = kernels.extreme_over_middle_axes(np.moveaxis(x.reshape(x.shape[:2] + (-1,)), 1, -1), keepdims=False)
    return extreme.reshape(x.shape[:2] + (1,) * (x.ndim - 2))


def _moment_layer_norm(node: ir.Node) -> tuple | None:
    """jax2tf's LayerNorm (chains.read_moment_layer_norm) as one step, from the first of its nodes the plan
    meets: the ReduceSum of x or the Mul of x by x (its other ReduceSum)."""
    x = node.inputs[0]
    if node.op_type == "Mul":
        if len(node.inputs) != 2 or node.inputs[1] is not x:
            return None
        node = next((n for n in x.consumers() if n.op_type == "ReduceSum" and n.inputs[0] is x), None)
    found = read_moment_layer_norm(node) if node is not None else None
    if found is None:
        return None
    (factor, epsilon, scale, bias), source, chain, checked = found
    return _checked_reduction(lambda a: kernels.moment_layer_norm(a, factor, epsilon, scale, bias), source, chain,
                              checked, 1, ("moment_layer_norm", (factor, epsilon, scale, bias)), "LayerNorm")


def _written_softmax(reduce_max: ir.Node) -> tuple | None:
    """jax2tf's softmax (chains.read_written_softmax) as one step: kernels.softmax, its exp and sums lpt's own."""
    found = read_written_softmax(reduce_max)
    if found is None:
        return None
    source, chain, checked = found
    return _checked_reduction(kernels.softmax, source, chain, checked, len(source.shape) - 1, ("softmax", None), "softmax")


def _checked_reduction(function, source: ir.Value, chain: list[ir.Node], checked: list[ir.Node], axis: int,
                       native: tuple, what: str) -> tuple:
    """A written-out reduction's step: function(x), after checking the shapes its Reshapes and Expands in
    `checked` are given at this run (reduced_shapes_hold), which it reads after x."""
    shapes = list(dict.fromkeys(n.inputs[1] for n in checked))
    checks = [(n.op_type, attribute(n, "allowzero", 0), shapes.index(n.inputs[1])) for n in checked]
    name = chain[0].name

    def run(a, *given):
        if not reduced_shapes_hold(np.shape(a), axis, checks, given):
            raise DataError(f"node {name!r}: a {what}'s Reshape or Expand is given the shape "
                            f"{[np.asarray(g).tolist() for g in given]}, not its input's {list(np.shape(a))} with 1 "
                            f"along axis {axis}: lpt does not run that")
        return [function(a)]

    return _step(run, [source, *shapes], chain, native=native, backend=BACKEND)


def reduced_shapes_hold(x_shape: tuple, axis: int, checks: list[tuple[str, int, int]], given) -> bool:
    """Whether each checked Reshape (of a reduction: x's shape without `axis`) and Expand (of that, reshaped)
    gives x's shape with 1 at `axis`, by ONNX's rules (a 0 copies a dimension unless allowzero, a −1 is
    what the count leaves; an Expand broadcasts), from the shapes `given` at this run."""
    expected = (*x_shape[:axis], 1, *x_shape[axis + 1:])
    reduced = (*x_shape[:axis], *x_shape[axis + 1:])
    for op_type, allow_zero, index in checks:
        shape = tuple(int(v) for v in np.asarray(given[index]).reshape(-1))
        try:
            if op_type == "Reshape":
                shape = np.broadcast_to(np.float32(0), reduced).reshape(onnx_reshape_dims(reduced, shape, allow_zero)).shape
            else:
                shape = np.broadcast_shapes(expected, shape)
        except (ValueError, IndexError):  # no such reshape or broadcast
            return False
        if tuple(shape) != expected:
            return False
    return True


def _gelu(div: ir.Node) -> tuple | None:
    """GELU's five ops (chains.read_gelu) as one step and one pass over the tensor."""
    found = read_gelu(div)
    if found is None:
        return None
    op, chain = found
    return _step(lambda a: [op.apply(a)], [div.inputs[0]], chain, native=("gelu", (op.divisor, op.one, op.half)),
                 backend=BACKEND)


def _nearest_upsampling(node: ir.Node) -> tuple | None:
    """A Resize that repeats each value of [N, C, H, W] k_h × k_w times (whole factors, nearest): a copy, of
    any type. Taken where every output pixel reads source y // k_h, x // k_w: coordinate_transformation_mode
    asymmetric with nearest_mode floor (PaddleOCR's), or half_pixel with either rounding (PyTorch's
    default export), whose (y + 0.5)/k − 0.5 lies within 0.5 of y // k. Opset 11 and later (X, roi,
    scales, sizes), without axes."""
    if len(node.inputs) < 3 or attribute(node, "mode", "nearest") != "nearest" or attribute(node, "axes") is not None:
        return None
    mapping = (attribute(node, "coordinate_transformation_mode", "half_pixel"),
               attribute(node, "nearest_mode", "round_prefer_floor"))
    if mapping not in (("asymmetric", "floor"), ("half_pixel", "round_prefer_floor"), ("half_pixel", "round_prefer_ceil")):
        return None
    x = node.inputs[0]
    scales = const_array(node.inputs[2]) if node.inputs[2] is not None else None
    if scales is None or scales.size == 0:
        sizes = const_array(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
        known = x.shape is not None and all(isinstance(d, int) for d in x.shape)
        if sizes is None or not known or sizes.size != len(x.shape) or any(d == 0 for d in x.shape):
            return None
        scales = sizes.astype(np.float64) / np.array(x.shape, np.float64)
    scales = np.asarray(scales, np.float64).reshape(-1)
    if scales.size != 4 or scales[0] != 1 or scales[1] != 1 or np.any(scales[2:] < 1) or \
            np.any(scales[2:] != np.round(scales[2:])):
        return None
    factors = (int(scales[2]), int(scales[3]))
    return _float_step(lambda a: [kernels.upsample_nearest(a, factors)], [x], node, ("resize_nearest", factors))


def _concat(node: ir.Node) -> tuple | None:
    """Concat of tensors of one type, float32 or 8-bit: a copy, as ONNX's (an 8-bit one is what the low precision
    transformations leave of a Concat of branches quantized alike). Along the channels, or any other axis
    (basic_pitch's harmonic stacking joins eight [N, 172, 309, 1] along the last)."""
    x = node.inputs[0]
    if any(v is None or v.dtype != x.dtype for v in node.inputs) or x.shape is None or len(x.shape) < 2:
        return None
    axis = attribute(node, "axis", 1)
    if x.dtype not in (_FLOAT, ir.DataType.UINT8, ir.DataType.INT8) or not -len(x.shape) <= axis < len(x.shape):
        return None
    axis %= len(x.shape)
    return _float_step(lambda *parts: [np.concatenate(parts, axis=axis)], list(node.inputs), node,
                       ("concat", None if axis == 1 else axis))


def reads_model_input_from_a_table(node: ir.Node, constants: dict) -> bool:
    """A Gather from a constant float32 table by indices the model is given (a token embedding): taken at
    the model's input, where it splits no onnxruntime region."""
    if node.op_type != "Gather" or len(node.inputs) != 2 or node.inputs[1] is None:
        return False
    indices = node.inputs[1]
    return indices.producer() is None and indices.name not in constants and const_array(node.inputs[0]) is not None


def _lookup(node: ir.Node) -> tuple | None:
    """Gather along axis 0 of a constant float32 table: rows by index, numpy's take."""
    table = const_array(node.inputs[0])
    if table is None or table.dtype != np.float32 or table.ndim < 1 or attribute(node, "axis", 0) != 0:
        return None
    if node.inputs[1].dtype not in (ir.DataType.INT64, ir.DataType.INT32):
        return None
    name, rows = node.name, table.shape[0]

    def look_up(indices):
        indices = np.asarray(indices)
        if indices.size and (indices.min() < -rows or indices.max() >= rows):
            raise DataError(f"node {name!r} (Gather): an index outside [{-rows}, {rows - 1}]")
        return [np.take(table, indices, axis=0)]

    return _float_step(look_up, [node.inputs[1]], node, ("gather", (np.ascontiguousarray(table).reshape(-1), table.shape)))


def _is_last_axis(node: ir.Node, x: ir.Value, default: int | None) -> bool:
    """Whether the node's `axis` is x's last. A Softmax without one means 1 before opset 13 and −1 from
    it on, which agree only on rank 2 (`default` None: the node's opset is not known here)."""
    rank = len(x.shape)
    axis = attribute(node, "axis", default)
    return rank == 2 if axis is None else axis in (-1, rank - 1)


def _layer_norm(node: ir.Node) -> tuple | None:
    x = node.inputs[0]
    if x.shape is None or not _is_last_axis(node, x, default=-1) or attribute(node, "stash_type", 1) != 1:
        return None
    if any(output.uses() or output.is_graph_output() for output in node.outputs[1:]):
        return None  # the mean and inverse deviation it may also give
    scale = const_array(node.inputs[1])
    bias = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
    if scale is None or (len(node.inputs) > 2 and node.inputs[2] is not None and bias is None):
        return None
    width = x.shape[-1]
    if not isinstance(width, int) or scale.size != width or (bias is not None and bias.size != width):
        return None
    scale = np.ascontiguousarray(scale.reshape(-1), np.float32)
    bias = None if bias is None else np.ascontiguousarray(bias.reshape(-1), np.float32)
    epsilon = float(np.float32(attribute(node, "epsilon", 1e-5)))
    return _float_step(lambda a: [kernels.layer_norm(a, scale, bias, epsilon)], [x], node,
                       ("layer_norm", (scale, bias, epsilon)))


def _slope_and_clip(node: ir.Node) -> tuple | None:
    """LeakyRelu, Clip, and Max/Min with one constant, as the output stage's post-op reads them (chains.read_post_op);
    a Clip whose bounds are made at run time too (_clip_by_values)."""
    runtime = [v for v in node.inputs if v is not None and const_array(v) is None]
    if node.op_type == "Clip" and len(runtime) > 1 and runtime[0] is node.inputs[0]:
        return _clip_by_values(node)
    if len(runtime) != 1 or runtime[0].dtype != _FLOAT:
        return None
    op = read_post_op(node, runtime[0])
    if isinstance(op, kernels.LeakyRelu):
        parameters = (float(np.float32(op.alpha)), -np.inf, np.inf)
    elif isinstance(op, kernels.Clip):
        parameters = (1.0, float(np.float32(op.low)), float(np.float32(op.high)))
    else:
        return None
    return _float_step(lambda a: [kernels.slope_and_clip(a, *parameters)], runtime, node, ("clip", parameters))


def _clip_by_values(node: ir.Node) -> tuple | None:
    """Clip (opset 11 on) whose min or max another op makes (one value, as ONNX's Clip takes): kernels.slope_and_clip
    with that value. oww_melspectrogram clips its log-mel spectrum below at its maximum less 80 dB."""
    x, bounds = node.inputs[0], [node.inputs[i] if len(node.inputs) > i else None for i in (1, 2)]
    if any(v is not None and v.dtype != _FLOAT for v in (x, *bounds)):
        return None
    given = [None if v is None else const_array(v) for v in bounds]
    if any(g is not None and g.size != 1 for g in given):
        return None
    constant = []  # each bound's value, or None where it is read at run time
    for bound, value, absent in zip(bounds, given, (-np.inf, np.inf)):
        constant.append(absent if bound is None else None if value is None else float(value.reshape(-1)[0]))
    read = [v for v, value in zip(bounds, constant) if value is None]
    name = node.name

    def clip(a, *values):
        for v in values:
            if np.size(v) != 1:
                raise DataError(f"node {name!r} (Clip): a bound of {np.size(v)} values, not one")
        it = iter(values)
        low, high = (float(np.asarray(next(it)).reshape(-1)[0]) if value is None else value for value in constant)
        return [kernels.slope_and_clip(a, 1.0, low, high)]

    return _float_step(clip, [x, *read], node, ("clip", (1.0, *constant)))


def _batch_norm(node: ir.Node) -> tuple | None:
    """BatchNormalization for inference, constant statistics: a per-channel x·a + b, with a = scale /
    sqrt(var + epsilon) and b = bias − mean·a computed once in float32 (onnxruntime's last bits may differ)."""
    x = node.inputs[0]
    if len(node.inputs) != 5 or attribute(node, "training_mode", 0) or any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
        return None
    scale, bias, mean, var = (const_array(v) for v in node.inputs[1:])
    if any(p is None for p in (scale, bias, mean, var)) or x.shape is None or len(x.shape) < 2:
        return None
    epsilon = np.float32(attribute(node, "epsilon", 1e-5))
    factor = (scale.astype(np.float32) / np.sqrt(var.astype(np.float32) + epsilon)).reshape(-1)
    shift = (bias.astype(np.float32) - mean.astype(np.float32) * factor).reshape(-1)
    shape = (-1,) + (1,) * (len(x.shape) - 2)
    factor_c, shift_c = factor.reshape(shape), shift.reshape(shape)
    return _float_step(lambda a: [a * factor_c + shift_c], [x], node,
                       ("affine", (np.ascontiguousarray(factor), np.ascontiguousarray(shift))))


def _reduced_axes(node: ir.Node) -> list[int] | None:
    """A Reduce* node's axes, each in [0, rank), sorted: its attribute or (opset 18) its constant second input;
    None where they are not known, or where there are none (all axes, or none with noop_with_empty_axes)."""
    x, axes = node.inputs[0], _given_axes(node)
    if x.shape is None or not axes:
        return None
    return sorted(a % len(x.shape) for a in axes)


def _given_axes(node: ir.Node) -> list[int] | None:
    """A Reduce* node's axes as given (its attribute or, from opset 18, its constant second input), or None."""
    axes = attribute(node, "axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = const_array(node.inputs[1])
    return None if axes is None else [int(a) for a in np.reshape(axes, -1)]


def _mean_over_axis_1_of_any_rank(a, keepdims: bool) -> np.ndarray:
    """ReduceMean over axis 1 of a tensor whose rank the graph does not say: of [N, T] a row's mean, of [N, T, C]
    a sequence's (as the engine's "mean_axis_1" takes either); numpy's mean of another rank."""
    a = np.asarray(a, np.float32)
    if a.ndim == 2:
        return kernels.mean_over_last_axis(a, keepdims)
    if a.ndim == 3:
        return kernels.mean_over_axis_1(a, keepdims)
    return np.mean(a, axis=1, keepdims=keepdims, dtype=np.float32)


def _reduce_extreme(node: ir.Node) -> tuple | None:
    """ReduceMax or ReduceMin over the middle axes of [N, *positions, C] (a channels-last global max pool), or over
    every axis (oww_melspectrogram's maximum, which its Clip reads)."""
    x, axes = node.inputs[0], _reduced_axes(node)
    keepdims, smallest = bool(attribute(node, "keepdims", 1)), node.op_type == "ReduceMin"
    every_axis = (attribute(node, "axes") is None and (len(node.inputs) < 2 or node.inputs[1] is None)
                  and not attribute(node, "noop_with_empty_axes", 0))
    if every_axis and x.shape is not None:
        rank = len(x.shape)

        def extreme(a):
            flat = np.asarray(a).reshape(1, -1, 1)
            return [kernels.extreme_over_middle_axes(flat, False, smallest).reshape((1,) * rank if keepdims else ())]

        return _float_step(extreme, [x], node, ("extreme_all", (keepdims, smallest)))
    if axes is None or len(x.shape) < 3 or axes != list(range(1, len(x.shape) - 1)):
        return None
    return _float_step(lambda a: [kernels.extreme_over_middle_axes(a, keepdims, smallest)], [x], node,
                       ("extreme_middle", (keepdims, smallest)))


def _reduce_mean(node: ir.Node) -> tuple | None:
    """ReduceMean over every position of [N, C, *spatial] (a global average), over the last axis (a LayerNorm
    written out), or over axis 1 of [N, T, C] (a sequence's mean)."""
    x, axes = node.inputs[0], _reduced_axes(node)
    keepdims = bool(attribute(node, "keepdims", 1))
    if x.shape is None and _given_axes(node) == [1]:  # after an If that squeezes where an axis is 1 (if_steps)
        return _float_step(lambda a: [_mean_over_axis_1_of_any_rank(a, keepdims)], [x], node, ("mean_axis_1", (keepdims,)))
    if axes is None:
        return None
    rank = len(x.shape)
    if rank >= 3 and keepdims and axes == list(range(2, rank)):
        return _float_step(lambda a: [kernels.global_average_pool(a)], [x], node, ("mean", None))  # every position
    if len(axes) != 1:
        return None
    [axis] = axes
    if axis == rank - 1:
        return _float_step(lambda a: [kernels.mean_over_last_axis(a, keepdims)], [x], node,
                           ("mean_last_axis", (keepdims,)))
    if axis == 1 and rank == 3:
        return _float_step(lambda a: [kernels.mean_over_axis_1(a, keepdims)], [x], node, ("mean_axis_1", (keepdims,)))
    return None


def _average_pool(node: ir.Node) -> tuple | None:
    kernel = attribute(node, "kernel_shape")
    if kernel is None or len(kernel) != 2 or attribute(node, "ceil_mode", 0) != 0:
        return None
    if attribute(node, "auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET") or any(d != 1 for d in attribute(node, "dilations", [1, 1])):
        return None
    strides = tuple(attribute(node, "strides", [1, 1]))
    pads = tuple(attribute(node, "pads", [0, 0, 0, 0]))
    include_pad = bool(attribute(node, "count_include_pad", 0))
    return _float_step(lambda a: [kernels.average_pool(a, kernel, strides, pads, include_pad)], [node.inputs[0]], node,
                       ("average_pool", (tuple(kernel), strides, pads, include_pad)))


def _engine_broadcasts(a: ir.Value, b: ir.Value) -> bool:
    """Whether the shapes are ones the engine's "binary" takes: the same, one value (a scalar), one value
    per image and channel ([N, C, 1, ...]) over [N, C, *spatial], one per row ([..., 1] over [..., n]),
    or one operand repeated over the other's leading axes ([1, T, C] over [N, T, C]). Symbolic
    dimensions may be equal; the engine checks them at run time (a program whose instruction does not
    take its input gives way to the steps). Where one shape is not known, only a scalar (rank 0) operand:
    the other's shape is the output's, whatever it is (plcmos_v2's score, Sigmoid(...) · 5 + 1)."""
    if a.shape is None or b.shape is None:
        known = b.shape if a.shape is None else a.shape
        return known is not None and len(known) == 0
    if _one_value(a.shape) or _one_value(b.shape) or _repeats(a.shape, b.shape) or _repeats(b.shape, a.shape):
        return True
    if _per_row(a.shape, b.shape) or _per_row(b.shape, a.shape):
        return True
    if len(a.shape) != len(b.shape):
        return False
    if all(_may_equal(x, y) for x, y in zip(a.shape, b.shape)):
        return True
    big, small = (a, b) if all(d == 1 for d in b.shape[2:]) else (b, a)
    return (len(big.shape) >= 3 and all(_may_equal(x, y) for x, y in zip(small.shape[:2], big.shape[:2]))
            and all(d == 1 for d in small.shape[2:]))


def _repeats(small, big) -> bool:
    """Whether `small` is `big`'s last dimensions after leading 1s (a position embedding [1, T, C] over [N, T, C])."""
    small, big = tuple(small), tuple(big)
    if len(small) > len(big):
        return False
    first = next((i for i, d in enumerate(small) if d != 1), len(small))
    return all(_may_equal(d, e) for d, e in zip(small[first:], big[len(big) - len(small) + first:]))


def _per_row(small, big) -> bool:
    """Whether `small` is `big` with a last dimension of 1 (a mean over the last axis, kept)."""
    return (len(small) == len(big) >= 1 and small[-1] == 1
            and all(_may_equal(d, e) for d, e in zip(tuple(small)[:-1], tuple(big)[:-1])))


def _one_value(shape) -> bool:
    return all(d == 1 for d in shape)


def _may_equal(x, y) -> bool:
    return x == y or not isinstance(x, int) or not isinstance(y, int)
