"""An LSTM written out as its cells' ops: LSTM(X, W, R, B, h0, c0) → per step Concat, MatMul, Add, Sigmoid, Tanh,
Slice, Mul.

onnxruntime's LSTM op costs ~55 µs a call for silero_vad's decoder cell (batch 1, one step, hidden 128), some 20
times its arithmetic. lpt runs small float32 ops natively (Gather, Squeeze, Unsqueeze, Slice, Concat, MatMul by a
constant, Add, Mul, Sigmoid, Tanh), so once the shapes are known (lpt.graph.specialize) and the weights are
initializers, an LSTM of a few steps written as those ops runs in lpt. Per step, ONNX's gates in order i, o, f, c:

    gates = Concat(x_t, h) · [Wᵀ; Rᵀ] + (Wb + Rb)     (one MatMul, one Add; W and R joined once, in numpy)
    i, o, f = Slices of Sigmoid(gates[:, :3H]);  z = Tanh(gates[:, 3H:])
    c = f⊙c + i⊙z;  h = o⊙Tanh(c)

16 ops a step, the Gather of x_t included (15 without B). A missing initial state is zeros (as is one that is a
constant of zeros), so the first step leaves out what zeros give: without h0 it is x_0 · Wᵀ (no Concat), without
c0 c = i⊙z (no f, no f⊙c, no Add).

    unrolled, count = unroll_lstms(model)

Only forward LSTMs with ONNX's default activations, no clip, no peepholes, no sequence_lens, and at most
`max_steps` steps are written out; any other node stays as it is, and the debug log says why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from lpt.graph.specialize import names_read, static_shapes, subgraphs

logger = logging.getLogger(__name__)

_DEFAULT_ACTIVATIONS = ["Sigmoid", "Tanh", "Tanh"]
_KNOWN_ATTRIBUTES = {"activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size",
                     "input_forget", "layout"}


@dataclass(frozen=True)
class _Lstm:
    """What an eligible LSTM node computes with; state and output names are "" where the node has none."""
    steps: int
    hidden: int
    weights: np.ndarray  # W[0] [4H, I]
    recurrence: np.ndarray  # R[0] [4H, H]
    bias: np.ndarray | None  # Wb + Rb [4H]
    x: str
    initial_h: str
    initial_c: str
    y: str
    y_h: str
    y_c: str


def unroll_lstms(model: onnx.ModelProto, max_steps: int = 8) -> tuple[onnx.ModelProto, int]:
    """A copy of `model` with each LSTM it can unroll replaced by the standard ONNX ops of its cells (see the
    module doc); and how many it replaced."""
    unrolled = onnx.ModelProto()
    unrolled.CopyFrom(model)
    graph = unrolled.graph
    opset = next((o.version for o in unrolled.opset_import if o.domain in ("", "ai.onnx")), 1)
    if not any(node.op_type == "LSTM" and node.domain in ("", "ai.onnx") for node in graph.node):
        return unrolled, 0
    try:
        inferred = onnx.shape_inference.infer_shapes(unrolled).graph
        shapes = {**{t.name: tuple(t.dims) for t in graph.initializer}, **static_shapes(inferred)}
    except Exception as why:  # noqa: BLE001 - without shapes no LSTM is eligible; the model stays as it is
        logger.debug("no LSTM unrolled, shape inference failed: %s", why)
        return unrolled, 0
    # an initializer the graph also lists as an input is a default a caller may override, not a constant
    constants = {t.name: t for t in graph.initializer if t.name not in {v.name for v in graph.input}}
    taken = _names_in(graph)
    nodes, count, read_before = [], 0, set()
    for node in graph.node:
        if node.op_type != "LSTM" or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        lstm = _read_lstm(node, shapes, constants, opset, max_steps)
        if isinstance(lstm, str):
            logger.debug("LSTM %r is not unrolled: %s", node.name, lstm)
            nodes.append(node)
            continue
        writer = _Writer(node.name or "lstm", opset, taken)
        nodes.extend(writer.cells(lstm))
        graph.initializer.extend(writer.initializers)
        read_before.update(name for name in node.input if name in constants)
        count += 1
    del graph.node[:]
    graph.node.extend(nodes)
    _drop_unread_initializers(graph, read_before)
    return unrolled, count


def _read_lstm(node: onnx.NodeProto, shapes: dict, constants: dict, opset: int, max_steps: int) -> _Lstm | str:
    """The LSTM node's parts where it can be unrolled, else why not."""
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if opset < 10:
        return f"opset {opset}: Slice takes attributes before opset 10"
    if set(attributes) - _KNOWN_ATTRIBUTES:
        return f"unknown attributes {sorted(set(attributes) - _KNOWN_ATTRIBUTES)}"
    if attributes.get("direction", b"forward") != b"forward":
        return f"direction {attributes['direction'].decode()}"
    if attributes.get("layout", 0) != 0 or attributes.get("input_forget", 0) != 0:
        return "layout or input_forget is not 0"
    if "clip" in attributes:
        return "clip is set"
    activations = [a.decode() for a in attributes.get("activations", [])]
    if activations not in ([], _DEFAULT_ACTIVATIONS) or "activation_alpha" in attributes or \
            "activation_beta" in attributes:
        return f"activations {activations} are not ONNX's defaults"
    if "hidden_size" not in attributes:
        return "no hidden_size"
    inputs = [*node.input, *[""] * (8 - len(node.input))]
    x, w, r, b, sequence_lens, initial_h, initial_c, peepholes = inputs
    if sequence_lens or peepholes:
        return "sequence_lens or peepholes are given"
    if any(name and name not in constants for name in (w, r, b)):
        return "W, R or B is no initializer"
    if any(name and constants[name].data_type != onnx.TensorProto.FLOAT for name in (w, r, b)):
        return "W, R or B is not float32"
    if x not in shapes or len(shapes[x]) != 3:
        return f"X's shape {shapes.get(x, 'unknown')} is not [seq, batch, input] of numbers"
    steps, batch, input_size = shapes[x]
    hidden = attributes["hidden_size"]
    if not 1 <= steps <= max_steps:
        return f"{steps} steps, more than {max_steps} or none"
    weights, recurrence = numpy_helper.to_array(constants[w]), numpy_helper.to_array(constants[r])
    bias = numpy_helper.to_array(constants[b]) if b else None
    if weights.shape != (1, 4 * hidden, input_size) or recurrence.shape != (1, 4 * hidden, hidden) or \
            (bias is not None and bias.shape != (1, 8 * hidden)):
        return f"W, R or B's shape does not fit hidden_size {hidden} and input size {input_size}"
    for state in (initial_h, initial_c):
        if state and shapes.get(state) != (1, batch, hidden):  # a state broadcast over the batch would not Concat
            return f"initial state {state!r} has shape {shapes.get(state, 'unknown')}, not {(1, batch, hidden)}"
    initial_h, initial_c = (state if state not in constants or numpy_helper.to_array(constants[state]).any() else ""
                            for state in (initial_h, initial_c))  # a constant of zeros is what no state is
    outputs = [*node.output, *[""] * (3 - len(node.output))]
    return _Lstm(steps, hidden, weights[0], recurrence[0],
                 None if bias is None else bias[0, :4 * hidden] + bias[0, 4 * hidden:],
                 x, initial_h, initial_c, *outputs)


class _Writer:
    """Writes one LSTM's cells as nodes; the new values, nodes and initializers named `prefix`/… , none of them a
    name in `taken` (which it extends)."""

    def __init__(self, prefix: str, opset: int, taken: set[str]):
        self.prefix, self.opset, self.taken = prefix, opset, taken
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.ints: dict[tuple, str] = {}

    def cells(self, lstm: _Lstm) -> list[onnx.NodeProto]:
        """The nodes computing `lstm`'s outputs (under their own names), in order; initializers in self.initializers."""
        hidden = lstm.hidden
        # [Wᵀ; Rᵀ] for steps reading an h; Wᵀ alone for a first step without h0 (where h is zeros)
        joined = self.constant("W_R", np.concatenate([lstm.weights.T, lstm.recurrence.T])) \
            if lstm.initial_h or lstm.steps > 1 else None
        inputs_only = self.constant("W", lstm.weights.T) if not lstm.initial_h else None
        bias = self.constant("B", lstm.bias) if lstm.bias is not None else None
        h = self.squeeze(lstm.initial_h) if lstm.initial_h else None
        c = self.squeeze(lstm.initial_c) if lstm.initial_c else None
        step_outputs = []
        for t in range(lstm.steps):
            last = t == lstm.steps - 1
            x_t = self.squeeze(lstm.x) if lstm.steps == 1 else \
                self.op("Gather", [lstm.x, self.int64(t, scalar=True)], f"x{t}", axis=0)
            if h is None:
                gates = self.op("MatMul", [x_t, inputs_only], f"gates{t}")
            else:
                gates = self.op("MatMul", [self.op("Concat", [x_t, h], f"x_h{t}", axis=1), joined], f"gates{t}")
            if bias is not None:
                gates = self.op("Add", [gates, bias], f"biased_gates{t}")
            sigmoids = self.op("Sigmoid", [self.slice(gates, 0, 3 * hidden, f"i_o_f{t}")], f"i_o_f{t}")
            z = self.op("Tanh", [self.slice(gates, 3 * hidden, 4 * hidden, f"z{t}")], f"z{t}")
            i_z = self.op("Mul", [self.slice(sigmoids, 0, hidden, f"i{t}"), z], f"i_z{t}")
            if c is None:
                c = i_z
            else:
                f_c = self.op("Mul", [self.slice(sigmoids, 2 * hidden, 3 * hidden, f"f{t}"), c], f"f_c{t}")
                c = self.op("Add", [f_c, i_z], f"c{t}")
            if not last or lstm.y or lstm.y_h:  # the last step's h only where an output is made of it
                o = self.slice(sigmoids, hidden, 2 * hidden, f"o{t}")
                h = self.op("Mul", [o, self.op("Tanh", [c], f"tanh_c{t}")], f"h{t}")
            if lstm.y:
                step_outputs.append(self.unsqueeze(h, [0, 1], output=lstm.y if lstm.steps == 1 else None))
        if lstm.y and lstm.steps > 1:
            self.op("Concat", step_outputs, "Y", axis=0, output=lstm.y)
        if lstm.y_h:
            self.unsqueeze(h, [0], output=lstm.y_h)
        if lstm.y_c:
            self.unsqueeze(c, [0], output=lstm.y_c)
        return self.nodes

    def name(self, suffix: str) -> str:
        """`prefix`/`suffix`, or with .1, .2, … after it where that is taken."""
        base = f"{self.prefix}/{suffix}"
        name, n = base, 1
        while name in self.taken:
            name, n = f"{base}.{n}", n + 1
        self.taken.add(name)
        return name

    def op(self, op_type: str, inputs: list[str], suffix: str, output: str | None = None, **attributes) -> str:
        """A node of `op_type` appended; its output's name (`output` where given, else a new one)."""
        output = output or self.name(suffix)
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=self.name(f"{op_type}_{suffix}"),
                                           **attributes))
        return output

    def constant(self, suffix: str, array: np.ndarray) -> str:
        name = self.name(suffix)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def int64(self, *values: int, scalar: bool = False) -> str:
        """An int64 initializer: the one value as a scalar when `scalar`, else the 1-D `values`; one per content."""
        key = (scalar, values)
        if key not in self.ints:
            array = np.array(values[0] if scalar else values, np.int64)
            self.ints[key] = self.constant(f"{'int' if scalar else 'ints'}_{'_'.join(map(str, values))}", array)
        return self.ints[key]

    def squeeze(self, value: str) -> str:
        """`value` without its first axis (of size 1)."""
        if self.opset >= 13:
            return self.op("Squeeze", [value, self.int64(0)], f"{value}/squeezed")
        return self.op("Squeeze", [value], f"{value}/squeezed", axes=[0])

    def unsqueeze(self, value: str, axes: list[int], output: str | None = None) -> str:
        if self.opset >= 13:
            return self.op("Unsqueeze", [value, self.int64(*axes)], f"{value}/unsqueezed", output=output)
        return self.op("Unsqueeze", [value], f"{value}/unsqueezed", output=output, axes=axes)

    def slice(self, value: str, start: int, end: int, suffix: str) -> str:
        """`value`[:, start:end]."""
        return self.op("Slice", [value, self.int64(start), self.int64(end), self.int64(1)], f"{suffix}/sliced")


def _names_in(graph: onnx.GraphProto) -> set[str]:
    """Every value and node name of `graph` and its subgraphs: what new names must not be."""
    names = {v.name for v in [*graph.input, *graph.output, *graph.value_info]} | {t.name for t in graph.initializer}
    for node in graph.node:
        names.update([node.name, *node.input, *node.output])
        for attribute in node.attribute:
            for subgraph in subgraphs(attribute):
                names |= _names_in(subgraph)
    return names


def _drop_unread_initializers(graph: onnx.GraphProto, candidates: set[str]) -> None:
    """The initializers among `candidates` (the unrolled LSTMs' W, R, B, constant states) that nothing reads any
    more, removed."""
    unread = candidates - {v.name for v in graph.output}.union(*(names_read(node) for node in graph.node))
    kept = [t for t in graph.initializer if t.name not in unread]
    del graph.initializer[:]
    graph.initializer.extend(kept)
