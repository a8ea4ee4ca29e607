"""What a compiled plan is made of, as data: steps, and the int8 layers and quantizations they run.

lpt.backend.chains reads each fused chain of an int8 graph into an `Int8Layer` or a
`Quantization` once; the engine (lpt.backend.int8_steps) makes them runnable, and the export,
the cross-check and the comparison read the same objects instead of parsing the graph again.
This module knows nothing of graphs: names, arrays and kernels' post-ops only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from lpt import kernels


@dataclass(frozen=True, eq=False)  # eq=False: ndarray fields have no boolean ==
class Quantization:
    """f32 → integers, as a QuantizeLinear (`fake_quantize` None) or an lpt::Quantize computes them.

    QuantizeLinear: q = saturate(rint(x / scale) + zero_point), scale and zero point per tensor or
    1-D along `axis`. lpt::Quantize: FakeQuantize's level, rint(clip(x)·isc + ish) + qmin, with
    `fake_quantize` = (crop_low, crop_high, isc, ish) broadcastable to x; `scale` and the (real
    valued) `zero_point` then only serve to read the integers back.
    """

    scale: np.ndarray
    zero_point: np.ndarray
    qmin: int
    qmax: int
    axis: int | None = None
    fake_quantize: tuple[np.ndarray, ...] | None = None

    @property
    def is_per_tensor(self) -> bool:
        return self.fake_quantize is None and self.scale.size == 1 and self.zero_point.size == 1

    def quantize(self, x: np.ndarray, in_place: bool = False) -> np.ndarray:
        """With `in_place`, a QuantizeLinear overwrites its f32 argument (for steps that own it)."""
        if self.fake_quantize is not None:
            return kernels.quantize_fq(x, *self.fake_quantize, self.qmin, self.qmax)
        return kernels.quantize(x, self.scale, self.zero_point, self.qmin, self.qmax, self.axis, in_place=in_place)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        """The f32 values the integers stand for."""
        if self.fake_quantize is not None:
            return (q.astype(np.float32) - self.zero_point) * self.scale
        return kernels.dequantize(q, self.scale, self.zero_point, self.axis)

    def output_stage_destination(self) -> dict | None:
        """The destination arguments of kernels.output_stage / join_q (one pass), or None when not per tensor."""
        if not self.is_per_tensor:
            return None
        return dict(dst_scale=self.scale, dst_zero_point=self.zero_point, qmin=self.qmin, qmax=self.qmax)


@dataclass(frozen=True, eq=False)
class Int8Layer:
    """An integer convolution or matmul with its output stage, oneDNN's way:

        acc = Σ (q_src − zp_src)·(q_wei − zp_wei)                    int32
        x = post_ops(f32(acc)·multiplier[c] + bias[c])               f32 (kernels.output_stage)
        q = destination.quantize(x)                                  when the chain ends in a quantize

    `op` is "conv", "conv_transpose" or "matmul". `weights` is None for a matmul whose right-hand
    side arrives at run time. `attributes` are the ONNX node's (group, strides, pads, ...).
    `multiplier` None means the int32 accumulator itself is the step's output.
    """

    op: str
    weights: np.ndarray | None
    src_zero_point: np.ndarray
    weight_zero_point: np.ndarray
    attributes: dict = field(default_factory=dict)
    multiplier: np.ndarray | None = None
    bias: np.ndarray | None = None
    post_ops: tuple[kernels.PostOp, ...] = ()
    destination: Quantization | None = None

    @property
    def channel_axis(self) -> int:
        """Where output channels lie: 1 in a convolution's [N, C, ...], −1 in a matmul's [..., N]."""
        return -1 if self.op == "matmul" else 1

    def attribute(self, name: str, default=None):
        return self.attributes.get(name, default)


@dataclass(frozen=True)
class Step:
    """One call in the plan: `run(*inputs) -> outputs`, for the nodes it covers.

    `layer` is the int8 layer the step computes, where it computes one.
    """

    run: Callable[..., list[np.ndarray]]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[str, ...]
    op_types: tuple[str, ...]
    backend: str  # "int8 kernel", "onnxruntime" or "onnx reference"
    layer: Int8Layer | None = None
    engine: str = ""  # what computes an int8 layer: "oneDNN (u8s8)", "lpt AVX2 (s16)", "MLAS (u8u8)", "numpy", ...
    # The step as an instruction of lpt.native's programs, (kind, parameters), where it can be one;
    # consecutive such steps run as one native call (lpt.backend.native_program).
    native: tuple | None = None
    plans: tuple = ()  # an If's branches, each a plan of its own (lpt.backend.if_steps)

