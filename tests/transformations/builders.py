"""Fake-quantized test graphs, written as QDQ ONNX (lpt normalizes them to FakeQuantize)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from lpt.normalize import normalize
from tests.graphs import ir_model, model

RNG = np.random.default_rng(0)


class Graph:
    """Collects nodes and initializers; `fq` adds a QuantizeLinear → DequantizeLinear pair."""

    def __init__(self, seed=0):
        self.nodes, self.inits, self._n = [], {}, 0
        self.rng = np.random.default_rng(seed)  # building the same graph twice gives the same weights

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
        q = self.rng.integers(-127, 128, shape).astype(np.int8)
        channels = shape[axis]
        scale = self.rng.uniform(0.005, 0.02, channels if scale_per_channel else ()).astype(np.float32)
        zp = np.zeros(scale.shape, np.int8)
        attrs = {"axis": axis} if scale_per_channel else {}
        return self.op("DequantizeLinear", [self.const(q, "w"), self.const(scale, "ws"), self.const(zp, "wz")], **attrs)

    def build(self, inputs, outputs, opset=17, output_shapes=None, extra_opsets=None, checked=True):
        shapes = output_shapes or {o: None for o in outputs}
        extra = {"org.openvinotoolkit": 1} if any(n.domain == "org.openvinotoolkit" for n in self.nodes) else None
        extra = {**(extra or {}), **(extra_opsets or {})} or None
        proto = model(self.nodes, inputs, shapes, self.inits, opset=opset, extra_opsets=extra, checked=checked)
        m = ir_model(proto)
        normalize(m)
        return proto, m


def run(m, feeds):
    import lpt

    return lpt.run_reference(m, feeds)


def apply(transformations, m):
    """Run only `transformations` (decomposition first, as the pipeline does) on `m` in place."""
    from lpt.transformations.pipeline import transform

    return transform(m, tuple(transformations))


def assert_same_outputs(before, after, feeds, atol=1e-5):
    for name, expected in run(before, feeds).items():
        np.testing.assert_allclose(run(after, feeds)[name], expected, rtol=1e-5, atol=atol, err_msg=name)


def reasons(m):
    from lpt.transformations.base import recorded_reason

    return {n.name: recorded_reason(n) for n in m.graph if recorded_reason(n)}


def openvino_fq(g, x, levels, il, ih, ol=None, oh=None):
    """An OpenVINO-semantics FakeQuantize node on `x` (domain org.openvinotoolkit)."""
    limits = [g.const(np.asarray(v, np.float32), k) for k, v in
              (("il", il), ("ih", ih), ("ol", il if ol is None else ol), ("oh", ih if oh is None else oh))]
    out = f"{x}_fq"
    g.nodes.append(helper.make_node("FakeQuantize", [x, *limits], [out], name=out, domain="org.openvinotoolkit",
                                    levels=levels))
    return out
