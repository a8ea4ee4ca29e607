"""Fake-quantized test graphs, written as QDQ ONNX (lpt normalizes them to FakeQuantize)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from lpt.normalize import normalize
from tests.graphs import ir_model, model

RNG = np.random.default_rng(0)


class Graph:
    """Collects nodes and initializers; `fq` adds a QuantizeLinear → DequantizeLinear pair."""

    def __init__(self):
        self.nodes, self.inits, self._n = [], {}, 0

    def name(self, prefix):
        self._n += 1
        return f"{prefix}{self._n}"

    def const(self, array, prefix="c"):
        name = self.name(prefix)
        self.inits[name] = np.asarray(array)
        return name

    def op(self, op_type, inputs, name=None, **attrs):
        out = name or self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def fq(self, x, scale, zero_point=np.uint8(0), axis=None):
        """Fake-quantize activation `x` (QDQ semantics)."""
        s, z = self.const(np.asarray(scale, np.float32), "s"), self.const(zero_point, "zp")
        attrs = {} if axis is None else {"axis": axis}
        q = self.op("QuantizeLinear", [x, s, z], **attrs)
        return self.op("DequantizeLinear", [q, s, z], name=f"{x}_fq", **attrs)

    def weight(self, shape, scale_per_channel=True, axis=0):
        """An int8 symmetric per-channel weight: int8 constant → DequantizeLinear."""
        q = RNG.integers(-127, 128, shape).astype(np.int8)
        channels = shape[axis]
        scale = RNG.uniform(0.005, 0.02, channels if scale_per_channel else ()).astype(np.float32)
        zp = np.zeros(scale.shape, np.int8)
        attrs = {"axis": axis} if scale_per_channel else {}
        return self.op("DequantizeLinear", [self.const(q, "w"), self.const(scale, "ws"), self.const(zp, "wz")], **attrs)

    def build(self, inputs, outputs, opset=17):
        proto = model(self.nodes, inputs, {o: None for o in outputs}, self.inits, opset=opset)
        m = ir_model(proto)
        normalize(m)
        return proto, m
