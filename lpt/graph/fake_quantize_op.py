"""lpt's one normalized FakeQuantize form, and the value object describing one instance.

Every FakeQuantize-equivalent pattern lpt loads becomes a node ``lpt::FakeQuantize`` with
inputs ``(x, input_low, input_high, output_low, output_high)`` and attribute ``levels``:

* 5 inputs: OpenVINO's FakeQuantize semantics (the CPU plugin's affine form, DESIGN.md §2);
* 7 inputs, the last two ``scale`` and ``zero_point`` (attribute ``axis``): ONNX
  QuantizeLinear → DequantizeLinear semantics with exactly those parameters, saturating to
  ``[qmin, qmax]`` (see `integer_range`). The four limits are the equivalent interval, so
  that every fake-quantized tensor describes its range the same way.

Keeping the imported semantics is what lets lpt stay bit-exact against onnxruntime on QDQ
models (the two forms differ at exact ties when the zero point is odd).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from lpt.graph.constants import add_constant, const_array
from lpt.numerics import dequantize_linear, fake_quantize, quantize_linear
from lpt.numerics.levels import level_range

DOMAIN = "lpt"
OP_TYPE = "FakeQuantize"
OPENVINO_DOMAIN = "org.openvinotoolkit"


def integer_range(levels: int, signed: bool) -> tuple[int, int]:
    """[qmin, qmax] of `levels` integers: unsigned from 0; signed centred (255 → [-127, 127])."""
    return level_range(levels, signed)


def _f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


@dataclass(frozen=True, eq=False)
class FakeQuantize:
    """The parameters of one fake-quantized tensor (an ``lpt::FakeQuantize`` node)."""

    input_low: np.ndarray
    input_high: np.ndarray
    output_low: np.ndarray
    output_high: np.ndarray
    levels: int
    scale: np.ndarray | None = None  # set ⇔ QuantizeLinear→DequantizeLinear semantics
    zero_point: np.ndarray | None = None
    axis: int = 1

    @classmethod
    def from_qdq(cls, scale, zero_point, *, axis: int = 1, rank: int | None = None, levels: int | None = None):
        """The FQ equivalent to QuantizeLinear→DequantizeLinear(scale, zero_point).

        `rank` (of the quantized tensor) is needed to shape per-axis limits so they broadcast.
        `levels` defaults to the zero point type's full range (256 for 8 bits).
        """
        scale = _f32(scale)
        zero_point = np.asarray(zero_point)
        if zero_point.dtype.kind not in "iu":
            raise TypeError(f"zero point must be an integer array, got {zero_point.dtype}")
        bits = zero_point.dtype.itemsize * 8
        levels = levels or 2**bits
        qmin, qmax = integer_range(levels, signed=zero_point.dtype.kind == "i")
        zp = zero_point.astype(np.int64)
        low = _f32((qmin - zp) * scale.astype(np.float64))
        high = _f32((qmax - zp) * scale.astype(np.float64))
        if scale.ndim == 1 and scale.size > 1:
            if rank is None:
                raise ValueError("per-axis quantization needs the tensor's rank")
            shape = [1] * rank
            shape[axis % rank] = scale.size
            low, high = low.reshape(shape), high.reshape(shape)
        return cls(low, high, low, high, levels, scale, zero_point, axis)

    @property
    def semantics(self) -> str:
        return "onnx-qdq" if self.scale is not None else "openvino"

    @property
    def signed(self) -> bool:
        if self.zero_point is not None:
            return self.zero_point.dtype.kind == "i"
        return bool((self.output_low < 0).any())

    @property
    def integer_range(self) -> tuple[int, int]:
        return integer_range(self.levels, self.signed)

    @property
    def per_channel_axis(self) -> int | None:
        """The axis limits vary along, or None for a per-tensor FQ."""
        shapes = [a.shape for a in (self.input_low, self.input_high, self.output_low, self.output_high)]
        sizes = np.array([s for shape in shapes for s in shape] or [1])
        if (sizes <= 1).all():
            return None
        rank = max(len(s) for s in shapes)
        padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
        return next(d for d in range(rank) if any(s[d] > 1 for s in padded))

    @property
    def is_symmetric(self) -> bool:
        """The zero point is 0: the integer range maps onto an interval that starts or centres at 0."""
        if self.zero_point is not None:
            return bool((self.zero_point == 0).all())
        qmin, qmax = self.integer_range
        scale = (self.output_high.astype(np.float64) - self.output_low) / (qmax - qmin)
        with np.errstate(divide="ignore", invalid="ignore"):
            shift = qmin - self.output_low / scale
        return bool(np.all(np.abs(np.nan_to_num(shift)) < 1e-3))

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """The integer tensor of a QDQ-semantics FQ: saturate(round(x / scale) + zero_point) on [qmin, qmax]."""
        if self.scale is None:
            raise ValueError("an OpenVINO-semantics FakeQuantize has no integer form of its own")
        q = quantize_linear(x, self.scale, self.zero_point, axis=self.axis)
        qmin, qmax = self.integer_range  # narrower than the storage type for levels 255
        return np.clip(q, qmin, qmax).astype(self.zero_point.dtype)

    def apply(self, x: np.ndarray) -> np.ndarray:
        """Evaluate the FQ on `x` with its own semantics (exact)."""
        if self.scale is not None:
            return dequantize_linear(self.quantize(x), self.scale, self.zero_point, axis=self.axis)
        return fake_quantize(x, self.input_low, self.input_high, self.output_low, self.output_high, self.levels)

    def make_node(self, graph: ir.Graph, x: ir.Value, name: str) -> ir.Node:
        """A new lpt::FakeQuantize node reading `x` (not yet inserted into the graph)."""
        inputs = [x] + [
            add_constant(graph, f"{name}/{field}", getattr(self, field))
            for field in ("input_low", "input_high", "output_low", "output_high")
        ]
        attributes: dict = {"levels": self.levels}
        if self.scale is not None:
            inputs += [add_constant(graph, f"{name}/scale", self.scale),
                       add_constant(graph, f"{name}/zero_point", self.zero_point)]
            attributes["axis"] = self.axis
        output = ir.Value(name=f"{name}/out", shape=x.shape, type=ir.TensorType(ir.DataType.FLOAT))
        return ir.node(OP_TYPE, inputs, attributes, domain=DOMAIN, name=name, outputs=[output])


def read_fake_quantize(node: ir.Node) -> FakeQuantize | None:
    """The FakeQuantize an lpt or OpenVINO FakeQuantize node computes, if its parameters are constant."""
    if node.op_type != OP_TYPE or node.domain not in (DOMAIN, OPENVINO_DOMAIN):
        return None
    params = [const_array(v) for v in node.inputs[1:]]
    if any(p is None for p in params) or len(params) not in (4, 6):
        return None
    levels = node.attributes["levels"].as_int()
    if len(params) == 6:
        axis = node.attributes["axis"].as_int() if "axis" in node.attributes else 1
        return FakeQuantize(*map(_f32, params[:4]), levels, _f32(params[4]), params[5], axis)
    return FakeQuantize(*map(_f32, params), levels)


def is_fake_quantize(node: ir.Node) -> bool:
    return node.op_type == OP_TYPE and node.domain in (DOMAIN, OPENVINO_DOMAIN)
