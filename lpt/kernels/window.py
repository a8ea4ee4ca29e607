"""The sliding window of convolution and pooling over the trailing spatial axes of [N, C, *spatial]."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Window:
    """ONNX kernel_shape, strides, dilations and pads ([x1_begin, x2_begin, …, x1_end, x2_end]).

    auto_pad SAME_UPPER / SAME_LOWER leaves the pads to the input's size: `for_input` gives the
    window with those pads written out (ceil(in / stride) outputs, the odd pad at the end for
    SAME_UPPER, at the beginning for SAME_LOWER); VALID is no padding.
    """

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]
    auto_pad: str = "NOTSET"

    @classmethod
    def of(cls, kernel: Sequence[int], strides=None, dilations=None, pads=None, auto_pad="NOTSET") -> Window:
        """A window with ONNX's defaults: strides and dilations 1, no padding."""
        rank = len(kernel)
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad or "NOTSET")
        if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
            raise ValueError(f"auto_pad {auto_pad!r} is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID")
        if auto_pad != "NOTSET":
            pads = None
        window = cls(tuple(int(k) for k in kernel),
                     tuple(int(s) for s in strides) if strides is not None else (1,) * rank,
                     tuple(int(d) for d in dilations) if dilations is not None else (1,) * rank,
                     tuple(int(p) for p in pads) if pads is not None else (0,) * (2 * rank),
                     "NOTSET" if auto_pad == "VALID" else auto_pad)
        if not (len(window.strides) == len(window.dilations) == rank and len(window.pads) == 2 * rank):
            raise ValueError(f"window attributes do not fit a {rank}-D kernel: {window}")
        if min(window.kernel + window.strides + window.dilations) < 1 or min(window.pads, default=0) < 0:
            raise ValueError(f"kernel, strides and dilations must be positive and pads non-negative: {window}")
        return window

    def for_input(self, spatial: Sequence[int]) -> Window:
        """This window with explicit pads for an input of this spatial shape (itself without auto_pad)."""
        if self.auto_pad == "NOTSET":
            return self
        rank, begins, ends = len(self.kernel), [], []
        for size, k, s, d in zip(spatial, self.kernel, self.strides, self.dilations):
            total = max(0, (-(-size // s) - 1) * s + d * (k - 1) + 1 - size)
            small, large = total // 2, total - total // 2
            begins.append(small if self.auto_pad == "SAME_UPPER" else large)
            ends.append(large if self.auto_pad == "SAME_UPPER" else small)
        if len(begins) != rank:
            raise ValueError(f"a {rank}-D window over {len(spatial)} spatial axes")
        return Window(self.kernel, self.strides, self.dilations, tuple(begins + ends))

    def with_fixed_pads(self) -> Window | None:
        """This window with explicit pads where they do not depend on the input's size (no auto_pad, VALID, or
        SAME_* with every stride 1, whose pads are dilation·(kernel − 1) split), else None."""
        if self.auto_pad == "NOTSET":
            return self
        if any(s != 1 for s in self.strides):
            return None
        return self.for_input(self.kernel)  # with stride 1, any size gives these pads

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
