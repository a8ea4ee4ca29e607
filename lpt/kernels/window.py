"""The sliding window of convolution and pooling over the trailing spatial axes of [N, C, *spatial]."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Window:
    """ONNX kernel_shape, strides, dilations and pads ([x1_begin, x2_begin, …, x1_end, x2_end])."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]

    @classmethod
    def of(cls, kernel: Sequence[int], strides=None, dilations=None, pads=None) -> Window:
        """A window with ONNX's defaults: strides and dilations 1, no padding."""
        rank = len(kernel)
        window = cls(tuple(int(k) for k in kernel),
                     tuple(int(s) for s in strides) if strides is not None else (1,) * rank,
                     tuple(int(d) for d in dilations) if dilations is not None else (1,) * rank,
                     tuple(int(p) for p in pads) if pads is not None else (0,) * (2 * rank))
        if not (len(window.strides) == len(window.dilations) == rank and len(window.pads) == 2 * rank):
            raise ValueError(f"window attributes do not fit a {rank}-D kernel: {window}")
        if min(window.kernel + window.strides + window.dilations) < 1 or min(window.pads, default=0) < 0:
            raise ValueError(f"kernel, strides and dilations must be positive and pads non-negative: {window}")
        return window

    @property
    def taps(self) -> int:
        """The number of kernel positions, ∏ kernel."""
        return int(np.prod(self.kernel))

    def output_shape(self, spatial: Sequence[int]) -> tuple[int, ...]:
        """out_i = ⌊(in_i + begin_i + end_i − dilation_i·(kernel_i − 1) − 1) / stride_i⌋ + 1."""
        rank = len(self.kernel)
        if len(spatial) != rank:
            raise ValueError(f"a {rank}-D window over {len(spatial)} spatial axes")
        shape = tuple((size + self.pads[i] + self.pads[rank + i] - self.dilations[i] * (self.kernel[i] - 1) - 1)
                      // self.strides[i] + 1 for i, size in enumerate(spatial))
        if min(shape) < 1:
            raise ValueError(f"the window {self} does not fit the spatial shape {tuple(spatial)}")
        return shape

    def padded(self, x: np.ndarray, value, channels_last: bool = False) -> np.ndarray:
        """x [N, C, *spatial] with each spatial axis padded by `value` as `pads` says.

        The copy keeps x's memory layout (a channels-last x stays channels-last), so later steps
        read it in the order it was written. With `channels_last`, x is [N, *spatial, C] and the
        copy is C-contiguous.
        """
        rank = len(self.kernel)
        if not any(self.pads):
            return x
        first = x.ndim - rank - channels_last
        interior = [slice(None)] * x.ndim
        shape = list(x.shape)
        for i in range(rank):
            begin, end = self.pads[i], self.pads[rank + i]
            interior[first + i] = slice(begin, begin + shape[first + i])
            shape[first + i] += begin + end
        out = np.empty(shape, x.dtype) if channels_last else _empty_in_layout_of(x, shape)
        out.fill(value)
        out[tuple(interior)] = x
        return out

    def tap_slices(self, out_shape: Sequence[int]) -> Iterator[tuple]:
        """For each kernel position (in C order), the index of the padded input it meets at every output position."""
        for offsets in itertools.product(*(range(k) for k in self.kernel)):
            yield (Ellipsis,) + tuple(
                slice(o * d, o * d + s * (n - 1) + 1, s)
                for o, d, s, n in zip(offsets, self.dilations, self.strides, out_shape))


def _empty_in_layout_of(x: np.ndarray, shape) -> np.ndarray:
    """An uninitialized array of `shape` whose axes are laid out in memory in the order of x's."""
    order = sorted(range(x.ndim), key=lambda axis: -x.strides[axis])  # outermost axis first
    return np.empty([shape[axis] for axis in order], x.dtype).transpose(np.argsort(order))
