"""lpt.native.program: runs of plan steps in one native call, bit for bit what the steps compute one by one."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

import lpt
import lpt.native
from lpt.backend import compile_model
from lpt.backend.native_program import ENGINE
from lpt.kernels.elementwise import join_q
from lpt.kernels.pooling import global_average_pool, max_pool_q
from lpt.kernels.quantize import quantize
from lpt.model_io import clone, read_model
from lpt.native import Unsupported
from lpt.native.program import Program
from lpt.transformations.pipeline import transform
from tests.transformations.test_pipeline import conv_net

MODELS = "models"


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([(0.05, 128, 0, 255), (0.5, 3, 0, 255), (0.1, 0, -127, 127),
                                                   (0.25, -5, -128, 127), (1.0, 0, 0, 15)]))
def test_quantize_equals_lpts_quantize(seed, parameters):
    """Ties (x/scale = k + 0.5), NaN, ±inf and values far outside the range included; 6003 values, so that
    the sixteen-at-a-time loop meets a tail."""
    scale, zero_point, qmin, qmax = parameters
    rng = np.random.default_rng(seed)
    x = (rng.integers(-400, 400, 1000) * np.float32(scale) / 2).astype(np.float32)  # many exact ties
    x[:3] = (np.nan, np.inf, -np.inf)
    x = np.concatenate([x, rng.normal(0, 30, 5003).astype(np.float32)]).reshape(3, 1, -1)
    signed = qmin < 0
    program = Program([("quantize", ["x"], "q", (scale, zero_point, qmin, qmax, signed))], ["x"], ["q"], threads=2)
    assert same_bits(program(x)[0], quantize(x, scale, zero_point, qmin, qmax))


@pytest.mark.parametrize("zero_point, qmin, qmax", [(0, 0, 255), (128, 0, 255), (0, -128, 127), (-3, -127, 127)])
def test_quantize_a_hair_from_half_levels_divides(zero_point, qmin, qmax):
    """Values one ulp either side of (k + 0.5)·scale for 40 scales, where x·(1/scale) and x / scale round apart
    on a share of them: the engine's levels are the division's. (With AVX-512 it multiplies where that is sure to give
    the same level and divides within a margin of a half, lpt_s16::Reciprocal: without the margin this fails.)"""
    scales = (10 ** np.random.default_rng(qmax - zero_point).uniform(-4, 0.6, 40)).astype(np.float32)
    centres = [((np.arange(qmin - zero_point - 2, qmax - zero_point + 2) + 0.5) * scale).astype(np.float32)
               for scale in scales]
    x = [np.concatenate([np.nextafter(c, np.float32(np.inf)), c, np.nextafter(c, np.float32(-np.inf))]) for c in centres]
    apart = sum(np.count_nonzero(np.rint(v * (np.float32(1) / s)) != np.rint(v / s)) for v, s in zip(x, scales))
    assert apart > 100
    for values, scale in zip(x, scales):
        program = Program([("quantize", ["x"], "q", (float(scale), zero_point, qmin, qmax, qmin < 0))], ["x"], ["q"],
                          threads=1)
        values = values.reshape(1, 1, -1)
        assert same_bits(program(values)[0], quantize(values, scale, zero_point, qmin, qmax))


@pytest.mark.parametrize("eight_lanes", [True, False])
@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans(), st.booleans(), st.sampled_from([np.uint8, np.int8]),
       st.sampled_from([np.uint8, np.int8]), st.booleans())
def test_join_equals_lpts_join(eight_lanes, seed, multiply, relu, a_type, b_type, to_float):
    """Eight values at a time (AVX2) and one by one (forced), 5610 values: whole blocks and a rest."""
    previous = lpt.native.engine.float_lanes(eight_lanes)
    try:
        join_equals_lpts_join(seed, multiply, relu, a_type, b_type, to_float)
    finally:
        lpt.native.engine.float_lanes(previous)


def join_equals_lpts_join(seed, multiply, relu, a_type, b_type, to_float):
    rng = np.random.default_rng(seed)
    shape = (2, 5, 33, 17)
    a = rng.integers(np.iinfo(a_type).min, np.iinfo(a_type).max + 1, shape).astype(a_type)
    b = rng.integers(np.iinfo(b_type).min, np.iinfo(b_type).max + 1, shape).astype(b_type)
    a_shift, a_scale, b_shift, b_scale = 3.0, 0.02, -7.0, 0.035
    dst = dict(dst_scale=np.float32(0.05 if not multiply else 0.2), dst_zero_point=np.int32(17), qmin=0, qmax=255)
    expected = join_q(multiply, a, a_shift, np.float32(a_scale), b, b_shift, np.float32(b_scale), relu,
                      **({} if to_float else dst))
    to = None if to_float else (float(dst["dst_scale"]), 17, 0, 255, False)
    program = Program([("join", ["a", "b"], "y", (multiply, a_shift, a_scale, b_shift, b_scale, relu, to))],
                      ["a", "b"], ["y"], threads=2)
    assert same_bits(program(a, b)[0], expected)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1),
       st.sampled_from([(1, 1, 1, 1), (2, 3, 7, 7), (1, 40, 5, 9), (2, 13, 3, 5), (2, 70, 2, 3), (3, 2, 0, 4)]),
       st.booleans())
def test_mean_equals_lpts_global_average_pool(seed, shape, channels_last):
    """Added in position order either way (channels-first eight channels at a time, 13 = 8 + a rest of 5;
    channels-last in blocks of up to 64, 70 = 64 + 6), NaN and ±inf included; an empty map gives 0/0 as numpy
    does."""
    rng = np.random.default_rng(seed)
    x = (rng.normal(0, 1, shape) * 10.0 ** rng.integers(-3, 4, shape)).astype(np.float32)
    if x.size:
        x.flat[rng.integers(0, x.size, 2)] = rng.choice(np.array([np.nan, np.inf, -np.inf, 3e38], np.float32), 2)
    n, c = shape[:2]
    conv = lpt.native.Conv(np.eye(c, dtype=np.int8).reshape(c, c, 1, 1), src_zero_point=0, multiplier=np.float32(1.0))
    q = rng.integers(0, 256, shape).astype(np.uint8)
    # through a 1x1 identity convolution, whose float output lies channels-last, or as given
    instructions = [("layer", ["q"], "f", conv.instruction[1]), ("mean", ["f"], "m", None)]
    if channels_last and 0 not in shape:
        [got] = Program(instructions, ["q"], ["m"], threads=2)(q)
        expected = global_average_pool(q.astype(np.float32))
    else:
        with np.errstate(invalid="ignore"):
            [got] = Program([("mean", ["x"], "m", None)], ["x"], ["m"], threads=2)(x)
            expected = global_average_pool(x)
    assert same_bits(got, expected)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3),
       st.integers(1, 2), st.integers(0, 2), st.sampled_from([np.uint8, np.int8]), st.booleans())
def test_max_pool_equals_lpts_max_pool(seed, kh, kw, sh, sw, dilation, pad, dtype, channels_last):
    """Channels-last, through a 1x1 identity convolution whose output lies so: stride 1 along a row
    takes each tap's run of the row whole."""
    rng = np.random.default_rng(seed)
    q = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, (2, 3, 11, 9)).astype(dtype)
    pads = (min(pad, kh - 1), min(pad, kw - 1), pad and kh - 1, 0)  # ONNX: a pad smaller than the kernel
    window = ((kh, kw), (sh, sw), (dilation, dilation), pads)
    instructions = [("max_pool", ["q"], "y", window)]
    if channels_last:
        identity = lpt.native.Conv(np.eye(3, dtype=np.int8).reshape(3, 3, 1, 1), src_zero_point=0,
                                   multiplier=np.float32(1.0), dst_scale=1.0, dst_dtype=dtype)
        instructions.insert(0, ("layer", ["x"], "q", identity.instruction[1]))
    program = Program(instructions, ["x" if channels_last else "q"], ["y"], threads=2)
    expected = max_pool_q(q, (kh, kw), (sh, sw), pads, (dilation, dilation))
    assert same_bits(program(q)[0], expected)


@pytest.mark.parametrize("window", [((2, 2), (2, 2), (1, 1), (0, 0, 0, 0)), ((1, 4), (1, 4), (1, 1), (0, 0, 0, 0)),
                                    ((3, 3), (1, 1), (1, 1), (1, 1, 1, 1)), ((3, 2), (2, 1), (2, 1), (1, 0, 1, 1))])
def test_a_float_max_pool_is_lpts(window):
    """float32, channels-first with NaNs (two payloads), infinities and zeros of both signs among the values
    (a NaN wins, the first in tap order; of equal values the first), and channels-last through a 1×1
    convolution's float32 output."""
    rng = np.random.default_rng(11)
    x = rng.normal(0, 1, (2, 3, 9, 10)).astype(np.float32)
    special = np.float32([np.inf, -np.inf, 0.0, -0.0, np.uint32(0x7FC00001).view(np.float32),
                          np.uint32(0x7FC00002).view(np.float32)])
    x.reshape(-1)[::7] = special[rng.integers(0, len(special), x.size // 7 + 1)]
    x[0, 0, :2, :4] = np.float32([[-0.0, 0.0, 0.0, -0.0], [-1.0, -2.0, -3.0, -4.0]])
    kernel, strides, dilations, pads = window
    expected = max_pool_q(x, kernel, strides, pads, dilations)
    [got] = Program([("max_pool", ["x"], "y", window)], ["x"], ["y"], threads=2)(x)
    assert same_bits(got, expected)
    q = rng.integers(0, 256, (2, 3, 9, 10)).astype(np.uint8)
    identity = lpt.native.Conv(np.eye(3, dtype=np.int8).reshape(3, 3, 1, 1), src_zero_point=128,
                               multiplier=np.float32(0.5))
    program = Program([("layer", ["q"], "x", identity.instruction[1]), ("max_pool", ["x"], "y", window)], ["q"], ["y"],
                      threads=2)
    assert same_bits(program(q)[0], max_pool_q(identity(q), kernel, strides, pads, dilations))


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float32])
@pytest.mark.parametrize("window", [((2, 2), (2, 2), (1, 1), (0, 0, 0, 0)), ((3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
                                    ((3, 3), (3, 3), (1, 1), (0, 0, 2, 2)), ((2, 2), (3, 3), (1, 1), (1, 1, 1, 1)),
                                    ((3, 3), (2, 2), (2, 2), (2, 1, 0, 2)), ((2, 2), (1, 3), (2, 2), (1, 0, 1, 1)),
                                    ((3, 2), (2, 2), (1, 2), (0, 1, 2, 1)), ((2, 4), (2, 3), (1, 1), (1, 3, 1, 3))])
def test_a_strided_channels_last_max_pool_is_lpts(dtype, window):
    """Channels-last with a stride > 1 along a row: each position's maxima over whole vectors of channels
    (32 bytes, 16, 8), the last part of them the vector ending at the last channel, fewer than 8 bytes' one by
    one; taps across 2, 3 or any, those at the edges in the padding. 8-bit through a 1×1 identity convolution,
    their extremes among the values; float32 as the product of a convolution's ones and the values, NaNs (two
    payloads), infinities and zeros of both signs among them."""
    rng = np.random.default_rng(21)
    kernel, strides, dilations, pads = window
    for channels in (1, 3, 8, 17, 31, 32, 33, 64, 70):
        shape = (2, channels, 11, 13)
        if dtype == np.float32:
            x = rng.integers(-3, 4, shape).astype(np.float32)  # ties
            special = np.float32([np.inf, -np.inf, 0.0, -0.0, np.uint32(0x7FC00001).view(np.float32),
                                  np.uint32(0xFFC00002).view(np.float32)])
            x.reshape(-1)[rng.integers(0, x.size, x.size // 4)] = special[rng.integers(0, len(special), x.size // 4)]
            ones = lpt.native.Conv(np.eye(channels, dtype=np.int8).reshape(channels, channels, 1, 1), src_zero_point=0,
                                   multiplier=np.float32(1.0))
            program = Program([("layer", ["q"], "c", ones.instruction[1]), ("binary", ["c", "x"], "f", "mul"),
                               ("max_pool", ["f"], "y", window)], ["q", "x"], ["y", "f"], threads=2)
            y, f = program(np.ones(shape, np.uint8), x)
            assert same_bits(f, x)
        else:
            info = np.iinfo(dtype)
            x = rng.integers(info.min, info.max + 1, shape).astype(dtype)
            x.reshape(-1)[rng.integers(0, x.size, x.size // 4)] = rng.choice(np.array([info.min, info.max, 0], dtype),
                                                                             x.size // 4)
            identity = lpt.native.Conv(np.eye(channels, dtype=np.int8).reshape(channels, channels, 1, 1),
                                       src_zero_point=0, multiplier=np.float32(1.0), dst_scale=1.0, dst_dtype=dtype)
            [y] = Program([("layer", ["x"], "q", identity.instruction[1]), ("max_pool", ["q"], "y", window)], ["x"],
                          ["y"], threads=2)(x)
        assert same_bits(y, max_pool_q(x, kernel, strides, pads, dilations)), channels


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float32])
@pytest.mark.parametrize("pads, fill", [((0, 0, 1, 0, 0, 0, 1, 0), 0.0), ((0, 2, 0, 3, 0, 1, 4, 0), 7.0),
                                         ((1, 0, 0, 0, 0, 0, 0, 2), -3.0), ((0, 1, 0, 0, 0, 2, 0, 0), 5.0),
                                         ((0,) * 8, 1.0)])
def test_a_constant_pad_is_numpys(dtype, pads, fill):
    """Any type, any axis, the border's value in the values' type (the axes after the last padded one
    copied whole, down to none padded); and a convolution's channels-last output padded as its
    channels-first values."""
    rng = np.random.default_rng(12)
    x = (rng.integers(0, 100, (2, 3, 5, 4)) if dtype != np.float32 else rng.normal(0, 1, (2, 3, 5, 4))).astype(dtype)
    rank = len(pads) // 2
    widths = [(pads[i], pads[i + rank]) for i in range(rank)]
    [got] = Program([("pad", ["x"], "y", (pads, fill))], ["x"], ["y"], threads=1)(x)
    assert same_bits(got, np.pad(x, widths, constant_values=np.asarray(fill).astype(dtype)))
    q = rng.integers(0, 256, (2, 3, 5, 4)).astype(np.uint8)
    identity = lpt.native.Conv(np.eye(3, dtype=np.int8).reshape(3, 3, 1, 1), src_zero_point=128,
                               multiplier=np.float32(0.5))
    program = Program([("layer", ["q"], "c", identity.instruction[1]), ("pad", ["c"], "y", (pads, fill))], ["q"], ["y"],
                      threads=1)
    assert same_bits(program(q)[0], np.pad(identity(q), widths, constant_values=np.float32(fill)))


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float32])
@pytest.mark.parametrize("pads", [(0, 0, 2, 0, 0, 0, 3, 0), (0, 2, 0, 3, 0, 1, 4, 0), (1, 0, 0, 0, 0, 0, 0, 3),
                                  (0, 0, 0, 1, 0, 0, 0, 0), (0,) * 8])
def test_a_reflect_pad_is_numpys(dtype, pads):
    """ONNX's mode "reflect" (numpy's): each border mirrors the values next to it, the edge value once, on any
    axis and any type, and a convolution's channels-last output as its channels-first values; a border as
    wide as its axis is not taken (ONNX has no value for it: the step's Pad says so)."""
    rng = np.random.default_rng(13)
    x = (rng.integers(0, 100, (2, 3, 5, 4)) if dtype != np.float32 else rng.normal(0, 1, (2, 3, 5, 4))).astype(dtype)
    rank = len(pads) // 2
    widths = [(pads[i], pads[i + rank]) for i in range(rank)]
    [got] = Program([("pad", ["x"], "y", (pads, 0.0, "reflect"))], ["x"], ["y"], threads=1)(x)
    assert same_bits(got, np.pad(x, widths, mode="reflect"))
    q = rng.integers(0, 256, (2, 3, 5, 4)).astype(np.uint8)
    identity = lpt.native.Conv(np.eye(3, dtype=np.int8).reshape(3, 3, 1, 1), src_zero_point=128,
                               multiplier=np.float32(0.5))
    program = Program([("layer", ["q"], "c", identity.instruction[1]), ("pad", ["c"], "y", (pads, 0.0, "reflect"))],
                      ["q"], ["y"], threads=1)
    assert same_bits(program(q)[0], np.pad(identity(q), widths, mode="reflect"))
    with pytest.raises(Unsupported, match="reflection as wide as its axis"):
        Program([("pad", ["x"], "y", ((0, 0, 0, 4, 0, 0, 0, 0), 0.0, "reflect"))], ["x"], ["y"], threads=1)(x)


def test_an_instruction_that_does_not_take_its_input_raises_unsupported():
    program = Program([("max_pool", ["q"], "y", ((2, 2), (2, 2), (1, 1), (0, 0, 0, 0)))], ["q"], ["y"], threads=1)
    with pytest.raises(Unsupported, match="max pool"):
        program(np.zeros((1, 1, 4, 4), np.int32))


@pytest.mark.parametrize("backwards", [(False, False), (True, False), (False, True)])
def test_a_scan_in_one_call_is_the_program_called_at_each_step(backwards):
    """A recurrence, h' = tanh(h·s + x_t) and c' = c + h', its outputs in another order than its states (c', the
    emitted h', h'): program_scan carries each state to its input, reads the sequence forwards or backwards and
    stacks the emitted values in either order, bit for bit the program called once per step."""
    read_backwards, emit_backwards = backwards
    rng = np.random.default_rng(3)
    program = Program([("binary", ["h", "s"], "hs", "mul"), ("binary", ["hs", "x"], "sum", "add"),
                       ("tanh", ["sum"], "h_next", None), ("binary", ["c", "h_next"], "c_next", "add"),
                       ("identity", ["h_next"], "emitted", None)],
                      ["x", "h", "s", "c"], ["c_next", "emitted", "h_next"], threads=1)
    h0, c0 = rng.normal(0, 1, (2, 5)).astype(np.float32), rng.normal(0, 1, (2, 5)).astype(np.float32)
    s, xs = rng.normal(0, 1, (2, 5)).astype(np.float32), rng.normal(0, 1, (7, 2, 5)).astype(np.float32)
    c_final, stacked, h_final = program.scan([xs, h0, s, c0], [-3 if read_backwards else -2, 2, -1, 0],
                                             [-1, int(emit_backwards), -1])
    h, c, emitted = h0, c0, []
    for t in range(len(xs)):
        c, y, h = program(xs[len(xs) - 1 - t if read_backwards else t], h, s, c)
        emitted.append(y)
    assert same_bits(h_final, h) and same_bits(c_final, c)
    assert same_bits(stacked, np.stack(emitted[::-1] if emit_backwards else emitted))
    assert not np.array_equal(stacked[0], stacked[-1])


def test_scans_at_once_are_each_scan_alone():
    """Two recurrences of programs of one thread each, on two threads at once (program_scans), one reading
    backwards: each gives what its program_scan gives; a program given twice, or one of two threads, is refused."""
    rng = np.random.default_rng(5)

    def recurrence(threads=1):
        return Program([("binary", ["h", "x"], "sum", "add"), ("tanh", ["sum"], "h_next", None),
                        ("identity", ["h_next"], "emitted", None)], ["h", "x"], ["h_next", "emitted"], threads=threads)

    first, second = recurrence(), recurrence()
    h, xs = rng.normal(0, 1, (1, 300)).astype(np.float32), rng.normal(0, 1, (9, 1, 300)).astype(np.float32)
    jobs = [(first, [h, xs], [0, -2], [-1, 0]), (second, [h, xs[:4]], [0, -3], [-1, 1])]
    together = Program.scans(jobs, threads=2)
    for (program, arrays, roles, emits), outputs in zip(jobs, together):
        alone = program.scan(arrays, roles, emits)
        assert len(outputs) == 2 and all(same_bits(a, b) for a, b in zip(outputs, alone))
    assert together[0][1].shape == (9, 1, 300) and together[1][1].shape == (4, 1, 300)
    with pytest.raises(ValueError, match="given twice"):
        Program.scans([jobs[0], jobs[0]], threads=2)
    with pytest.raises(ValueError, match="more than one thread"):
        Program.scans([jobs[0], (recurrence(threads=2),) + jobs[1][1:]], threads=2)


def test_both_directions_run_at_once_each_in_one_native_call_with_the_bits_of_a_call_per_step():
    """A bidirectional LSTM on two threads: its directions' Scans (the second read and emitted backwards, each
    carrying h and c) run at once, each in one call of the engine on a thread of its own (ScansAtOnce), and give
    the bits of each body's program called at each step."""
    from lpt.backend.scan_steps import ScansAtOnce
    from lpt.pipeline import quantize
    from tests.calibration.test_recurrent import axes, recurrent_model, samples

    proto, feeds = recurrent_model("LSTM", "bidirectional")
    result = quantize(ir.serde.deserialize_model(proto), samples(feeds), int8_recurrent=True, batch_axes=axes(feeds),
                      overflow_fix="none")
    plan = lpt.compile_model(lpt.clone(result.int8_model), threads=2)
    [together] = [s.run for s in plan.run_steps if s.op_types == ("Scan", "Scan")]
    assert isinstance(together, ScansAtOnce) and all(r.whole is not None for r in together.runs)
    at_once = plan.run(feeds)
    assert all(r.whole.native for r in together.runs)  # none gave way
    for r in together.runs:
        r.whole.native = False
    step_by_step = plan.run(feeds)
    for name in ("Y", "Y_h", "Y_c"):
        assert at_once[name].dtype == np.float32 and np.array_equal(at_once[name], step_by_step[name])
    one_thread = lpt.compile_model(lpt.clone(result.int8_model), threads=1)
    assert not any(isinstance(s.run, ScansAtOnce) for s in one_thread.run_steps)
    assert all(np.array_equal(one_thread.run(feeds)[name], at_once[name]) for name in ("Y", "Y_h", "Y_c"))


def test_large_outputs_are_handed_over_each_run_its_own():
    """An output of 256 KB or more comes back in the memory the program computed it in (no copy), which the next
    run does not reuse: the first run's arrays keep their values. An output listed twice, and a small one, are
    copied."""
    program = Program([("binary", ["a", "b"], "y", "add"), ("binary", ["y", "a"], "z", "mul"),
                       ("binary", ["c", "c"], "small", "add")], ["a", "b", "c"], ["z", "y", "small", "y"], threads=2)
    rng = np.random.default_rng(11)
    runs = [[rng.normal(0, 1, shape).astype(np.float32) for shape in [(1, 300, 300), (1, 300, 300), (4, 5)]]
            for _ in range(2)]
    first = program(*runs[0])
    second = program(*runs[1])
    for (a, b, c), outputs in zip(runs, [first, second]):
        y = a + b
        for got, expected in zip(outputs, [y * a, y, c + c, y]):
            assert same_bits(got, expected) and got.flags.writeable
    assert [type(o.base).__name__ == "OutputBlock" for o in first] == [True, False, False, False]
    assert not any(np.shares_memory(f, s) for f in first for s in second)


def test_a_scan_whose_roles_do_not_fit_its_program_is_refused():
    program = Program([("binary", ["h", "x"], "y", "add")], ["h", "x"], ["y"], threads=1)
    h, xs = np.zeros((1, 3), np.float32), np.zeros((4, 1, 3), np.float32)
    assert same_bits(program.scan([h, xs], [0, -2], [-1])[0], h)
    for roles, emits in (([0, -2], [0]), ([1, -2], [-1]), ([-1, -1], [0]), ([0, 0], [-1])):
        with pytest.raises(ValueError, match="program_scan"):
            program.scan([h, xs], roles, emits)
    with pytest.raises(ValueError, match="length 0"):
        program.scan([h, xs[:0]], [0, -2], [-1])


@pytest.mark.parametrize("name", ["digits_cnn", "conv_net", "digits_zoo", "digits_transformer"])
def test_a_plan_runs_its_int8_body_as_one_native_call_with_the_same_bits(name, tmp_path):
    """digits_zoo has a squeeze-excite Sigmoid (in the engine's output stage, inside a program), digits_transformer
    attention's products of two activations."""
    if name == "conv_net":
        _, model = conv_net()
        lpt.transform(model)
        feeds = {"x": np.random.default_rng(1).uniform(-3, 3, (3, 3, 8, 8)).astype(np.float32)}
    else:
        result = lpt.quantize(f"{MODELS}/{name}.onnx", subset_size=16)
        result.save(tmp_path / name)
        model = read_model(tmp_path / f"{name}.int8.onnx")
        test = np.load(f"{MODELS}/{name}.test.npz")
        feeds = {key: test[key][:9] for key in test.files if key in {v.name for v in model.graph.inputs}}
    plan = compile_model(model, threads=2)
    engines = {s.op_types[-1]: s.engine for s in plan.steps if s.layer is not None}
    if name == "digits_zoo":
        assert lpt.native.is_native_engine(engines["Sigmoid"])
        assert [s.engine for s in plan.run_steps] == [ENGINE]  # its float32 ops too (lpt.backend.float_steps)
    if name == "digits_transformer":
        assert sum(s.engine == lpt.native.PRODUCT_ENGINE for s in plan.steps) == 2
        # the embedding, LayerNormalization, Softmax and GELU too (lpt.backend.float_steps)
        assert [s.engine for s in plan.run_steps] == [ENGINE]
    programs = [s for s in plan.run_steps if s.engine == ENGINE]
    assert programs and len(plan.run_steps) < len(plan.steps)
    fused = plan.run(feeds)
    one_by_one = plan.run(feeds, keep=True)
    kernels_only = compile_model(model, threads=1, native=False).run(feeds)
    for output in plan.outputs:
        assert same_bits(fused[output], one_by_one[output])
        assert same_bits(fused[output], kernels_only[output])


def test_a_program_that_meets_an_input_it_does_not_take_gives_way_to_its_steps():
    """The conv_net plan fed integers where it expects float32: the program's quantize refuses them, and
    the steps run one by one (numpy casts them), as the plan without programs does."""
    _, model = conv_net()
    lpt.transform(model)
    plan = compile_model(model, threads=1)
    assert plan.run_steps[0].engine == ENGINE
    feeds = {"x": np.random.default_rng(2).integers(-3, 4, (2, 3, 8, 8)).astype(np.int8)}
    expected = compile_model(model, threads=1, native=False).run(feeds)
    for _ in range(2):  # the first run falls back, the second starts there
        ours = plan.run(feeds)
        for output in plan.outputs:
            assert same_bits(ours[output], expected[output])


def residual_net(tail: str = "flatten") -> onnx.ModelProto:
    """A small ResNet: an Add of the input and a convolution of it (f32: the input feeds both), a stem,
    max pool, two residual blocks (one with a 1×1 projection), a classifier."""
    rng = np.random.default_rng(5)
    nodes, weights = [], []

    def conv(x, cin, cout, kernel, stride=1, relu=True):
        name = f"conv{len(weights)}"
        weights.append(numpy_helper.from_array(
            rng.normal(0, np.sqrt(2 / (cin * kernel * kernel)), (cout, cin, kernel, kernel)).astype(np.float32), name + ".w"))
        weights.append(numpy_helper.from_array(rng.normal(0, 0.1, cout).astype(np.float32), name + ".b"))
        nodes.append(helper.make_node("Conv", [x, name + ".w", name + ".b"], [name], kernel_shape=[kernel] * 2,
                                      strides=[stride] * 2, pads=[kernel // 2] * 4))
        if relu:
            nodes.append(helper.make_node("Relu", [name], [name + ".relu"]))
            return name + ".relu"
        return name

    def add(a, b, name):
        nodes.extend([helper.make_node("Add", [a, b], [name]), helper.make_node("Relu", [name], [name + ".relu"])])
        return name + ".relu"

    x = add("x", conv("x", 3, 3, 3), "mixed")
    x = conv(x, 3, 8, 3, stride=2)
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4))
    x = add(conv(conv("pool", 8, 8, 3), 8, 8, 3, relu=False), "pool", "block1")
    x = add(conv(conv(x, 8, 16, 3, stride=2), 16, 16, 3, relu=False), conv(x, 8, 16, 1, stride=2, relu=False), "block2")
    if tail == "pool":  # a classifier's: the last block's Add, the global average, the head
        nodes.append(helper.make_node("GlobalAveragePool", [x], ["pooled"]))
        x = "pooled"
    weights.append(numpy_helper.from_array(
        rng.normal(0, 0.1, (10, 16 * (1 if tail == "pool" else 4 * 4))).astype(np.float32), "fc.w"))
    nodes += [helper.make_node("Flatten", [x], ["flat"]), helper.make_node("Gemm", ["flat", "fc.w"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "residual", [helper.make_tensor_value_info("x", 1, ["N", 3, 32, 32])],
                              [helper.make_tensor_value_info("y", 1, ["N", 10])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_residual_joins_run_natively_with_the_same_bits():
    fp32 = ir.serde.deserialize_model(residual_net())
    rng = np.random.default_rng(6)
    fq = lpt.calibrate(fp32, {"x": rng.uniform(-2, 2, (16, 3, 32, 32)).astype(np.float32)}, quiet=True).model
    model = clone(fq)
    transform(model)
    plan = compile_model(model, threads=2)
    fused = {node for s in plan.run_steps if s.engine == ENGINE for node in s.nodes}
    natively = {s.native[0] for s in plan.steps if s.native and set(s.nodes) <= fused}
    assert natively == {"quantize", "layer", "join", "max_pool", "flatten", "binary", "relu"}  # the input's f32 Add, Relu
    assert sum(s.native is not None and s.native[0] == "join" for s in plan.steps) == 2  # the blocks' Adds
    feeds = {"x": rng.uniform(-2, 2, (3, 3, 32, 32)).astype(np.float32)}
    fused, one_by_one = plan.run(feeds), plan.run(feeds, keep=True)
    kernels_only = compile_model(model, threads=1, native=False).run(feeds)
    assert same_bits(fused["y"], one_by_one["y"]) and same_bits(fused["y"], kernels_only["y"])


@pytest.mark.parametrize("size", [6, 72], ids=["one-band", "bands"])
@pytest.mark.parametrize("layer_first", [True, False], ids=["conv+residual", "residual+conv"])
@pytest.mark.parametrize("view", [None, "joined", "read elsewhere"])
def test_a_residual_join_after_a_convolution_is_joined_band_by_band(size, layer_first, view):
    """A join reading a convolution's output and an earlier one runs inside the convolution, each band's rows as
    soon as they are staged (the whole output after a layer of one band): the join's bits, either operand first.
    So too where the join reads the output through an Identity's view of it that nothing else reads (PaddleOCR's
    exports); a view that is also an output of the program keeps the join an instruction of its own."""
    rng = np.random.default_rng(size)

    def conv(in_channels):
        stage = dict(multiplier=rng.uniform(2e-5, 6e-5, 32).astype(np.float32), bias=rng.normal(0, 0.3, 32).astype(np.float32),
                     dst_scale=np.float32(0.02), dst_zero_point=np.int32(128))
        weights = rng.integers(-128, 128, (32, in_channels, 3, 3)).astype(np.int8)
        return lpt.native.Conv(weights, pads=(1, 1, 1, 1), src_zero_point=128, threads=2, dst_dtype=np.uint8, **stage)

    first, second = conv(8), conv(32)
    x = rng.integers(0, 256, (2, 8, size, size)).astype(np.uint8)
    join = (False, 128.0, 0.02, 128.0, 0.03, True, (0.04, 0, 0, 255, False))
    read = "v" if view else "y"
    instructions = [("layer", ["x"], "r", first.instruction[1]), ("layer", ["r"], "y", second.instruction[1])]
    instructions += [("identity", ["y"], "v", None)] if view else []
    instructions += [("join", [read, "r"] if layer_first else ["r", read], "z", join)]
    program = Program(instructions, ["x"], ["z", "v"] if view == "read elsewhere" else ["z"], threads=2)
    r = first(x)
    y = second(r)
    a, b = (y, r) if layer_first else (r, y)
    expected = join_q(False, a, 128.0, np.float32(0.02), b, 128.0, np.float32(0.03), True, dst_scale=np.float32(0.04),
                      dst_zero_point=np.int32(0), qmin=0, qmax=255)
    assert 0.2 < np.count_nonzero(expected) / expected.size < 0.9
    outputs = program(x)
    assert same_bits(outputs[0], expected)
    joined = program.seconds()[-1] == 0.0  # run with the convolution: its time is the layer's
    assert joined == (view != "read elsewhere")
    if view == "read elsewhere":
        assert same_bits(outputs[1], y)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), multiply=st.booleans(), relu=st.booleans(), layer_first=st.booleans(),
       size=st.sampled_from([6, 40]), layer_type=st.sampled_from([(np.uint8, 128), (np.int8, -5)]),
       other_type=st.sampled_from([(np.uint8, 0), (np.int8, 3)]),
       scales=st.sampled_from([(0.02, 0.03, 0.04), (0.25, 0.5, 1.0)]),  # the second: many ties
       to=st.sampled_from([(0, 0, 255, False), (100, 0, 255, False), (-3, -128, 127, True), (0, -127, 127, True)]),
       kernel=st.sampled_from([3, 1]), through_a_view=st.booleans())
def test_a_join_after_a_convolution_gives_lpts_join_in_either_form(seed, multiply, relu, layer_first, size, layer_type,
                                                                    other_type, scales, to, kernel, through_a_view):
    """Where oneDNN applies the convolution's output stage, its primitive applies the residual join too (the layer's
    own levels never written; elsewhere lpt joins each band's rows): the bits of lpt's join of the layer's output,
    either operand first, a sum or a product, with or without Relu, into uint8 or int8, one band or two, 3×3
    convolutions and 1×1 ones (which run as matmuls), the output read directly or through an Identity's view."""
    rng = np.random.default_rng(seed)
    pads = (kernel // 2,) * 4

    def conv(in_channels, src_zero_point, dtype, zero_point):
        return lpt.native.Conv(rng.integers(-128, 128, (32, in_channels, kernel, kernel)).astype(np.int8), pads=pads,
                               src_zero_point=src_zero_point, multiplier=rng.uniform(2e-5, 6e-5, 32).astype(np.float32),
                               bias=rng.normal(0, 0.3, 32).astype(np.float32), dst_scale=np.float32(0.02),
                               dst_zero_point=np.int32(zero_point), dst_dtype=dtype, threads=2)

    layer_scale, other_scale, to_scale = scales
    first = conv(8, 128, *other_type)  # the other operand, r
    second = conv(32, other_type[1], *layer_type)  # the layer, reading r
    x = rng.integers(0, 256, (2, 8, size, size)).astype(np.uint8)
    to_zero_point, qmin, qmax, signed = to
    shifts = (float(layer_type[1]), layer_scale, float(other_type[1]), other_scale)
    a_shift, a_scale, b_shift, b_scale = shifts if layer_first else shifts[2:] + shifts[:2]
    join = (multiply, a_shift, a_scale, b_shift, b_scale, relu, (to_scale, to_zero_point, qmin, qmax, signed))
    read = "v" if through_a_view else "y"
    program = Program([("layer", ["x"], "r", first.instruction[1]), ("layer", ["r"], "y", second.instruction[1])]
                      + ([("identity", ["y"], "v", None)] if through_a_view else [])
                      + [("join", [read, "r"] if layer_first else ["r", read], "z", join)], ["x"], ["z"], threads=2)
    r = first(x)
    y = second(r)
    a, b = (y, r) if layer_first else (r, y)
    expected = join_q(multiply, a, a_shift, np.float32(a_scale), b, b_shift, np.float32(b_scale), relu,
                      dst_scale=np.float32(to_scale), dst_zero_point=np.int32(to_zero_point), qmin=qmin, qmax=qmax)
    assert len(np.unique(expected)) > 10
    assert same_bits(program(x)[0], expected)


@pytest.mark.parametrize("kind", ["1x1", "3x3", "depthwise"])
@pytest.mark.parametrize("layer_first", [True, False], ids=["conv+other", "other+conv"])
@pytest.mark.parametrize("through_a_view", [False, True], ids=["direct", "identity"])
@pytest.mark.parametrize("to", [None, (0.05, 7, 0, 255, False), (0.03, -4, -128, 127, True)],
                         ids=["float", "uint8", "int8"])
@pytest.mark.parametrize("channels", [24, 29])
def test_an_add_after_a_float_convolution_runs_in_its_output_stage(kind, layer_first, through_a_view, to, channels):
    """A float32 Add after a convolution that writes float32 (its output read by the Add alone, directly or through
    an Identity) runs in the s16 kernel's output stage, the layer's output never written: the bits of the layer's
    float32 values plus the other operand, quantized where the Add's output is; 24 channels (a last block of 8,
    with the block before it) and 29 (a last block of 13, whose operands are read in part in both its halves);
    a 1×1 layer, a 3×3 one (by Winograd) and a depthwise one."""
    rng = np.random.default_rng(len(kind) + 2 * layer_first + 4 * through_a_view + channels)
    groups = channels if kind == "depthwise" else 1
    kernel = 1 if kind == "1x1" else 3
    weights = rng.integers(-128, 128, (channels, channels // groups, kernel, kernel)).astype(np.int8)
    conv = lpt.native.Conv(weights, groups=groups, pads=(kernel // 2,) * 4, src_zero_point=128, route="s16", threads=2,
                           multiplier=rng.uniform(1e-4, 3e-4, channels).astype(np.float32),
                           bias=rng.normal(0, 0.3, channels).astype(np.float32))
    other = lpt.native.Conv(rng.integers(-128, 128, (channels, channels, 1, 1)).astype(np.int8), src_zero_point=128,
                            route="s16", threads=2, multiplier=np.float32(0.003))
    x = rng.integers(0, 256, (2, channels, 9, 11)).astype(np.uint8)
    code = [("layer", ["x"], "r", other.instruction[1]), ("layer", ["x"], "y", conv.instruction[1])]
    if through_a_view:
        code.append(("identity", ["y"], "view", None))
    read = "view" if through_a_view else "y"
    code.append(("binary", [read, "r"] if layer_first else ["r", read], "z", "add"))
    if to:
        code.append(("quantize", ["z"], "q", to))
    program = Program(code, ["x"], ["q" if to else "z"], threads=2)
    y, r = conv(x), other(x)
    expected = y + r if layer_first else r + y
    if to:
        expected = quantize(expected, np.float32(to[0]), np.int32(to[1]), to[2], to[3])
    assert same_bits(program(x)[0], expected)
    assert program.seconds()[2 + through_a_view] == 0.0  # run with the convolution: its time is the layer's

    # where the layer's float32 output is an output too, the two run one after the other, with the same bits
    both = Program(code, ["x"], ["y", "q" if to else "z"], threads=2)
    kept, added = both(x)
    assert same_bits(kept, y) and same_bits(added, expected)
    assert both.seconds()[2 + through_a_view] > 0.0


def test_a_classifier_tail_joins_to_float_and_pools_in_the_same_native_call():
    """The last block's Add has no quantize after it (the global average comes first): a join to f32,
    then the mean, keep the whole network in one program, with the bits of the steps run one by one."""
    fp32 = ir.serde.deserialize_model(residual_net(tail="pool"))
    rng = np.random.default_rng(8)
    fq = lpt.calibrate(fp32, {"x": rng.uniform(-2, 2, (16, 3, 32, 32)).astype(np.float32)}, quiet=True).model
    model = clone(fq)
    transform(model)
    plan = compile_model(model, threads=2)
    joins = [s.native[1][-1] for s in plan.steps if s.native and s.native[0] == "join"]
    assert joins.count(None) == 1  # block2's Add, to float32
    assert "mean" in {s.native[0] for s in plan.steps if s.native}
    # one call: the f32 Add of the input and its Relu too (lpt.backend.float_steps)
    assert [s.engine for s in plan.run_steps] == [ENGINE]
    assert plan.run_steps[-1].op_types[-6:] == ("GlobalAveragePool", "QuantizeLinear", "Flatten", "MatMulInteger",
                                                "Cast", "Mul")
    feeds = {"x": rng.uniform(-2, 2, (3, 3, 32, 32)).astype(np.float32)}
    fused, one_by_one = plan.run(feeds), plan.run(feeds, keep=True)
    kernels_only = compile_model(model, threads=1, native=False).run(feeds)
    assert same_bits(fused["y"], one_by_one["y"]) and same_bits(fused["y"], kernels_only["y"])


def test_a_join_of_channels_first_and_channels_last_tensors():
    """A quantized input (channels-first) joined with a convolution's output (left channels-last)."""
    rng = np.random.default_rng(7)
    x = rng.normal(0, 1, (2, 4, 9, 7)).astype(np.float32)
    conv = lpt.native.Conv(rng.integers(-127, 128, (4, 4, 3, 3)).astype(np.int8), pads=(1, 1, 1, 1),
                           src_zero_point=128, multiplier=np.float32(0.001), dst_scale=np.float32(0.05),
                           dst_zero_point=100, dst_dtype=np.uint8)
    join = (False, 128.0, 0.02, 100.0, 0.05, True, (0.04, 0, 0, 255, False))
    program = Program([("quantize", ["x"], "q", (0.02, 128, 0, 255, False)), ("layer", ["q"], "c", conv.instruction[1]),
                       ("join", ["q", "c"], "y", join), ("join", ["c", "q"], "z", join)], ["x"], ["y", "z"], threads=2)
    q = quantize(x, np.float32(0.02), 128, 0, 255)
    c = conv(q)
    y, z = program(x)
    expected = dict(dst_scale=np.float32(0.04), dst_zero_point=np.int32(0), qmin=0, qmax=255)
    assert same_bits(y, join_q(False, q, 128.0, np.float32(0.02), c, 100.0, np.float32(0.05), True, **expected))
    assert same_bits(z, join_q(False, c, 128.0, np.float32(0.02), q, 100.0, np.float32(0.05), True, **expected))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rank=st.integers(1, 5), dtype=st.sampled_from([np.uint8, np.int8, np.float32]),
       computed=st.booleans(), data=st.data())
def test_reshape_and_transpose_are_numpys(seed, rank, dtype, computed, data):
    """ONNX Reshape (0 copies a dimension, −1 is inferred) and Transpose with any perm, as attention splits heads;
    the target a constant, or an int64 tensor the instruction reads at run time (a shape computed in the graph)."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(d) for d in rng.integers(1, 5, rank))
    x = rng.integers(-100, 100, shape).astype(dtype)
    perm = tuple(int(i) for i in rng.permutation(rank))
    flat = int(np.prod(shape))
    target = data.draw(st.sampled_from([(0,) * rank, (-1,), (flat, 1), (1, -1)] + ([(0, -1)] if rank >= 2 else [])))
    reshape = ("reshape", ["t", "target"], "y", (None, False)) if computed else ("reshape", ["t"], "y", (target, False))
    inputs = ["x", "target"] if computed else ["x"]
    program = Program([("transpose", ["x"], "t", perm), reshape], inputs, ["y", "t"], threads=1)
    y, t = program(x, np.array(target, np.int64)) if computed else program(x)
    expected = x.transpose(perm)
    assert same_bits(t, np.ascontiguousarray(expected))
    from lpt.backend.int8_steps import onnx_reshape_dims
    assert same_bits(y, np.ascontiguousarray(expected.reshape(onnx_reshape_dims(expected.shape, target, False))))


@pytest.mark.parametrize("eight_lanes", [True, False])
@pytest.mark.parametrize("channels, height, width", [(3, 7, 9), (8, 16, 16), (17, 13, 23), (40, 12, 33)])
def test_a_layers_output_reaches_channels_first_order_and_a_channels_first_operand_its_layout(eight_lanes, channels,
                                                                                             height, width):
    """A convolution's output lies channels-last; the program returns it channels-first, float32 and 8-bit, and an
    operand added to it arrives channels-first and is read in the layer's layout: transposes in blocks through
    registers (8×8 of 4 bytes, 16×16 of one byte) with the rows and columns that fill no block one at a time. The
    layer passes its source through (identity weights), so every value says where it came from."""
    rng = np.random.default_rng(channels)
    identity = np.eye(channels, dtype=np.int8).reshape(channels, channels, 1, 1)
    to_float = lpt.native.Conv(identity, src_zero_point=100, threads=2)
    to_bytes = lpt.native.Conv(identity, src_zero_point=100, dst_scale=np.float32(1), dst_zero_point=100,
                               dst_dtype=np.uint8, threads=2)
    q = rng.integers(0, 256, (2, channels, height, width)).astype(np.uint8)
    x = rng.normal(0, 50, q.shape).astype(np.float32)
    program = Program([("layer", ["q"], "f", to_float.instruction[1]), ("layer", ["q"], "b", to_bytes.instruction[1]),
                       ("binary", ["f", "x"], "s", "add")], ["q", "x"], ["f", "b", "s"], threads=2)
    previous = lpt.native.engine.float_lanes(eight_lanes)
    try:
        f, b, s = program(q, x)
    finally:
        lpt.native.engine.float_lanes(previous)
    assert same_bits(f, q.astype(np.float32) - 100)
    assert same_bits(b, q)
    assert same_bits(s, (q.astype(np.float32) - 100) + x)


@pytest.mark.parametrize("eight_lanes", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
@pytest.mark.parametrize("shape, perm", [((37, 45), (1, 0)), ((2, 40, 33), (0, 2, 1)), ((1, 17, 9, 11), (0, 2, 3, 1)),
                                         ((2, 9, 1, 11, 24), (0, 4, 2, 1, 3)), ((3, 1, 20, 18), (1, 2, 0, 3))])
def test_a_transpose_of_two_blocks_of_axes_is_numpys(eight_lanes, dtype, shape, perm):
    """Perms that move one run of axes past the next (axes of one value anywhere) copy as a blocked transpose, with
    blocks that do not fill 8×8 or 16×16 at the edges; the last moves runs of whole rows (numpy's order, by permute)."""
    x = np.random.default_rng(len(shape)).integers(0, 256, shape).astype(dtype)
    previous = lpt.native.engine.float_lanes(eight_lanes)
    try:
        t = Program([("transpose", ["x"], "t", perm)], ["x"], ["t"], threads=2)(x)[0]
    finally:
        lpt.native.engine.float_lanes(previous)
    assert same_bits(t, np.ascontiguousarray(x.transpose(perm)))


@pytest.mark.parametrize("target", [[5, 5], [-1, -1], [-2, 12], [0, 0, 6]])
def test_a_reshape_to_a_computed_target_it_cannot_take_gives_way(target):
    """Another count of values, two −1s, a negative size, a 0 past the rank: the program raises Unsupported (the
    step then says why in one line, as onnxruntime refuses such a Reshape)."""
    program = Program([("reshape", ["x", "target"], "y", (None, False))], ["x", "target"], ["y"], threads=1)
    with pytest.raises(Unsupported, match="reshape"):
        program(np.zeros((4, 6), np.float32), np.array(target, np.int64))


def test_a_convolutions_channels_last_output_is_transposed_and_reshaped_in_channels_first_order():
    rng = np.random.default_rng(2)
    conv = lpt.native.Conv(rng.integers(-128, 128, (6, 3, 1, 1)).astype(np.int8), src_zero_point=128,
                           multiplier=np.float32(0.01), dst_scale=np.float32(0.1), dst_zero_point=128, dst_dtype=np.uint8)
    q = rng.integers(0, 256, (2, 3, 4, 5)).astype(np.uint8)
    program = Program([("layer", ["q"], "c", conv.instruction[1]), ("transpose", ["c"], "t", (0, 2, 3, 1)),
                       ("reshape", ["c"], "r", ((0, 6, -1), False))], ["q"], ["t", "r"], threads=1)
    t, r = program(q)
    assert same_bits(t, np.ascontiguousarray(conv(q).transpose(0, 2, 3, 1)))
    assert same_bits(r, conv(q).reshape(2, 6, 20))
    with pytest.raises(Unsupported, match="reshape"):
        Program([("reshape", ["q"], "r", ((7, -1), False))], ["q"], ["r"], threads=1)(q)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 4), st.integers(1, 4), st.sampled_from([np.uint8, np.int8, np.float32]),
       st.sampled_from([(1, 1, 1, 1), (2, 3, 5, 7), (1, 20, 3, 2), (2, 1, 4, 4)]), st.booleans())
def test_a_nearest_upsampling_equals_lpts_in_either_layout(seed, kh, kw, dtype, shape, channels_last):
    """A copy of any type; after a convolution (whose output lies channels-last, and stays so), or as given."""
    from lpt.kernels.pooling import upsample_nearest

    rng = np.random.default_rng(seed)
    q = rng.integers(0, 256, shape).astype(np.uint8)
    if channels_last:
        c = shape[1]
        conv = lpt.native.Conv(np.eye(c, dtype=np.int8).reshape(c, c, 1, 1), src_zero_point=0,
                               multiplier=np.float32(1.0), **({} if dtype == np.float32 else
                                                              dict(dst_scale=1.0, dst_zero_point=0, dst_dtype=np.uint8)))
        program = Program([("layer", ["q"], "c", conv.instruction[1]), ("resize_nearest", ["c"], "y", (kh, kw))],
                          ["q"], ["y"], threads=2)
        [got] = program(q)
        expected = upsample_nearest(conv(q), (kh, kw))
    else:
        x = q.astype(dtype) if dtype != np.float32 else rng.normal(0, 1, shape).astype(np.float32)
        [got] = Program([("resize_nearest", ["x"], "y", (kh, kw))], ["x"], ["y"], threads=2)(x)
        expected = upsample_nearest(x, (kh, kw))
    assert same_bits(got, expected)


def float_net(nodes, name, x_shape, initializers) -> onnx.ModelProto:
    """A float32 model of `nodes` from input x (x_shape) to output y."""
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def calibrated_plan(net: onnx.ModelProto, calibration: np.ndarray):
    """The model calibrated on x = `calibration` and transformed, and its plan on two threads."""
    model = clone(lpt.calibrate(ir.serde.deserialize_model(net), {"x": calibration}, quiet=True).model)
    transform(model)
    return model, compile_model(model, threads=2)


def assert_fused_is_kernels(model, plan, feeds: dict) -> None:
    """The plan's output, fused and step by step, is the NumPy kernels' bit for bit."""
    fused, one_by_one = plan.run(feeds)["y"], plan.run(feeds, keep=True)["y"]
    kernels_only = compile_model(model, threads=1, native=False).run(feeds)["y"]
    assert np.array_equal(fused, one_by_one) and np.array_equal(fused, kernels_only)


def pyramid_net():
    """A feature pyramid's top-down step, as PaddleOCR's detector has it: a coarse map upsampled ×2
    (Resize nearest, asymmetric, floor) and added to a finer one, then a convolution."""
    rng = np.random.default_rng(1)
    weights = {"coarse.w": (8, 3, 3, 3), "fine.w": (8, 3, 1, 1), "head.w": (4, 8, 3, 3)}
    initializers = [numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)
                    for name, shape in weights.items()]
    initializers.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
    initializers.append(numpy_helper.from_array(np.zeros(0, np.float32), "roi"))
    nodes = [helper.make_node("Conv", ["x", "coarse.w"], ["coarse"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
             helper.make_node("Relu", ["coarse"], ["coarse.relu"]),
             helper.make_node("Resize", ["coarse.relu", "roi", "scales"], ["up"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             helper.make_node("Conv", ["x", "fine.w"], ["fine"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["up", "fine"], ["sum"]),
             helper.make_node("Conv", ["sum", "head.w"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)]
    return float_net(nodes, "pyramid", ["N", 3, 16, 16], initializers)


def test_an_upsampling_between_int8_layers_keeps_the_network_one_native_call():
    """Left to onnxruntime, the Resize cut PaddleOCR's detector into three native programs and an
    onnxruntime region (2.9 ms of its 100); as a step, the whole network is one call."""
    rng = np.random.default_rng(2)
    model, plan = calibrated_plan(pyramid_net(), rng.uniform(-1, 1, (8, 3, 16, 16)).astype(np.float32))
    assert [s.engine for s in plan.run_steps] == [ENGINE]
    assert ("resize_nearest", (2, 2)) in [s.native for s in plan.steps]
    assert_fused_is_kernels(model, plan, {"x": rng.uniform(-1, 1, (3, 3, 16, 16)).astype(np.float32)})


def stacking_net():
    """Two Concats along the last axis after a convolution: one of its output with itself (basic_pitch's
    harmonic stacking, every part lpt's), one of its output with a Sin of it, which a Cos reads (its CQT's
    stacks, between onnxruntime's ops), then a convolution of their sum."""
    rng = np.random.default_rng(3)
    initializers = [numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "first.w"),
                    numpy_helper.from_array(rng.normal(0, 0.3, (4, 8, 3, 3)).astype(np.float32), "head.w")]
    nodes = [helper.make_node("Conv", ["x", "first.w"], ["c"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Concat", ["r", "r"], ["stacked"], axis=3),
             helper.make_node("Sin", ["r"], ["s"]),
             helper.make_node("Concat", ["r", "s"], ["mixed"], axis=-1),
             helper.make_node("Cos", ["mixed"], ["wave"]),
             helper.make_node("Add", ["stacked", "wave"], ["sum"]),
             helper.make_node("Conv", ["sum", "head.w"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)]
    return float_net(nodes, "stacking", ["N", 3, 8, 8], initializers)


def test_a_concat_along_another_axis_is_lpts_where_its_parts_are():
    """A Concat along the last axis whose parts are all lpt's is an instruction of the native program; one
    between onnxruntime's ops stays in their region (taken, it would cut the region in two). The plan gives
    the NumPy kernels' bits, fused and step by step."""
    rng = np.random.default_rng(4)
    model, plan = calibrated_plan(stacking_net(), rng.uniform(-1, 1, (8, 3, 8, 8)).astype(np.float32))
    assert [s.native for s in plan.steps if s.op_types == ("Concat",)] == [("concat", 3)]
    assert [s.op_types for s in plan.steps if s.backend == "onnxruntime"] == [("Sin", "Concat", "Cos")]
    assert_fused_is_kernels(model, plan, {"x": rng.uniform(-1, 1, (2, 3, 8, 8)).astype(np.float32)})


def test_float_ops_that_only_a_native_program_reads_end_the_region_before_them():
    """basic_pitch_nmp's batch normalization after its CQT (a Mul and an Add by one value each, which onnxruntime
    took 0.9 ms for on [1, 172, 309, 1]) is read only by the quantization that starts a native program: it is
    that program's, and the onnxruntime region ends before it, as one session still."""
    rng = np.random.default_rng(5)
    initializers = [numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "first.w"),
                    numpy_helper.from_array(rng.normal(0, 0.3, (4, 8, 3, 3)).astype(np.float32), "head.w"),
                    numpy_helper.from_array(np.float32([2.5]), "gain"), numpy_helper.from_array(np.float32([-0.5]), "shift")]
    nodes = [helper.make_node("Conv", ["x", "first.w"], ["c"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Sin", ["c"], ["s"]),
             helper.make_node("Mul", ["s", "gain"], ["scaled"]),
             helper.make_node("Add", ["scaled", "shift"], ["normal"]),
             helper.make_node("Conv", ["normal", "head.w"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)]
    net = float_net(nodes, "normalized", ["N", 3, 8, 8], initializers)
    model, plan = calibrated_plan(net, rng.uniform(-1, 1, (8, 3, 8, 8)).astype(np.float32))
    assert [s.op_types for s in plan.steps if s.backend == "onnxruntime"] == [("Sin",)]
    assert [s.native for s in plan.steps if s.op_types in (("Mul",), ("Add",))] == [("binary", "mul"), ("binary", "add")]
    assert_fused_is_kernels(model, plan, {"x": rng.uniform(-1, 1, (2, 3, 8, 8)).astype(np.float32)})


def test_a_programs_constants_are_given_to_it_once_and_its_steps_read_them_where_it_gives_way():
    """The plan's constants a native program reads (the spectrogram's decibel factor and range) are the program's
    own, not its step's inputs; its steps, run one by one once it gave way, read them too and give its bits."""
    from tests.test_f32_regions import ir_model, spectrogram

    plan = compile_model(ir_model(spectrogram()))
    [step] = plan.run_steps
    assert set(step.run.program.constants) == {"decibels", "range"} and step.inputs == ("x",)
    x = np.random.default_rng(2).normal(0, 1, (2, 100)).astype(np.float32)
    native = plan.run({"x": x})["y"]
    step.run.native = False
    assert same_bits(plan.run({"x": x})["y"], native)


def test_constants_given_once_are_the_inputs_they_stand_for_in_calls_and_scans():
    rng = np.random.default_rng(4)
    instructions = [("binary", ["h", "x"], "s", "add"), ("binary", ["s", "k"], "h2", "mul")]
    k = rng.normal(0, 1, (1, 8)).astype(np.float32)
    given = Program(instructions, ["h", "x"], ["h2"], threads=1, constants={"k": k})
    each_call = Program(instructions, ["h", "x", "k"], ["h2"], threads=1)
    h, xs = rng.normal(0, 1, (1, 8)).astype(np.float32), rng.normal(0, 1, (5, 1, 8)).astype(np.float32)
    assert same_bits(given(h, xs[0])[0], each_call(h, xs[0], k)[0])
    assert same_bits(given.scan([h, xs], [0, -2], [-1])[0], each_call.scan([h, xs, k], [0, -2, -1], [-1])[0])
    [[scanned]] = Program.scans([(given, [h, xs], [0, -2], [-1])], threads=1)
    assert same_bits(scanned, each_call.scan([h, xs, k], [0, -2, -1], [-1])[0])
