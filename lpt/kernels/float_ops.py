"""The float32 ops that sit between int8 layers (a pool after a ReLU kept in f32, a squeeze-excite's scale,
a HardSwish, a concatenation; attention's Softmax and a transformer's LayerNormalization), each as a
fixed order of float32 operations.

lpt's native engine runs the same operations in the same order (lpt/native/integer_ops.cpp), so a
network keeps to one native program across them, with the bits of these functions. They also agree
with onnxruntime's kernels, except where its order of additions differs (average_pool says where).
"""

from __future__ import annotations

import numpy as np

from lpt.numerics.exp import erf, exp, tanh

HARD_SWISH_ALPHA, HARD_SWISH_BETA = np.float32(1 / 6), np.float32(0.5)


def hard_swish(x) -> np.ndarray:
    """ONNX HardSwish: x·min(max(x·(1/6) + 1/2, 0), 1), one float32 operation at a time (with α = f32(1/6),
    as onnxruntime, which gives the same bits)."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore"):  # −inf·0 is NaN, as onnxruntime's
        return x * np.minimum(np.maximum(x * HARD_SWISH_ALPHA + HARD_SWISH_BETA, np.float32(0)), np.float32(1))


def hard_sigmoid(x, alpha: float, beta: float) -> np.ndarray:
    """ONNX HardSigmoid: min(max(x·α + β, 0), 1), α and β as float32 (a NaN stays NaN)."""
    x = np.asarray(x, dtype=np.float32)
    return np.minimum(np.maximum(x * np.float32(alpha) + np.float32(beta), np.float32(0)), np.float32(1))


def slope_and_clip(x, slope: float, low: float, high: float) -> np.ndarray:
    """The engine's output-stage post-op on float32 values: x < 0 ? x·slope : x (a LeakyRelu, where the slope
    is not 1), then x < low ? low : x and x > high ? high : x (a Clip, or a Max/Min with a constant), so
    that a NaN stays NaN and −0 stays −0."""
    x = np.asarray(x, dtype=np.float32)
    if slope != 1:
        x = np.where(x < 0, x * np.float32(slope), x)
    low, high = np.float32(low), np.float32(high)
    x = np.where(x < low, low, x)
    return np.where(x > high, high, x)


def gelu(x, divisor, one, half) -> np.ndarray:
    """x·(erf(x / divisor) + one)·half, in that order of float32 operations: GELU as PaddlePaddle's and
    PyTorch's exporters write it (Div, Erf, Add, Mul, Mul), so the same bits as those five ops."""
    x = np.asarray(x, dtype=np.float32)
    return (x * (erf(x / np.float32(divisor)) + np.float32(one))) * np.float32(half)


def tanh_gelu(x, cube, root, one, half) -> np.ndarray:
    """x·((one + tanh((x + x·(x·(cube·x)))·root))·half), in that order of float32 operations: GELU's tanh
    approximation as jax2tf writes it (Mul, Mul, Mul, Add, Mul, Tanh, Add, Mul, Mul), so the bits of those
    nine ops with lpt's tanh."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # x³ may overflow, and −inf·0 is NaN, as onnxruntime's
        inner = (x + x * (x * (np.float32(cube) * x))) * np.float32(root)
        return x * ((np.float32(one) + tanh(inner)) * np.float32(half))


def relu(x) -> np.ndarray:
    """ONNX Relu on float32: x where x > 0 or x is NaN, else +0 (so −0 becomes +0, as numpy's maximum(x, 0)
    gives it, stated here because the engine follows this function, not numpy's implementation)."""
    x = np.asarray(x, dtype=np.float32)
    return np.where((x > 0) | np.isnan(x), x, np.float32(0))


def average_pool(x, kernel_shape, strides=None, pads=None, count_include_pad: bool = False) -> np.ndarray:
    """ONNX AveragePool (2-D, floor mode, no dilation) on float32 [N, C, H, W].

    Each window column is added down its rows, then the columns from left to right, all in float32
    (the padding as 0.0), and the total divided by the count: the window's area with
    `count_include_pad`, else the elements inside the input. onnxruntime (MLAS) adds in this order
    for the windows measured (2×2 stride 2; 3×3 stride 1 and 2, padded or not; 5×5 stride 1), but
    row by row for 3×3 of stride 3, where the last bit of some averages differs.
    """
    x = np.asarray(x, dtype=np.float32)
    (kh, kw), (sh, sw) = kernel_shape, strides or (1, 1)
    top, left, bottom, right = pads or (0, 0, 0, 0)
    h, w = x.shape[2:]
    out_h, out_w = (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    inside = np.pad(np.ones((h, w), np.float32), ((top, bottom), (left, right)))
    total, count = None, None
    for j in range(kw):
        column, column_count = None, None
        for i in range(kh):
            rows, cols = slice(i, i + sh * (out_h - 1) + 1, sh), slice(j, j + sw * (out_w - 1) + 1, sw)
            value = padded[:, :, rows, cols]
            column = value if column is None else column + value
            column_count = inside[rows, cols] if column_count is None else column_count + inside[rows, cols]
        total = column if total is None else total + column
        count = column_count if count is None else count + column_count
    divisor = np.float32(kh * kw) if count_include_pad else count
    return total / divisor


LANES = 8


def sum_in_lanes(x) -> np.ndarray:
    """The sum along the last axis in eight lanes (keeping the axis, as 1): lane j adds x[j], x[j + 8], … in
    order, with zeros past the end, then the lanes are added as ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)).
    The native engine adds a row eight values per instruction in this order; a single running sum would
    wait on each addition."""
    x = np.asarray(x, dtype=np.float32)
    n = x.shape[-1]
    padded = np.zeros(x.shape[:-1] + (max(1, -(-n // LANES)) * LANES,), np.float32)
    padded[..., :n] = x
    lanes = np.add.accumulate(padded.reshape(x.shape[:-1] + (-1, LANES)), axis=-2)[..., -1, :]
    pairs = [lanes[..., j] + lanes[..., j + 1] for j in range(0, LANES, 2)]
    return ((pairs[0] + pairs[1]) + (pairs[2] + pairs[3]))[..., None]


def dense(x, weights, bias=None) -> np.ndarray:
    """x [..., k] · weights [k, n] in float32: from 0, each product x[i]·w[i, c] rounded and then added, for
    i = 0, 1, …, k − 1 in order; then + bias[c]. The native engine computes eight columns per instruction
    in this order; onnxruntime's GEMM blocks the sum and fuses multiply and add, so its last bits differ."""
    x, weights = np.asarray(x, np.float32), np.asarray(weights, np.float32)
    total = np.zeros((*x.shape[:-1], weights.shape[1]), np.float32)
    for i in range(weights.shape[0]):
        total += x[..., i, None] * weights[i]
    return total if bias is None else total + np.asarray(bias, np.float32)


def convolution_1d(x, weights, stride: int, bias=None, pads=(0, 0)) -> np.ndarray:
    """ONNX Conv of x [N, C, length] by weights [O, C, k] with `stride` and zero `pads` at the start and the end,
    one group, no dilation, as `dense` of each frame (its k samples of channel 0, then of channel 1, ...) by the
    weights as [C·k, O]: [N, O, frames]. An STFT's (C = 1, no pads) frames x[t·stride : t·stride + k]."""
    x = np.pad(np.asarray(x, np.float32), ((0, 0), (0, 0), tuple(pads)))
    weights = np.asarray(weights, np.float32)
    k = weights.shape[-1]
    frames = np.lib.stride_tricks.sliding_window_view(x, k, axis=-1)[:, :, ::stride]  # [N, C, frames, k]
    rows = frames.transpose(0, 2, 1, 3).reshape(x.shape[0], frames.shape[2], -1)
    return np.ascontiguousarray(dense(rows, weights.reshape(weights.shape[0], -1).T, bias).transpose(0, 2, 1))


def fold_frames(frames, sign: int) -> np.ndarray:
    """Frames [..., k] folded about their middle as a DFT's weights are (w[k − n] = ±w[n]): f[0] = x[0],
    f[n] = x[n] + sign·x[k − n] for n = 1 … (k − 1) // 2 (an add or a subtract, each a float32 operation), and
    for an even k f[k / 2] = x[k / 2]: [..., k // 2 + 1]."""
    frames = np.asarray(frames, np.float32)
    k = frames.shape[-1]
    half = (k - 1) // 2
    first, second = frames[..., 1:half + 1], frames[..., k - 1:k - 1 - half:-1]  # x[n] and x[k − n]
    parts = [frames[..., :1], first + second if sign > 0 else first - second]
    return np.concatenate(parts + ([frames[..., k // 2:k // 2 + 1]] if k % 2 == 0 else []), axis=-1)


def folded_convolution_1d(x, folded, kernel: int, sign: int, stride: int, bias=None, pads=(0, 0)) -> np.ndarray:
    """convolution_1d of one channel whose weights [O, 1, kernel] are even (sign 1) or odd (sign −1) about their
    middle, w[o, kernel − n] = sign·w[o, n] (an STFT's: each frequency's cosine or sine times a symmetric
    window), as `dense` of each frame folded (fold_frames) by the weights' first kernel // 2 + 1 as `folded`
    [kernel // 2 + 1, O]: half the products. [N, O, frames]."""
    x = np.pad(np.asarray(x, np.float32), ((0, 0), (0, 0), tuple(pads)))
    frames = np.lib.stride_tricks.sliding_window_view(x[:, 0], kernel, axis=-1)[:, ::stride]  # [N, frames, k]
    return np.ascontiguousarray(dense(fold_frames(frames, sign), folded, bias).transpose(0, 2, 1))


def softmax(x) -> np.ndarray:
    """ONNX Softmax along the last axis: m = the maximum, e = lpt's exp(x − m) (lpt.numerics.exp), Σe in
    lanes (sum_in_lanes), y = e / Σe. onnxruntime's differs in the last bits (its own exp, and a product
    with 1 / Σe)."""
    x = np.asarray(x, dtype=np.float32)
    e = exp(x - np.max(x, axis=-1, keepdims=True))
    return e / sum_in_lanes(e)


def layer_norm(x, scale, bias=None, epsilon=1e-5) -> np.ndarray:
    """ONNX LayerNormalization along the last axis: the mean (the values added in lanes, sum_in_lanes,
    divided by their count), d = x − mean, the variance (d·d added in lanes, divided by the count), then
    y = d / sqrt(variance + epsilon) · scale [+ bias], each a float32 operation. onnxruntime accumulates in
    its own way: the last bits differ."""
    x = np.asarray(x, dtype=np.float32)
    count = np.float32(x.shape[-1])
    mean = sum_in_lanes(x) / count
    d = x - mean
    deviation = np.sqrt(sum_in_lanes(d * d) / count + np.float32(epsilon))
    y = d / deviation * np.asarray(scale, np.float32)
    return y if bias is None else y + np.asarray(bias, np.float32)


def moment_layer_norm(x, factor, epsilon, scale, bias) -> np.ndarray:
    """LayerNorm over axis 1 of float32 [N, C, T] or [N, C] as jax2tf writes flax's, from the first two moments:
    s1 = Σ x and s2 = Σ x·x (the C values added in order), mean = s1·factor, variance = max(0, s2·factor −
    mean·mean), then y = (x − mean)·(1 / sqrt(variance + epsilon)·scale[c]) + bias[c], each a float32
    operation. The max keeps a NaN and gives +0 for −0. onnxruntime adds its sums in its own order."""
    x = np.asarray(x, dtype=np.float32)
    factor, epsilon = np.float32(factor), np.float32(epsilon)
    s1 = np.add.accumulate(x, axis=1)[:, -1:]
    s2 = np.add.accumulate(x * x, axis=1)[:, -1:]
    mean = s1 * factor
    difference = s2 * factor - mean * mean
    variance = np.where(np.isnan(difference) | (difference > 0), difference, np.float32(0))
    inverse = np.float32(1) / np.sqrt(variance + epsilon)
    channel = (slice(None),) + (None,) * (x.ndim - 2)
    return (x - mean) * (inverse * np.asarray(scale, np.float32)[channel]) + np.asarray(bias, np.float32)[channel]


def mean_over_last_axis(x, keepdims: bool) -> np.ndarray:
    """ReduceMean over the last axis of float32: the values added in lanes (sum_in_lanes), divided by their count."""
    x = np.asarray(x, dtype=np.float32)
    mean = sum_in_lanes(x) / np.float32(x.shape[-1])
    return mean if keepdims else mean[..., 0]


def mean_over_axis_1(x, keepdims: bool) -> np.ndarray:
    """ReduceMean over axis 1 of float32 [N, T, C] (a sequence's mean): each channel's T values added in order,
    then divided by T, as the global average (kernels.global_average_pool) adds them."""
    x = np.asarray(x, dtype=np.float32)
    mean = np.add.accumulate(x, axis=1)[:, -1] / np.float32(x.shape[1])
    return mean[:, None] if keepdims else mean


def extreme_over_middle_axes(x, keepdims: bool, smallest: bool = False) -> np.ndarray:
    """ReduceMax (ReduceMin with `smallest`) of float32 [N, *middle, C] over its middle axes (a global max
    pool of channels-last maps): the fold, over the middle positions in order, in which a value replaces the
    running one where it is greater (smaller), or is NaN while the running one is not. Max and min round
    nothing; the fold settles what they leave open: of equal values (−0 and +0) the first, of NaNs the
    first. No middle position gives ∓inf, ONNX's value for an empty reduction."""
    x = np.asarray(x, dtype=np.float32)
    values = x.reshape(x.shape[0], -1, x.shape[-1])
    if values.shape[1] == 0:
        extreme = np.full((values.shape[0], values.shape[2]), np.inf if smallest else -np.inf, np.float32)
    else:
        nan = np.isnan(values)
        filled = np.where(nan, np.float32(np.inf if smallest else -np.inf), values)
        bound = filled.min(axis=1) if smallest else filled.max(axis=1)
        chosen = np.where(nan.any(axis=1)[:, None, :], nan, values == bound[:, None, :])
        extreme = np.take_along_axis(values, chosen.argmax(axis=1)[:, None, :], axis=1)[:, 0]
    return extreme.reshape((x.shape[0],) + (1,) * (x.ndim - 2) + (x.shape[-1],)) if keepdims else extreme
