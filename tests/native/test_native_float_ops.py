"""The float32 instructions of native programs (average pool, HardSwish, Erf, GELU, binary ops, concat, Softmax,
LayerNormalization, a sequence's mean, a max over positions, slices, a product by constant weights) against
lpt.kernels.float_ops and numpy, bit for bit, on channels-first inputs and on a convolution's
channels-last outputs, which the engine keeps in that layout."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import lpt.native
from lpt.backend.int8_steps import slice_range
from lpt.kernels import (average_pool, convolution_1d, dense, extreme_over_middle_axes, folded_convolution_1d, gelu,
                         hard_sigmoid, hard_swish, layer_norm, mean_over_axis_1, mean_over_last_axis, moment_layer_norm,
                         relu, slope_and_clip, softmax, tanh_gelu)
from lpt.native import Unsupported
from lpt.kernels.quantize import one_hot_levels, quantize
from lpt.native.program import Program
from lpt.numerics.exp import erf, log, sigmoid, tanh

@pytest.fixture(autouse=True, scope="module", params=["eight lanes", "one lane"])
def lanes(request):
    """Every test twice: with the AVX2 loops (where the CPU has AVX2, as both our kinds of machine do), and
    with the one-value loops a CPU without AVX2 takes, forced. Both must give lpt's kernels' bits."""
    if not lpt.native.available():  # tests/native/conftest.py skips (or, in CI, fails) each test
        yield request.param
        return
    previous = lpt.native.engine.float_lanes(request.param == "eight lanes")
    yield request.param
    lpt.native.engine.float_lanes(previous)


SPECIAL = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, 3.0, -3.0, 1e30, -1e30])


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


def source(rng, shape, layout, special=False):
    """(program instructions that make "x", its inputs, the f32 values "x" holds): the values themselves
    (channels-first), or a 1×1 convolution's f32 output (the engine leaves it channels-last)."""
    if layout == "channels_first":
        x = rng.normal(0, 3, shape).astype(np.float32)
        if special:
            x.reshape(-1)[:SPECIAL.size] = SPECIAL[: x.size]
        return [], {"x": x}, x
    weights = rng.integers(-128, 128, (shape[1], shape[1]) + (1,) * (len(shape) - 2)).astype(np.int8)
    conv = lpt.native.Conv(weights, src_zero_point=128, multiplier=np.float32(0.003), threads=1)
    q = rng.integers(0, 256, shape).astype(np.uint8)
    return [("layer", ["q"], "x", conv.instruction[1])], {"q": q}, conv(q)


def run(rng, shape, layout, instruction, special=False):
    make, feeds, x = source(rng, shape, layout, special)
    program = Program(make + [instruction], list(feeds), ["y"], threads=2)
    [y] = program(*feeds.values())
    return y, x


@given(seed=st.integers(0, 2**32 - 1), layout=st.sampled_from(["channels_first", "channels_last"]),
       kernel=st.tuples(st.integers(1, 4), st.integers(1, 4)), strides=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       pad_fraction=st.tuples(*[st.integers(0, 3)] * 4), include_pad=st.booleans(), special=st.booleans())
@settings(max_examples=60, deadline=None)
def test_average_pool_is_lpts(seed, layout, kernel, strides, pad_fraction, include_pad, special):
    rng = np.random.default_rng(seed)
    pads = tuple(min(p, kernel[i % 2] - 1) for i, p in enumerate(pad_fraction))  # ONNX: a pad smaller than the window
    shape = (2, 3, kernel[0] + int(rng.integers(0, 9)), kernel[1] + int(rng.integers(0, 9)))
    parameters = (kernel, strides, pads, include_pad)
    y, x = run(rng, shape, layout, ("average_pool", ["x"], "y", parameters), special)
    assert same_bits(y, average_pool(x, kernel, strides, pads, include_pad))


@given(seed=st.integers(0, 2**32 - 1), layout=st.sampled_from(["channels_first", "channels_last"]))
@settings(max_examples=20, deadline=None)
def test_hard_swish_is_lpts(seed, layout):
    rng = np.random.default_rng(seed)
    y, x = run(rng, (2, 5, 6, 7), layout, ("hard_swish", ["x"], "y", None), special=True)
    assert same_bits(np.ascontiguousarray(y), hard_swish(x))


OPERATIONS = {"mul": np.multiply, "add": np.add, "sub": np.subtract, "div": np.divide}


@given(seed=st.integers(0, 2**32 - 1), operation=st.sampled_from(sorted(OPERATIONS)), layouts=st.tuples(
    st.sampled_from(["channels_first", "channels_last"]), st.sampled_from(["channels_first", "channels_last"])),
       other=st.sampled_from(["same", "per_channel", "per_channel_every_image", "scalar", "repeated", "per_row"]),
       swapped=st.booleans(),
       quantized=st.sampled_from([None, (0.05, 128, 0, 255, False), (0.02, -3, -128, 127, True)]))
@settings(max_examples=80, deadline=None)
def test_a_binary_op_of_two_tensors_is_numpys(seed, operation, layouts, other, swapped, quantized):
    """The same shape in either layout, a scalar, a squeeze-excite's [N, C, 1, 1] scale over [N, C, H, W] (or a
    bias's [1, C, 1, 1] for every image), one value per row, or one image's values over every image, on either side (Sub and Div keep the operands' order).
    Quantized right after (a residual sum for the next layer): the engine writes the levels in the same pass."""
    rng = np.random.default_rng(seed)
    make_a, feeds_a, a = source(rng, (2, 6, 5, 4), layouts[0])
    if other == "same":
        make_b, feeds_b, b = source(rng, (2, 6, 5, 4), layouts[1])
        make_b = [(kind, ["q2"], "b", p) for kind, _, _, p in make_b]
        feeds_b = {("q2" if k == "q" else "b"): v for k, v in feeds_b.items()}
    else:
        shape = {"per_channel": (2, 6, 1, 1), "per_channel_every_image": (1, 6, 1, 1), "scalar": (1, 1, 1),
                 "repeated": (1, 6, 5, 4), "per_row": (2, 6, 5, 1)}[other]
        b = rng.normal(0, 2, shape).astype(np.float32)
        if other in ("repeated", "per_row") and layouts[0] == "channels_last":
            make_a, feeds_a, a = source(rng, (2, 6, 5, 4), "channels_first")  # these: channels-first only
        make_b, feeds_b = [], {"b": b}
    operands = ["b", "x"] if swapped else ["x", "b"]
    then = [("quantize", ["y"], "z", quantized)] if quantized else []
    program = Program(make_a + make_b + [("binary", operands, "y", operation)] + then, list(feeds_a) + list(feeds_b),
                      ["z" if quantized else "y"], threads=2)
    [y] = program(*feeds_a.values(), *feeds_b.values())
    expected = OPERATIONS[operation](*((b, a) if swapped else (a, b)))
    if quantized:
        expected = quantize(expected, *quantized[:4])
    assert same_bits(y, expected)


@given(seed=st.integers(0, 2**32 - 1), operations=st.tuples(*[st.sampled_from(sorted(OPERATIONS))] * 3),
       layouts=st.tuples(st.sampled_from(["channels_first", "channels_last"]),
                         st.sampled_from(["channels_first", "channels_last"])),
       scale=st.sampled_from(["per_channel", "scalar", "same"]),
       last=st.sampled_from(["same", "per_channel", (1, 2), (5, 2)]),
       sides=st.tuples(st.booleans(), st.booleans(), st.booleans()), through_a_view=st.booleans(),
       kept=st.booleans(), quantized=st.sampled_from([None, (0.05, 128, 0, 255, False), (0.02, -3, -128, 127, True)]))
@settings(max_examples=80, deadline=None)
def test_binary_ops_one_after_the_other_are_numpys(seed, operations, layouts, scale, last, sides, through_a_view, kept,
                                                   quantized):
    """y = x ∘ s, then a = x ∘ y, then z = a ∘ r (each on either side), as PaddleOCR's detector ends its pyramid
    (x + x·s + up(r)): where each result is read by the next op alone, the engine computes the three in one pass,
    r read from the source of its nearest upsampling where it has one (`last` its factors), or, where an operand
    lies otherwise or broadcasts, one after the other; where a result is also an output, it is written. Every
    value is numpy's, op by op."""
    from lpt.kernels.pooling import upsample_nearest

    rng = np.random.default_rng(seed)
    make_x, feeds_x, x = source(rng, (2, 6, 5, 4), layouts[0])
    s = rng.normal(0, 2, {"per_channel": (2, 6, 1, 1), "scalar": (1, 1, 1), "same": (2, 6, 5, 4)}[scale]).astype(np.float32)
    upsampled = isinstance(last, tuple)
    if last == "same" or upsampled:
        make_r, feeds_r, r = source(rng, (2, 6, 5 // last[0], 4 // last[1]) if upsampled else (2, 6, 5, 4), layouts[1])
        make_r = [(kind, ["q2"], "r", p) for kind, _, _, p in make_r]
        feeds_r = {("q2" if k == "q" else "r"): v for k, v in feeds_r.items()}
    else:
        r = rng.normal(0, 2, (1, 6, 1, 1)).astype(np.float32)
        make_r, feeds_r = [], {"r": r}
    pair = lambda first, second, swap: [second, first] if swap else [first, second]
    code = [("binary", pair("x", "s", sides[0]), "y", operations[0])]
    if through_a_view:
        code.append(("identity", ["y"], "view", None))
    if upsampled:
        code.append(("resize_nearest", ["r"], "r_up", last))
    code += [("binary", pair("x", "view" if through_a_view else "y", sides[1]), "a", operations[1]),
             ("binary", pair("a", "r_up" if upsampled else "r", sides[2]), "z", operations[2])]
    if quantized:
        code.append(("quantize", ["z"], "q_z", quantized))
    outputs = (["y"] if kept else []) + ["q_z" if quantized else "z"]
    program = Program(make_x + make_r + code, list(feeds_x) + ["s"] + list(feeds_r), outputs, threads=2)
    results = program(*feeds_x.values(), s, *feeds_r.values())
    apply = lambda operation, first, second, swap: OPERATIONS[operation](*((second, first) if swap else (first, second)))
    y = apply(operations[0], x, s, sides[0])
    z = apply(operations[2], apply(operations[1], x, y, sides[1]), upsample_nearest(r, last) if upsampled else r, sides[2])
    if quantized:
        z = quantize(z, *quantized[:4])
    assert same_bits(results[-1], z)
    if kept:
        assert same_bits(results[0], y)


@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("factors", [(2, 2), (3, 4), (8, 8)])
def test_an_upsampled_operand_over_many_tasks_is_numpys(layout, factors):
    """x + y, then + up(r), over 2 images of 40 channels and 24 × 32 positions: many tasks of the engine's
    elementwise loop, most of them starting within a position's channels or a row, where the upsampled
    operand's place is found from the task's first value and then followed."""
    from lpt.kernels.pooling import upsample_nearest

    rng = np.random.default_rng(sum(factors))
    make_x, feeds_x, x = source(rng, (2, 40, 24, 32), layout)
    y = rng.normal(0, 2, (2, 40, 24, 32)).astype(np.float32)
    make_r, feeds_r, r = source(rng, (2, 40, 24 // factors[0], 32 // factors[1]), layout)
    make_r = [(kind, ["q2"], "r", p) for kind, _, _, p in make_r]
    feeds_r = {("q2" if k == "q" else "r"): v for k, v in feeds_r.items()}
    code = [("binary", ["x", "y"], "a", "add"), ("resize_nearest", ["r"], "r_up", factors),
            ("binary", ["a", "r_up"], "z", "add")]
    program = Program(make_x + make_r + code, list(feeds_x) + ["y"] + list(feeds_r), ["z"], threads=2)
    [z] = program(*feeds_x.values(), y, *feeds_r.values())
    assert same_bits(z, (x + y) + upsample_nearest(r, factors))


@pytest.mark.parametrize("layouts", [("channels_first", "channels_last"), ("channels_last", "channels_first"),
                                     ("channels_last", "channels_last")])
def test_a_concatenation_of_the_channels_is_numpys(layouts):
    rng = np.random.default_rng(4)
    make_a, feeds_a, a = source(rng, (2, 3, 4, 5), layouts[0])
    make_b, feeds_b, b = source(rng, (2, 6, 4, 5), layouts[1])
    make_b = [(kind, ["q2"], "b", p) for kind, _, _, p in make_b]
    feeds_b = {("q2" if k == "q" else "b"): v for k, v in feeds_b.items()}
    program = Program(make_a + make_b + [("concat", ["x", "b", "x"], "y", None)], list(feeds_a) + list(feeds_b),
                      ["y"], threads=1)
    [y] = program(*feeds_a.values(), *feeds_b.values())
    assert same_bits(y, np.concatenate([a, b, a], axis=1))


@pytest.mark.parametrize("axis", [0, 2, 3])
@pytest.mark.parametrize("layouts", [("channels_first", "channels_first"), ("channels_last", "channels_first"),
                                     ("channels_last", "channels_last")])
def test_a_concatenation_along_another_axis_is_numpys(axis, layouts):
    """basic_pitch's harmonic stacking joins eight [N, 172, 309, 1] along the last axis: parts of 1, 3 and 2
    along the axis (a part channels-last goes channels-first first), enough rows for both threads."""
    rng = np.random.default_rng(axis)
    shape = [2, 6, 40, 50]
    parts, make, feeds = [], [], {}
    for index, (extent, layout) in enumerate(zip([1, 3, 2], layouts + layouts[:1])):
        part_shape = list(shape)
        part_shape[axis] = extent
        make_p, feeds_p, p = source(rng, tuple(part_shape), layout)
        make += [(kind, [f"q{index}"], f"p{index}", param) for kind, _, _, param in make_p]
        feeds.update({(f"q{index}" if k == "q" else f"p{index}"): v for k, v in feeds_p.items()})
        parts.append(p)
    program = Program(make + [("concat", ["p0", "p1", "p2", "p0"], "y", axis)], list(feeds), ["y"], threads=2)
    [y] = program(*feeds.values())
    assert same_bits(y, np.concatenate(parts + parts[:1], axis=axis))


@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
def test_gelu_is_lpts_kernel_and_its_five_ops_one_by_one(layout):
    """The "gelu" instruction against lpt.kernels.gelu and against Div, Erf, Add, Mul, Mul one at a time
    (lpt's erf), on every lane and the loop's tail, with NaN, ±inf, ±0 and values past erf's range."""
    rng = np.random.default_rng(12)
    y, x = run(rng, (2, 5, 6, 7), layout, ("gelu", ["x"], "y", (1.4142135, 1.0, 0.5)), special=True)
    one_by_one = (x * (erf(x / np.float32(1.4142135)) + np.float32(1.0))) * np.float32(0.5)
    assert same_bits(y, gelu(x, 1.4142135, 1.0, 0.5))
    assert same_bits(y, one_by_one)


@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
def test_tanh_gelu_is_lpts_kernel_and_its_nine_ops_one_by_one(layout):
    """The "tanh_gelu" instruction against lpt.kernels.tanh_gelu and against jax2tf's Mul, Mul, Mul, Add, Mul,
    Tanh, Add, Mul, Mul one at a time (lpt's tanh), with NaN, ±inf (x³ overflows), ±0 and large values."""
    rng = np.random.default_rng(14)
    constants = (0.044715, 0.7978846, 1.0, 0.5)
    y, x = run(rng, (2, 5, 6, 7), layout, ("tanh_gelu", ["x"], "y", constants), special=True)
    cube, root, one, half = (np.float32(c) for c in constants)
    with np.errstate(over="ignore", invalid="ignore"):
        one_by_one = x * (half * (one + tanh(root * (x + x * (x * (cube * x))))))
    assert same_bits(y, tanh_gelu(x, *constants))
    assert same_bits(y, one_by_one)


def moments_one_by_one(x, factor, epsilon, scale, bias):
    """jax2tf's LayerNorm over axis 1, op by op, the channels' sums added in order."""
    s1, s2 = np.zeros_like(x[:, :1]), np.zeros_like(x[:, :1])
    for c in range(x.shape[1]):
        s1, s2 = s1 + x[:, c:c + 1], s2 + x[:, c:c + 1] * x[:, c:c + 1]
    mean = s1 * factor
    difference = s2 * factor - mean * mean
    positive = np.where(np.isnan(difference) | (difference > 0), difference, np.float32(0))  # Max(0, ·), NaN kept
    channel = (1, -1) + (1,) * (x.ndim - 2)
    return (x - mean) * (np.reciprocal(np.sqrt(positive + epsilon)) * scale.reshape(channel)) + bias.reshape(channel)


@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
def test_a_moment_layer_norm_is_lpts_kernel_and_its_ops_one_by_one(layout):
    """The "moment_layer_norm" instruction against lpt.kernels.moment_layer_norm and jax2tf's ops one at a time,
    over 70 positions (a block of 64 and part of one), with NaN, ±inf, ±0, values whose squares overflow and
    a position of equal values (a variance of exactly 0, or below it by rounding: the max gives 0)."""
    rng = np.random.default_rng(15)
    factor, epsilon = np.float32(1 / 7), np.float32(1e-6)
    scale, bias = rng.normal(1, 0.5, 7).astype(np.float32), rng.normal(0, 0.5, 7).astype(np.float32)
    make, feeds, x = source(rng, (2, 7, 70), layout, special=True)
    if layout == "channels_first":
        x[1, :, 3], x[1, :, 4] = np.float32(0.1), np.float32(-2.7)
    program = Program(make + [("moment_layer_norm", ["x"], "y", (float(factor), float(epsilon), scale, bias))],
                      list(feeds), ["y"], threads=2)
    [y] = program(*feeds.values())
    with np.errstate(over="ignore", invalid="ignore"):
        assert same_bits(y, moment_layer_norm(x, factor, epsilon, scale, bias))
        assert same_bits(y, moments_one_by_one(x, factor, epsilon, scale, bias))
    if layout == "channels_first":  # the special values: a NaN spreads over its position; equal values do not
        assert np.isnan(y[0, :, 0]).all() and np.isfinite(y[1, :, 3:5]).all()


def test_a_moment_layer_norm_of_rows_checks_the_shapes_it_is_given():
    """The "moment_layer_norm" instruction over axis 1 of [N, C] (magika's second LayerNorm), reading the shape
    its Reshapes and Expands are given at this run: [N, 1] gives lpt's kernel's and the ops' bits, another
    shape (another batch, or a rank of three) makes the program give way (Unsupported), for the step to judge."""
    rng = np.random.default_rng(16)
    factor, epsilon = np.float32(1 / 9), np.float32(1e-6)
    scale, bias = rng.normal(1, 0.5, 9).astype(np.float32), rng.normal(0, 0.5, 9).astype(np.float32)
    x = rng.normal(0, 3, (3, 9)).astype(np.float32)
    x.reshape(-1)[:SPECIAL.size] = SPECIAL[: x.size]
    program = Program([("moment_layer_norm", ["x", "shape"], "y", (float(factor), float(epsilon), scale, bias))],
                      ["x", "shape"], ["y"], threads=2)
    [y] = program(x, np.array([3, 1], np.int64))
    with np.errstate(over="ignore", invalid="ignore"):
        assert same_bits(y, moment_layer_norm(x, factor, epsilon, scale, bias))
        assert same_bits(y, moments_one_by_one(x, factor, epsilon, scale, bias))
    for other in ([2, 1], [3, 1, 1], [-1, 1]):
        with pytest.raises(Unsupported, match="another shape"):
            program(x, np.array(other, np.int64))


def test_a_softmax_checks_the_shapes_it_is_given():
    """The "softmax" instruction reading, after x [N, K], the shapes a written-out softmax's Reshapes and Expands
    are given at this run (jax2tf's): [N, 1] gives lpt's kernel's bits, another shape makes the program give way."""
    x = np.random.default_rng(18).normal(0, 3, (5, 214)).astype(np.float32)
    program = Program([("softmax", ["x", "shape"], "y", None)], ["x", "shape"], ["y"], threads=2)
    [y] = program(x, np.array([5, 1], np.int64))
    assert same_bits(y, softmax(x))
    for other in ([4, 1], [5, 214], [-1, 1]):
        with pytest.raises(Unsupported, match="another shape"):
            program(x, np.array(other, np.int64))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("table", [np.arange(-2, 255), np.array([7, 3, 3, -9, 2**40])], ids=["consecutive", "any"])
@pytest.mark.parametrize("levels", [(0, 255, False), (-128, 127, True), (3, 10, False)])
def test_a_one_hot_is_lpts_levels(dtype, table, levels):
    """The "one_hot" instruction against lpt.kernels.one_hot_levels: integers [..., 1] → [..., K], the level of 1
    where a value equals the table's, of 0 elsewhere, for values inside, outside and at the ends of the table
    (a table of consecutive integers takes a shorter path), with the Expand's shape given as the integers'
    own; another shape makes the program give way (the step broadcasts)."""
    rng = np.random.default_rng(17)
    v = rng.choice(np.concatenate([table, [-3, 255, 256, -2**31]]), (2, 300, 1)).astype(dtype)
    low, high, signed = levels
    program = Program([("one_hot", ["v", "shape"], "y", (table, low, high, signed))], ["v", "shape"], ["y"], threads=2)
    [y] = program(v, np.array(v.shape, np.int64))
    expected = one_hot_levels(v, table, low, high, np.int8 if signed else np.uint8)
    assert same_bits(y, expected) and expected.shape == (2, 300, table.size)
    assert 0 < np.count_nonzero(expected == high) < v.size  # some values are in the table, some are not
    with pytest.raises(Unsupported, match="another shape"):
        program(v, np.array([2, 300, 2], np.int64))


@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
def test_a_global_max_pool_is_lpts_fold_in_either_layout(layout):
    """GlobalMaxPool of [N, C, H, W]: each channel's maximum over its positions by the fold of ReduceMax
    over the middle axes (NaNs and zeros of either sign settled the same way), from channels-first values
    and from a convolution's channels-last output alike."""
    rng = np.random.default_rng(15)
    y, x = run(rng, (2, 5, 6, 7), layout, ("global_max", ["x"], "y", None), special=True)
    expected = extreme_over_middle_axes(np.moveaxis(x, 1, -1), keepdims=True)  # [N, 1, 1, C]
    assert same_bits(y, np.ascontiguousarray(np.moveaxis(expected, -1, 1)))


def numpy_slice(x, starts, ends, axes, steps):
    """ONNX's Slice by basic slicing (int8_steps.slice_step's, written out again)."""
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        first, count = slice_range(x.shape[axis], start, end, step)
        index[axis] = slice(first, first + count * step if first + count * step >= 0 else None, step) if count else slice(0, 0)
    return x[tuple(index)]


bound = st.sampled_from([-2**63, -2**31, -9, -4, -1, 0, 1, 2, 3, 5, 8, 2**31 - 1, 2**63 - 1])


@given(seed=st.integers(0, 2**32 - 1), layout=st.sampled_from(["channels_first", "channels_last", "uint8"]),
       cuts=st.lists(st.tuples(bound, bound, st.sampled_from([1, 1, 2, 3, -1, -2, -5])), min_size=1, max_size=4))
@settings(max_examples=80, deadline=None)
def test_a_slice_takes_onnxs_clamped_ranges(seed, layout, cuts):
    """Slices of every axis (negative ones from the end), with starts and ends past either end of it and
    negative steps, of float32 values in either layout and of 8-bit ones: numpy's slicing of the ranges
    ONNX's clamping gives, and, where every value is taken in order, the same values as they lie."""
    rng = np.random.default_rng(seed)
    shape = (2, 5, 4, 7)
    axes = list(rng.permutation(4)[:len(cuts)] - 4 * rng.integers(0, 2, len(cuts)))  # some from the end
    starts, ends, steps = ([c[i] for c in cuts] for i in range(3))
    instruction = ("slice", ["x"], "y", (starts, ends, axes, steps))
    if layout == "uint8":
        x = rng.integers(0, 256, shape).astype(np.uint8)
        [y] = Program([instruction], ["x"], ["y"], threads=1)(x)
    else:
        y, x = run(rng, shape, layout, instruction)
    assert same_bits(np.ascontiguousarray(y), np.ascontiguousarray(numpy_slice(x, starts, ends, axes, steps)))


@given(seed=st.integers(0, 2**32 - 1), layout=st.sampled_from(["channels_first", "channels_last", "uint8"]),
       axis=st.integers(-4, 3), index=st.integers(-7, 6), images=st.sampled_from([1, 2]))
@settings(max_examples=60, deadline=None)
def test_a_slice_that_drops_its_axis_takes_one_index_as_a_gather(seed, layout, axis, index, images):
    """The slice instruction of one value along an axis that it then drops (int8_steps.gather_step): numpy's
    take of that index, negative ones from the end, of either layout and of 8-bit values (the one image of a
    batch of one too, which leaves the channels elsewhere); an index past the axis is not taken (the program
    gives way to its steps, whose Gather says why)."""
    rng = np.random.default_rng(seed)
    shape = (images, 5, 4, 7)
    end = index + 1 if index != -1 else 2**63 - 1
    instruction = ("slice", ["x"], "y", ([index], [end], [axis], [1], True))
    inside = -shape[axis] <= index < shape[axis]
    if layout == "uint8":
        x = rng.integers(0, 256, shape).astype(np.uint8)
        program = Program([instruction], ["x"], ["y"], threads=1)
        if not inside:
            with pytest.raises(Unsupported, match="outside its axis"):
                program(x)
            return
        [y] = program(x)
    elif not inside:
        with pytest.raises(Unsupported, match="outside its axis"):
            run(rng, shape, layout, instruction)
        return
    else:
        y, x = run(rng, shape, layout, instruction)
    assert same_bits(np.ascontiguousarray(y), np.take(x, index, axis=axis))


def test_what_the_float_instructions_do_not_take_gives_way_to_the_steps():
    program = Program([("binary", ["a", "b"], "y", "mul")], ["a", "b"], ["y"], threads=1)
    with pytest.raises(Unsupported, match="broadcasts"):
        program(np.ones((2, 3, 4, 4), np.float32), np.ones((1, 1, 4, 1), np.float32))
    pool = Program([("average_pool", ["x"], "y", ((2, 2), (2, 2), (0, 0, 0, 0), False))], ["x"], ["y"], threads=1)
    with pytest.raises(Unsupported, match="average pool"):
        pool(np.ones((1, 3, 4, 4), np.uint8))
    concat = Program([("concat", ["a", "b"], "y", None)], ["a", "b"], ["y"], threads=1)
    with pytest.raises(Unsupported, match="concatenation"):
        concat(np.ones((1, 3, 4, 4), np.float32), np.ones((1, 3, 4, 5), np.float32))


@given(seed=st.integers(0, 2**32 - 1), width=st.integers(1, 70), layout=st.sampled_from(["channels_first", "channels_last"]),
       scale=st.sampled_from([0.1, 3.0, 40.0]))
@settings(max_examples=40, deadline=None)
def test_softmax_layer_norm_and_erf_are_lpts(seed, width, layout, scale):
    """Rows of every width (the eight lanes of sum_in_lanes whole, and partly filled), values from a
    convolution's channels-last output too, where the last axis is the image's width."""
    rng = np.random.default_rng(seed)
    shape = (2, 3, 4, width)
    make, feeds, x = source(rng, shape, layout)
    if layout == "channels_first":
        x = (x * np.float32(scale)).astype(np.float32)
        feeds = {"x": x}
    gamma, beta = rng.normal(1, 0.2, width).astype(np.float32), rng.normal(0, 0.2, width).astype(np.float32)
    program = Program(make + [("softmax", ["x"], "s", None), ("layer_norm", ["x"], "n", (gamma, beta, 1e-5)),
                              ("layer_norm", ["x"], "m", (gamma, None, 1e-3)), ("erf", ["x"], "e", None)],
                      list(feeds), ["s", "n", "m", "e"], threads=2)
    s, n, m, e = program(*feeds.values())
    assert same_bits(s, softmax(x))
    assert same_bits(n, layer_norm(x, gamma, beta, 1e-5))
    assert same_bits(m, layer_norm(x, gamma, None, np.float32(1e-3)))
    assert same_bits(e, erf(x))


@given(seed=st.integers(0, 2**32 - 1), width=st.integers(60, 300), special=st.sampled_from([None, np.nan, np.inf, -np.inf]),
       at=st.integers(0, 299))
@settings(max_examples=40, deadline=None)
def test_a_long_softmax_row_is_lpts(seed, width, special, at):
    """Rows long enough for the AVX-512 form (64 values at a time, then the rest eight and one at a time, the
    sum in sum_in_lanes' order throughout), with a NaN or an infinity anywhere in one of them."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 5, (3, width)).astype(np.float32)
    if special is not None:
        x[1, at % width] = special
    [s] = Program([("softmax", ["x"], "s", None)], ["x"], ["s"], threads=2)(x)
    assert same_bits(s, softmax(x))


@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
def test_tanh_is_lpts_on_every_lane_and_the_tail(layout):
    """Both sides of tanh's split (0.625), NaN, ±inf, ±0, past exp's clamp, in the eight lanes and one by one."""
    rng = np.random.default_rng(13)
    y, x = run(rng, (2, 5, 6, 7), layout, ("tanh", ["x"], "y", None), special=True)
    assert same_bits(y, tanh(x))
    near_split = np.float32([0.6249999, 0.625, -0.625, 0.6250001, 1e-30, -1e-30, 44.0, -90.0, 0.1]).reshape(1, 1, 9)
    [t] = Program([("tanh", ["x"], "t", None)], ["x"], ["t"], threads=1)(near_split)
    assert same_bits(t, tanh(near_split))


def test_erf_at_its_ends_the_means_and_sqrt():
    x = np.concatenate([SPECIAL, np.float32([0.999999, 1.0, 3.99999, 4.0, -4.0, 1e-20])]).reshape(1, 3, 5)
    [e, s, r] = Program([("erf", ["x"], "e", None), ("softmax", ["x"], "s", None), ("relu", ["x"], "r", None)], ["x"],
                        ["e", "s", "r"], threads=1)(x)
    assert same_bits(e, erf(x))
    assert same_bits(r, relu(x))  # −0 becomes 0, a NaN stays
    assert same_bits(s, softmax(x))  # rows with a NaN, with ±inf: NaN where numpy's are
    long_rows = np.tile(x.reshape(1, -1), (2, 1))
    long_rows[1, 3:7] = 7.0  # no NaN in the first twelve values: the lanes' maximum, then the first NaN
    [s] = Program([("softmax", ["x"], "s", None)], ["x"], ["s"], threads=1)(long_rows)
    assert same_bits(s, softmax(long_rows))
    sequence = np.random.default_rng(1).normal(0, 1, (2, 7, 13)).astype(np.float32)
    for keepdims in (False, True):
        [mean, last, root] = Program([("mean_axis_1", ["x"], "y", (keepdims,)), ("mean_last_axis", ["x"], "z", (keepdims,)),
                                      ("sqrt", ["x"], "r", None)], ["x"], ["y", "z", "r"], threads=1)(sequence)
        assert same_bits(mean, mean_over_axis_1(sequence, keepdims))
        assert same_bits(last, mean_over_last_axis(sequence, keepdims))
        assert same_bits(root, np.sqrt(sequence))  # NaN where negative
    specials = np.tile(x.reshape(-1), 3).reshape(1, 3, 15)  # NaN, ±inf, ±0, negatives in the eight lanes and the rest
    [root] = Program([("sqrt", ["x"], "r", None)], ["x"], ["r"], threads=1)(specials)
    assert same_bits(root, np.sqrt(specials))


@pytest.mark.parametrize("shape", [(2, 9, 13), (1, 4, 5, 19), (3, 1, 2, 2, 8), (1, 0, 3)])
def test_a_max_or_min_over_the_middle_axes_is_lpts_fold(shape):
    """ReduceMax and ReduceMin of [N, *positions, C] over the positions, with NaNs, infinities and zeros of
    both signs among the values: lpt's kernel's bits (of equal values and of NaNs, the first); no
    position gives ∓inf."""
    rng = np.random.default_rng(7)
    x = rng.normal(0, 1, shape).astype(np.float32)
    x.reshape(-1)[: 3 * x.size // 4: 5] = rng.choice(SPECIAL, len(x.reshape(-1)[: 3 * x.size // 4: 5]))
    for keepdims in (False, True):
        for smallest in (False, True):
            [y] = Program([("extreme_middle", ["x"], "y", (keepdims, smallest))], ["x"], ["y"], threads=1)(x)
            assert same_bits(y, extreme_over_middle_axes(x, keepdims, smallest))
    # zeros of both signs as the extreme, either first; NaNs of two payloads, either first
    first, second = np.uint32(0x7FC00001).view(np.float32), np.uint32(0x7FC00002).view(np.float32)
    columns = np.float32([[-1.0, -0.0, 0.0, -2.0], [-1.0, 0.0, -0.0, -2.0], [1.0, first, 2.0, second],
                          [second, 1.0, first, 2.0]]).T.reshape(1, 4, 4)
    for smallest in (False, True):
        values = -columns if smallest else columns
        [y] = Program([("extreme_middle", ["x"], "y", (False, smallest))], ["x"], ["y"], threads=1)(values)
        assert same_bits(y, extreme_over_middle_axes(values, False, smallest))
        assert y.view(np.uint32)[0, 2:].tolist() == (-columns if smallest else columns)[0, [1, 0], [2, 3]].view(np.uint32).tolist()


def test_a_channels_last_convolutions_global_max_is_its_transposes():
    """A convolution's output lies channels-last; transposed to [N, H, W, C] it is that memory as it lies,
    and its max over H and W the kernel's."""
    rng = np.random.default_rng(8)
    conv = lpt.native.Conv(rng.integers(-128, 128, (24, 8, 3, 3)).astype(np.int8), pads=(1, 1, 1, 1),
                           src_zero_point=128, multiplier=1e-3, threads=1)
    q = rng.integers(0, 256, (2, 8, 9, 11)).astype(np.uint8)
    program = Program([("layer", ["q"], "c", conv.instruction[1]), ("transpose", ["c"], "t", (0, 2, 3, 1)),
                       ("extreme_middle", ["t"], "m", (False, False))], ["q"], ["m", "t"], threads=1)
    m, t = program(q)
    assert same_bits(t, np.ascontiguousarray(conv(q).transpose(0, 2, 3, 1)))
    assert same_bits(m, extreme_over_middle_axes(t, False))


@pytest.mark.parametrize("index_type", [np.int64, np.int32])
def test_a_lookup_in_a_constant_table_is_numpys_take(index_type):
    """A token embedding: rows by index (negative ones from the end); an index outside the table gives way
    to the step, which says which node and why."""
    rng = np.random.default_rng(5)
    table = rng.normal(0, 1, (17, 4, 3)).astype(np.float32)
    indices = rng.integers(-17, 17, (2, 9)).astype(index_type)
    program = Program([("gather", ["i"], "y", (table.reshape(-1), table.shape))], ["i"], ["y"], threads=1)
    [y] = program(indices)
    assert same_bits(y, np.take(table, indices, axis=0))
    with pytest.raises(Unsupported, match="outside the table"):
        program(np.array([[3, 17]], index_type))


def test_identity_squeeze_unsqueeze_affine_sigmoid_and_hard_sigmoid_are_lpts():
    rng = np.random.default_rng(9)
    make, feeds, x = source(rng, (2, 5, 3, 4), "channels_last")
    a, b = rng.normal(1, 0.5, 5).astype(np.float32), rng.normal(0, 0.5, 5).astype(np.float32)
    program = Program(make + [("identity", ["x"], "i", None), ("unsqueeze", ["i"], "u", (0, -1)),
                              ("squeeze", ["u"], "s", (0, 5)), ("affine", ["x"], "f", (a, b)),
                              ("sigmoid", ["x"], "g", None), ("hard_sigmoid", ["x"], "h", (0.2, 0.5))],
                      list(feeds), ["i", "u", "s", "f", "g", "h"], threads=2)
    i, u, s, f, g, h = program(*feeds.values())
    assert same_bits(i, x) and same_bits(s, x)
    assert same_bits(u, np.ascontiguousarray(x[None, ..., None]))
    assert same_bits(f, x * a.reshape(-1, 1, 1) + b.reshape(-1, 1, 1))
    assert same_bits(g, sigmoid(x))
    assert same_bits(h, hard_sigmoid(x, 0.2, 0.5))
    with pytest.raises(Unsupported, match="squeeze of an axis longer"):
        Program([("squeeze", ["x"], "y", (1,))], ["x"], ["y"], threads=1)(x)


def test_a_convolutions_output_stays_channels_last_through_views_to_its_global_max():
    """magika's tail: a convolution of [N, C, T, 1] read through a transpose of [N, T, C, 1] (no copy: the
    values already lie as the convolution reads them), its output sliced whole and squeezed to [N, C, T]
    (kept channels-last), a bias per channel, GELU, a global max: the values of each op in turn, and the
    transpose read by something other than a convolution is the copy numpy's is."""
    rng = np.random.default_rng(16)
    conv = lpt.native.Conv(rng.integers(-128, 128, (12, 8, 5, 1)).astype(np.int8), src_zero_point=128,
                           multiplier=np.float32(1e-3), threads=1)
    q = rng.integers(0, 256, (2, 20, 8, 1)).astype(np.uint8)  # [N, T, C, 1]
    bias, weight = rng.normal(0, 1, (1, 12, 1)).astype(np.float32), rng.normal(0, 1, 20).astype(np.float32)
    f = rng.normal(0, 1, (2, 20, 8)).astype(np.float32)
    cut = ([0, 0, 0, 0], [2**31 - 1] * 3 + [1], [0, 1, 2, 3], [1, 1, 1, 1])
    program = Program([("transpose", ["q"], "t", (0, 2, 1, 3)), ("layer", ["t"], "c", conv.instruction[1]),
                       ("slice", ["c"], "s", cut), ("squeeze", ["s"], "z", (3,)), ("binary", ["z", "b"], "a", "add"),
                       ("tanh_gelu", ["a"], "g", (0.044715, 0.7978846, 1.0, 0.5)), ("global_max", ["g"], "y", None),
                       ("transpose", ["f"], "r", (0, 2, 1)), ("binary", ["r", "w"], "p", "mul")],
                      ["q", "b", "f", "w"], ["z", "g", "y", "p"], threads=2)
    for _ in range(2):
        z, g, y, p = program(q, bias, f, weight)
        expected_z = conv(np.ascontiguousarray(q.transpose(0, 2, 1, 3)))[..., 0]
        assert same_bits(np.ascontiguousarray(z), expected_z)
        expected_g = tanh_gelu(expected_z + bias, 0.044715, 0.7978846, 1.0, 0.5)
        assert same_bits(np.ascontiguousarray(g), expected_g)
        assert same_bits(y, extreme_over_middle_axes(np.moveaxis(expected_g, 1, -1), keepdims=True).transpose(0, 2, 1))
        assert same_bits(p, np.ascontiguousarray(f.transpose(0, 2, 1)) * weight)  # [N, 8, 20] · [20]


def test_slots_share_memory_only_when_their_lifetimes_do_not_overlap():
    """A view (reshape) of an early tensor is read after many later ones were made and released: its
    source's memory must not go to them. Run twice, as the pool is reused between runs."""
    x = np.random.default_rng(2).normal(0, 1, (3, 64)).astype(np.float32)
    code = [("hard_swish", ["x"], "a", None), ("reshape", ["a"], "r0", ((3, 8, 8), False)), ("relu", ["x"], "t0", None)]
    for k in range(1, 12):  # a chain of temporaries, each dead after the next
        code.append(("hard_swish" if k % 2 else "relu", [f"t{k - 1}"], f"t{k}", None))
    code += [("relu", ["r0"], "v", None), ("binary", ["t11", "x"], "y", "add")]
    program = Program(code, ["x"], ["v", "y"], threads=1)
    expected_t = relu(x)
    for k in range(1, 12):
        expected_t = hard_swish(expected_t) if k % 2 else relu(expected_t)
    for _ in range(2):
        v, y = program(x)
        assert same_bits(v, relu(hard_swish(x).reshape(3, 8, 8)))
        assert same_bits(y, expected_t + x)


def test_slope_and_clip_is_lpts():
    """LeakyRelu, Clip, Max/Min with a constant on float32: the output stage's comparisons (−0 stays −0)."""
    x = np.tile(np.concatenate([SPECIAL, np.float32([-0.5, 0.5, 6.5, -7.0])]), (3, 1))  # eight lanes and a tail
    for slope, low, high in [(0.2, -np.inf, np.inf), (1.0, 0.0, 6.0), (1.0, -1.0, np.inf), (0.1, -np.inf, 3.0)]:
        [y] = Program([("clip", ["x"], "y", (slope, low, high))], ["x"], ["y"], threads=1)(x)
        assert same_bits(y, slope_and_clip(x, slope, low, high))


@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 14), depth=st.integers(1, 40), width=st.integers(1, 40),
       layout=st.sampled_from(["channels_first", "channels_last"]), special=st.booleans())
@settings(max_examples=60, deadline=None)
def test_a_float_matmul_by_constant_weights_adds_in_order(seed, rows, depth, width, layout, special):
    """Row tiles of 1 to 6 (3·14 rows: 6 tiles of 6, then 6), and blocks of 16 columns with a last one padded;
    the source a convolution's channels-last output too. Sums of ±1e30 products lose their small terms, so
    an order of addition other than 0, 1, … shows in the bits."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(0, 1, (depth, width)).astype(np.float32)
    weights.reshape(-1)[:3] = np.float32([1e30, -1e30, 3e-39])[: weights.size]
    y, x = run(rng, (rows, 3, 1, depth), layout, ("dense", ["x"], "y", (weights, None, 0)), special)
    assert same_bits(y, dense(x, weights))
    order = np.float32(0)
    for i in range(depth):
        order = np.float32(order + np.float32(x[0, 0, 0, i] * weights[i, 0]))
    assert same_bits(y[0, 0, 0, :1], np.float32([order]))


@pytest.mark.parametrize("shape, kernel, stride", [((1, 1, 1280), 512, 160), ((3, 1, 50), 7, 3), ((2, 1, 9), 9, 4),
                                                   ((1, 1, 40), 1, 1)], ids=["melspectrogram", "three", "one frame", "1x1"])
def test_an_stfts_convolution_is_a_product_of_its_frames(shape, kernel, stride):
    rng = np.random.default_rng(3)
    weights = rng.normal(0, 1, (kernel, 37)).astype(np.float32)
    bias = rng.normal(0, 1, 37).astype(np.float32)
    x = rng.normal(0, 1, shape).astype(np.float32)
    x.reshape(-1)[:4] = np.float32([np.nan, np.inf, -0.0, 1e30])
    [y] = Program([("dense", ["x"], "y", (weights, bias, stride))], ["x"], ["y"], threads=2)(x)
    expected = convolution_1d(x, weights.T[:, None, :], stride, bias)
    assert y.shape == (shape[0], 37, (shape[2] - kernel) // stride + 1)
    assert same_bits(y, expected)
    frame = x[-1, 0, stride:stride + kernel] if y.shape[2] > 1 else x[-1, 0, :kernel]
    assert same_bits(y[-1, :, min(1, y.shape[2] - 1)], dense(frame, weights, bias))


@pytest.mark.parametrize("axes, perm, also", [
    ((1,), (0, 1, 3, 2), None), ((), (0, 2, 1), None), ((0, -3), (0, 1, 2, 4, 3), None),
    ((1,), (0, 1, 3, 2), "read"), ((1,), (0, 1, 3, 2), "output"), ((-1,), (0, 1, 3, 2), None),
    ((1,), (0, 2, 1, 3), None)],
    ids=["oww_melspectrogram", "no unsqueeze", "two axes", "dense read elsewhere", "dense an output", "unsqueezed last",
         "other perm"])
def test_an_stfts_transpose_of_its_frames_is_the_transposed_convolution(axes, perm, also):
    """The STFT's frames by its weights transposed back to frames-first (oww_melspectrogram: Unsqueeze, then
    Transpose (0, 1, 3, 2)), which the engine computes in that order where only the chain reads the
    convolution: the same values as the convolution transposed, whichever way the engine takes."""
    rng = np.random.default_rng(5)
    weights = rng.normal(0, 1, (64, 37)).astype(np.float32)
    x = rng.normal(0, 1, (2, 1, 400)).astype(np.float32)
    instructions = [("dense", ["x"], "y", (weights, None, 48))]
    if axes:
        instructions.append(("unsqueeze", ["y"], "u", axes))
    instructions.append(("transpose", ["u" if axes else "y"], "t", perm))
    if also == "read":
        instructions.append(("binary", ["y", "y"], "s", "add"))
    got = Program(instructions, ["x"], {None: ["t"], "read": ["t", "s"], "output": ["t", "y"]}[also], threads=2)(x)
    convolution = convolution_1d(x, weights.T[:, None, :], 48)
    assert same_bits(got[0], np.expand_dims(convolution, axes).transpose(perm))
    if also:
        assert same_bits(got[1], convolution + convolution if also == "read" else convolution)


@pytest.mark.parametrize("frames, chained", [(5, False), (500, False), (5, True)],
                         ids=["small: at once", "large: one after the other", "the second reads the first"])
def test_two_dense_products_in_a_row_give_each_ones_bits(frames, chained):
    """An STFT's real and imaginary products, one after the other in a program: each too small to split runs on a
    thread of its own at once (oww_melspectrogram's), larger ones each on both threads; a second that reads the
    first waits for it. Each gives its own bits, as alone."""
    rng = np.random.default_rng(6)
    cosines, sines = (rng.normal(0, 1, (64, 37)).astype(np.float32) for _ in range(2))
    x = rng.normal(0, 1, (1, 1, 48 * (frames - 1) + 64)).astype(np.float32)
    second = ("dense", ["real"], "imag", (rng.normal(0, 1, (frames, 5)).astype(np.float32), None, 0)) if chained \
        else ("dense", ["x"], "imag", (sines, None, 48))
    real, imag = Program([("dense", ["x"], "real", (cosines, None, 48)), second], ["x"], ["real", "imag"], threads=2)(x)
    assert same_bits(real, convolution_1d(x, cosines.T[:, None, :], 48))
    assert same_bits(imag, dense(real, second[3][0]) if chained else convolution_1d(x, sines.T[:, None, :], 48))


@given(seed=st.integers(0, 2**32 - 1), layout=st.sampled_from(["channels_first", "channels_last"]),
       channels=st.integers(1, 5), kernel=st.integers(1, 4), stride=st.integers(1, 3),
       pads=st.tuples(st.integers(0, 3), st.integers(0, 3)), special=st.booleans())
@settings(max_examples=60, deadline=None)
def test_a_convolution_of_channels_with_pads_is_a_product_of_its_frames(seed, layout, channels, kernel, stride, pads,
                                                                        special):
    """silero_vad_16k_op15's first encoder layer, kept in float32 (it reads a magnitude spectrum): 129 channels
    of 4 frames, a kernel of 3, pads of 1 at each end."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(0, 1, (6, channels, kernel)).astype(np.float32)
    bias = rng.normal(0, 1, 6).astype(np.float32) if seed % 2 else None
    length = max(1, kernel - sum(pads)) + int(rng.integers(0, 9))
    rows = np.ascontiguousarray(weights.reshape(6, -1).T)
    y, x = run(rng, (2, channels, length), layout, ("dense", ["x"], "y", (rows, bias, stride, channels, *pads)), special)
    with np.errstate(invalid="ignore", over="ignore"):  # the special values' inf · 0 and sums past the largest
        expected = convolution_1d(x, weights, stride, bias, pads)
    assert y.shape == (2, 6, (length + sum(pads) - kernel) // stride + 1)
    assert same_bits(y, expected)
    if not special:  # the reference is the convolution, summed in its own order
        padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), pads))
        direct = np.stack([np.einsum("nck,ock->no", padded[:, :, t * stride:t * stride + kernel], weights)
                           for t in range(y.shape[2])], axis=-1) + (0 if bias is None else bias[:, None])
        np.testing.assert_allclose(y, direct, rtol=1e-4, atol=1e-4)


def dft_weights(kernel: int, frequencies: int) -> tuple[np.ndarray, np.ndarray]:
    """An STFT's convolution weights [frequencies, 1, kernel] as torchlibrosa makes them: a periodic Hann window
    times each frequency's cosine, and times minus its sine, computed in float64 and rounded to float32."""
    n = np.arange(kernel)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * n / kernel)
    angle = 2 * np.pi * np.outer(np.arange(frequencies), n) / kernel
    return ((window * np.cos(angle)).astype(np.float32)[:, None, :],
            (-window * np.sin(angle)).astype(np.float32)[:, None, :])


@given(seed=st.integers(0, 2**32 - 1), kernel=st.sampled_from([64, 65, 100, 512]), odd=st.booleans(),
       stride=st.integers(1, 200), pads=st.tuples(st.integers(0, 40), st.integers(0, 40)),
       frames=st.integers(1, 6), special=st.booleans())
@settings(max_examples=60, deadline=None)
def test_an_stfts_convolution_of_folded_frames_is_lpts(seed, kernel, odd, stride, pads, frames, special):
    """A Conv of one channel whose weights are even (cosines) or odd (sines) about their middle, as its frames
    folded (x[n] ± x[k − n]) by half its weights, each frame's samples past the signal's ends its pads' zeros:
    kernels.folded_convolution_1d's bits, and the convolution's value to float32 rounding."""
    rng = np.random.default_rng(seed)
    cosines, sines = dft_weights(kernel, 33)
    weights, sign = (sines, -1) if odd else (cosines, 1)
    bias = rng.normal(0, 1, 33).astype(np.float32) if seed % 2 else None
    length = max(1, kernel - sum(pads)) + (frames - 1) * stride + int(rng.integers(0, stride))
    folded = np.ascontiguousarray(weights[:, 0, :kernel // 2 + 1].T)
    y, x = run(rng, (2, 1, length), "channels_first", ("dense", ["x"], "y", (folded, bias, stride, 1, *pads, kernel, sign)),
               special)
    with np.errstate(invalid="ignore", over="ignore"):
        expected = folded_convolution_1d(x, folded, kernel, sign, stride, bias, pads)
    assert y.shape == (2, 33, (length + sum(pads) - kernel) // stride + 1) == expected.shape
    assert same_bits(y, expected)
    if not special:  # the convolution in float64, by the weights unfolded
        padded = np.pad(x[:, 0].astype(np.float64), ((0, 0), pads))
        frames_of = np.lib.stride_tricks.sliding_window_view(padded, kernel, axis=-1)[:, ::stride]
        direct = np.einsum("ntk,ok->not", frames_of, weights[:, 0].astype(np.float64))
        direct += 0 if bias is None else bias[:, None]
        np.testing.assert_allclose(y, direct, rtol=1e-4, atol=1e-4 * np.abs(x).max())


def test_a_folded_dense_instruction_that_does_not_fit_is_refused():
    folded = np.ones((33, 3), np.float32)
    for extra in ((1, 0, 0, 64, 2), (3, 0, 0, 64, 1), (1, 0, 0, 66, 1)):  # a sign of 2, 3 channels, depth ≠ 66 / 2 + 1
        with pytest.raises(ValueError, match="folded dense"):
            Program([("dense", ["x"], "y", (folded, None, 4, *extra))], ["x"], ["y"], threads=1)


def test_a_dense_product_gives_way_where_its_source_does_not_fit():
    weights = np.ones((8, 3), np.float32)
    matmul = Program([("dense", ["x"], "y", (weights, None, 0))], ["x"], ["y"], threads=1)
    stft = Program([("dense", ["x"], "y", (weights, None, 2))], ["x"], ["y"], threads=1)
    convolution = Program([("dense", ["x"], "y", (weights, None, 1, 2, 1, 0))], ["x"], ["y"], threads=1)
    for program, x in ((matmul, np.ones((2, 7), np.float32)), (matmul, np.ones(8, np.float32)),
                       (stft, np.ones((1, 2, 20), np.float32)), (stft, np.ones((1, 1, 7), np.float32)),
                       (convolution, np.ones((1, 3, 9), np.float32)), (convolution, np.ones((1, 2, 2), np.float32)),
                       (matmul, np.ones((2, 8), np.uint8))):
        with pytest.raises(Unsupported):
            program(x)


@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
def test_log_is_lpts_on_every_lane_and_the_tail(layout):
    """Subnormals, both sides of √½, 1, the specials (NaN with its payload, ±0, ±inf, below 0), then lanes of
    either kind of value mixed: 35 per row, so a tail past the last vector."""
    rng = np.random.default_rng(11)
    y, x = run(rng, (2, 35, 3, 1), layout, ("log", ["x"], "y", None), special=True)
    assert same_bits(y, log(x))
    values = np.float32([1e-45, 3e-39, -1e-40, np.sqrt(0.5), np.nextafter(np.float32(np.sqrt(0.5)), np.float32(0)), 1.0,
                         np.finfo(np.float32).max, np.nan, -np.nan, 0.0, -0.0, np.inf, -np.inf, -2.0, 0.5, 7.0, 1e-3])
    values = np.concatenate([values, np.float32(rng.lognormal(0, 20, 47))])
    [y] = Program([("log", ["x"], "y", None)], ["x"], ["y"], threads=1)(values)
    assert same_bits(y, log(values))


@given(values=st.lists(st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5, -7.0, np.inf, -np.inf, 1e-45, -1e-45, "nan",
                                         "other nan"]), min_size=1, max_size=40),
       seed=st.integers(0, 2**32 - 1), smallest=st.booleans())
@example(values=[-0.0] + [-1.0] * 7 + [0.0] + [-1.0] * 7, seed=0, smallest=False)  # a lane's last zero: not the first
@example(values=[0.0] + [1.0] * 7 + [-0.0] + [1.0] * 7, seed=0, smallest=True)
@example(values=[1.0] * 8 + ["other nan", 2.0, "nan"], seed=0, smallest=False)
@settings(max_examples=300, deadline=None)
def test_the_extreme_of_every_value_is_the_folds_whatever_ties_zeros_and_nans_it_meets(values, seed, smallest):
    """Equal extremes, −0 against +0 and NaNs of two payloads at any place: the first NaN, else the first of the
    equal extremes, as the fold of extreme_over_middle_axes keeps them (in lanes where they leave no choice)."""
    nans = {"nan": np.float32(np.nan), "other nan": np.uint32(0xFFC00001).view(np.float32)}
    x = np.float32([nans.get(v, v) if isinstance(v, str) else v for v in values])
    beyond = np.abs(np.random.default_rng(seed).normal(0, 1, int(seed % 50)).astype(np.float32))  # none beyond 0
    x = np.concatenate([x, beyond if smallest else -beyond])
    [m] = Program([("extreme_all", ["x"], "m", (False, smallest))], ["x"], ["m"], threads=1)(x.reshape(1, -1))
    assert same_bits(m, extreme_over_middle_axes(x.reshape(1, -1, 1), False, smallest=smallest).reshape(()))


def test_a_clip_by_bounds_made_at_run_time_and_an_extreme_of_every_value():
    """oww_melspectrogram's tail: the maximum of every value (NaN wins, as the fold of extreme_over_middle_axes),
    less 80, clips the values below; a bound of other than one value gives way."""
    rng = np.random.default_rng(12)
    x = rng.normal(0, 30, (1, 1, 5, 32)).astype(np.float32)
    program = Program([("extreme_all", ["x"], "m", (False, False)), ("extreme_all", ["x"], "k", (True, True)),
                       ("binary", ["m", "eighty"], "low", "sub"), ("clip", ["x", "low"], "y", (1.0, None, 25.0))],
                      ["x", "eighty"], ["y", "m", "k"], threads=1)
    eighty = np.float32(80.0)
    for values in (x, np.where(np.arange(160).reshape(x.shape) == 7, np.float32(np.nan), x)):
        y, m, k = program(values, eighty)
        top = extreme_over_middle_axes(values.reshape(1, -1, 1), False).reshape(())
        assert same_bits(m, top) and m.shape == ()
        assert same_bits(k, extreme_over_middle_axes(values.reshape(1, -1, 1), False, smallest=True).reshape(1, 1, 1, 1))
        assert same_bits(y, slope_and_clip(values, 1.0, float(top - eighty), 25.0))
    with pytest.raises(Unsupported):
        Program([("clip", ["x", "low"], "y", (1.0, None, 25.0))], ["x", "low"], ["y"], threads=1)(x, np.ones(2, np.float32))
