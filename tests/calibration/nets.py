"""Small fp32 graphs for the calibration tests, written with onnx.helper; nodes named like their output."""

from __future__ import annotations

import numpy as np
from onnx import helper

from tests.graphs import ir_model, model

RNG = np.random.default_rng(0)


class Net:
    """Collects nodes (each named after its output) and initializers."""

    def __init__(self, seed=0):
        self.nodes, self.inits = [], {}
        self.rng = np.random.default_rng(seed)

    def const(self, name, array):
        self.inits[name] = np.asarray(array, np.float32)
        return name

    def weight(self, name, shape):
        return self.const(name, self.rng.normal(0, 0.3, shape))

    def op(self, op_type, inputs, out, **attrs):
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def conv(self, x, out, cin, cout, k=3, bias=True, **attrs):
        inputs = [x, self.weight(f"{out}.w", (cout, cin, k, k))]
        if bias:
            inputs.append(self.const(f"{out}.b", self.rng.normal(0, 0.1, cout)))
        return self.op("Conv", inputs, out, pads=[k // 2] * 4, **attrs)

    def gemm(self, x, out, k, n):
        return self.op("Gemm", [x, self.weight(f"{out}.w", (n, k)), self.const(f"{out}.b", self.rng.normal(0, 0.1, n))],
                       out, transB=1)

    def build(self, inputs, outputs, opset=17):
        proto = model(self.nodes, inputs, {o: None for o in outputs}, self.inits, opset=opset)
        return proto


def conv_net():
    """x → Conv → Relu → MaxPool → Flatten → Gemm → y   (the digits_cnn shape, small)."""
    n = Net()
    c = n.conv("x", "conv", 1, 4)
    r = n.op("Relu", [c], "relu")
    p = n.op("MaxPool", [r], "pool", kernel_shape=[2, 2], strides=[2, 2])
    f = n.op("Flatten", [p], "flat")
    n.gemm(f, "y", 4 * 4 * 4, 5)
    return n.build({"x": ["N", 1, 8, 8]}, ["y"])


def conv_inputs(n=40, seed=1):
    return {"x": np.random.default_rng(seed).uniform(0, 1, (n, 1, 8, 8)).astype(np.float32)}


def as_ir(proto):
    return ir_model(proto)


def attention_net():
    """tokens → Gather(table) + pos → LayerNorm → q, k, v (MatMul + Add) → softmax(q·kᵀ)·v → MatMul + Add → y."""
    from onnx import TensorProto

    n = Net()
    n.inits["table"] = n.rng.normal(0, 1, (17, 8)).astype(np.float32)
    e = n.op("Gather", ["table", "tokens"], "emb")
    x = n.op("Add", [e, n.const("pos", n.rng.normal(0, 0.1, (6, 8)))], "x")
    h = n.op("LayerNormalization", [x, n.const("g", np.ones(8)), n.const("beta", np.zeros(8))], "ln", axis=-1)
    proj = {}
    for name in "qkv":
        m = n.op("MatMul", [h, n.weight(f"w{name}", (8, 8))], f"{name}_mm")
        proj[name] = n.op("Add", [m, n.const(f"b{name}", n.rng.normal(0, 0.1, 8))], name)
    kt = n.op("Transpose", [proj["k"]], "kt", perm=[0, 2, 1])
    s = n.op("MatMul", [proj["q"], kt], "scores")
    a = n.op("Softmax", [s], "att", axis=-1)
    o = n.op("MatMul", [a, proj["v"]], "ctx")
    m = n.op("MatMul", [o, n.weight("wo", (8, 3))], "y_mm")
    n.op("Add", [m, n.const("bo", n.rng.normal(0, 0.1, 3))], "y")
    proto = n.build({"tokens": ["N", 6]}, ["y"])
    proto.graph.input[0].type.tensor_type.elem_type = TensorProto.INT64
    return proto


def token_inputs(n=64, seed=1):
    return {"tokens": np.random.default_rng(seed).integers(0, 17, (n, 6)).astype(np.int64)}
