"""A run of a plan's steps as one call into the native engine, on buffers it owns between runs.

    program = Program([("quantize", ["x"], "q", (0.1, 128, 0, 255, False)),
                       ("layer", ["q"], "y", conv.instruction[1]),
                       ("max_pool", ["y"], "p", ((2, 2), (2, 2), (1, 1), (0, 0, 0, 0)))],
                      inputs=["x"], outputs=["p"], threads=2)
    [pooled] = program(x)

Instructions (the `native` descriptions lpt.backend.int8_steps gives its steps): "layer" (a
prepared lpt.native Conv or MatMul), "upsample" (a ConvTranspose whose stride is its kernel: a
prepared MatMul's, kernel_h, kernel_w), "quantize" (scale, zero point, qmin, qmax, signed),
"join" (an Add or Mul of two dequantized 8-bit tensors, Relu, quantize), "max_pool" (2-D),
"flatten" (axis), "squeeze_ones" (axes: each squeezed where it is 1, kept where longer), "product" (a prepared
lpt.native Product), "dynamic_layer" (a prepared Conv or MatMul, bias or None, its weight scale, the output's, a
float32 bias or None, the SiLU (0 none, 1 x·logistic, 2 x·min(1, logistic)), residual weights: float32 in and
out, lpt.backend.dynamic_layers), and on float32 "mean" (a global
average), "average_pool" (kernel, strides, pads, count_include_pad), "hard_swish", "binary" ("mul"
or "add": the same shapes, or one value per channel) and "concat" (any number of inputs: along the
channels, or along the axis it is given), "softmax" (inputs after the first: the int64 shapes a written-out softmax's Reshapes and
Expands are given, each x's with 1 last), "layer_norm" (scale, bias or None, epsilon), "moment_layer_norm" (factor, epsilon,
scale, bias: jax2tf's over axis 1 of [N, C, T] or [N, C]; inputs after the first are the int64 shapes its
Reshapes and Expands are given, each of which must be [N, 1, T] or [N, 1]), "relu", "sigmoid", "tanh", "erf", "gelu" (divisor, one, half),
"mean_axis_1" (keepdims; of [N, T, C], or of [N, T] its last), "extreme_middle" (keepdims, smallest: a ReduceMax or ReduceMin over the
middle axes of [N, *positions, C]), "gather" (a constant table's values and shape, by int32/int64 indices)
and "dense" (weights [k, n], bias or None, stride[, channels, pad at the start, pad at the end[, kernel, sign]]: a
MatMul by the weights, or with a stride the frames of [N, channels, length] as a Conv's, kernels.convolution_1d, or
with a sign each frame of one channel folded about its middle, kernels.folded_convolution_1d; kernels.dense's
order of sums). Each computes what the
step computes in Python, bit for bit. Where an
instruction meets what it does not take (a float tensor where it expects integers, joins of
different shapes), the call raises `Unsupported` and nothing is returned: the caller runs the
steps one by one instead.
"""

from __future__ import annotations

import numpy as np

from lpt.native._library import engine
from lpt.native.operations import Unsupported


class Program:
    def __init__(self, instructions, inputs: list[str], outputs: list[str], threads: int,
                 constants: dict[str, np.ndarray] | None = None):
        """`constants`: inputs whose values never change, given here once instead of by each call's caller (a
        plan looked up and passed oww_melspectrogram's four scalars at every run of its 10-16 µs)."""
        if engine is None:
            raise Unsupported("the native engine is not available")
        self.constants = {name: np.asarray(value, order="C") for name, value in (constants or {}).items()}
        self._constant_arrays = list(self.constants.values())
        slots = {name: index for index, name in enumerate([*inputs, *self.constants])}
        code = []
        for kind, reads, writes, parameters in instructions:
            read_slots = [slots[name] for name in reads]  # every input is made before it is read
            slots[writes] = slots.get(writes, len(slots))
            code.append((kind, read_slots, slots[writes], parameters))
        self.inputs, self.outputs = list(inputs), list(outputs)
        self._program = engine.program(code, len(slots), [slots[n] for n in [*inputs, *self.constants]],
                                       [slots[n] for n in outputs], threads)

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """The outputs, in order. Raises Unsupported where an instruction does not take its input."""
        arrays = [np.asarray(a, order="C") for a in arrays]  # ascontiguousarray would make a 0-d array 1-d
        try:
            return engine.program_run(self._program, arrays + self._constant_arrays)
        except NotImplementedError as why:
            raise Unsupported(str(why)) from None

    def scan(self, arrays, roles: list[int], emits: list[int]) -> list[np.ndarray]:
        """An ONNX Scan whose body is this program, in one call. `roles`, one per input: -1 the same
        array at every step, -2 a sequence read forwards, -3 backwards, k >= 0 a state (its initial
        value, then output k). `emits`, one per output: -1 a state, 0 stacked along a new first axis,
        1 stacked backwards. Each output in order: a state's final value or the stack. Raises
        Unsupported as a call does."""
        arrays = [np.asarray(a, order="C") for a in arrays] + self._constant_arrays
        try:
            return engine.program_scan(self._program, arrays, [*roles, *[-1] * len(self._constant_arrays)],
                                       list(emits))
        except NotImplementedError as why:
            raise Unsupported(str(why)) from None

    @staticmethod
    def scans(scans, threads: int) -> list[list[np.ndarray]]:
        """Independent Scans at once, each on one of up to `threads` threads: (program, arrays, roles, emits)
        each, as `scan` takes them, of distinct programs made for one thread. Each one's outputs."""
        try:
            return engine.program_scans([(program._program,
                                          [np.asarray(a, order="C") for a in arrays] + program._constant_arrays,
                                          [*roles, *[-1] * len(program._constant_arrays)], list(emits))
                                         for program, arrays, roles, emits in scans], threads)
        except NotImplementedError as why:
            raise Unsupported(str(why)) from None

    def seconds(self) -> list[float]:
        """Each instruction's time in the last run, in order (empty before the first)."""
        return engine.program_seconds(self._program)

