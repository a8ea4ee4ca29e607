"""Static int8 LSTM/GRU: the gate MatMuls on int8, with calibrated ranges for the input and the
hidden state (`lpt quantize --int8-recurrent`).

ONNX's LSTM and GRU ops have no place for a quantizer inside their recurrence, so each one taken
becomes the same function written in standard ops, per direction and per gate g:

    P_g = MatMul(X, W_gᵀ) + b_g      the gate's input projection for every time step at once: a
                                     MatMul like any other, its input and weight FQs placed as usual
    Scan(h₀[, c₀], P_0 … P_G−1) → h_T[, c_T], Y
        body:  MatMul(FQ(h), FQ(R_gᵀ)) + P_g,t     the recurrent products, on int8 (one FQ of h)
               the gates in f32, as the op computes them (ONNX's gate order: LSTM i o f c, GRU z r h)

One MatMul per gate, not one of all gates sliced after: the body then holds only ops that lpt's native
engine runs, so that each time step is one native call (lpt.backend.scan_steps).

h's range is the min/max of the hidden states the Scan emits (Y) and of h₀, one range per
direction: a clipped state would feed every later step, and h is bounded by tanh anyway. R_gᵀ is
symmetric per column (per gate row of R), as other weights. Only the copy of h that the MatMuls
read is quantized: the state carried from step to step, and c, stay f32, so the error does not
compound through the blend h = (1 − z)·h̃ + z·h.

No peer quantizes the recurrence on CPU (onnxruntime#9796, openvino#12196); onnxruntime's
`quantize_dynamic` and lpt's `--dynamic` store W in int8 and compute in f32. The measured
comparison is in README.

Taken: LSTM and GRU in the main graph with constant W, R (and B), the default activations, no
clip, no peepholes, no sequence_lens, layout 0, and for GRU linear_before_reset=1 (PyTorch's form;
with 0 the candidate's product reads r⊙h, a second tensor to quantize). Every other one stays an
f32 op and the report says why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from lpt.calibration.insertion import activation_fake_quantize, safe_range, weight_fake_quantize
from lpt.calibration.placement import Skipped
from lpt.graph.constants import add_constant, const_array
from lpt.graph.ops import attribute
from lpt.graph.rewrite import replace_value

logger = logging.getLogger(__name__)

RECURRENT_OPS = ("LSTM", "GRU")
# Unless told (int8_recurrent True or False), the LSTM/GRU of at least this hidden size take the Scan form,
# where their recurrent products take most of the time and int8 costs little accuracy. Measured:
# ddddocr_common (LSTM, hidden 512): 24.0 → 23.9 dB on its samples, its LSTM 3.1 ms in onnxruntime f32
# against 0.5 ms on lpt's backend (both directions, a Xeon with AMX, 2 threads); plcmos_v2 (GRU, hidden 32):
# 48.3 → 42.8 dB, and no faster than f32 (README, "Static int8 LSTM/GRU").
AUTO_HIDDEN = 256
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


@dataclass(frozen=True, eq=False)
class RecurrentScan:
    """One direction of a rewritten LSTM/GRU: its Scan, the body's MatMul whose inputs get FQs,
    and the main-graph tensors that hold every value of h (the initial state and the states emitted)."""

    op: str  # the LSTM/GRU node it replaces
    op_type: str
    scan: ir.Node
    matmuls: tuple[ir.Node, ...]  # in the body: MatMul(h, R_gᵀ) per gate, reading one h
    hidden_states: tuple[ir.Value, ...]  # h₀ and Y of this direction: h's range is theirs

    @property
    def name(self) -> str:
        return self.scan.name


def to_scans(model: ir.Model, ignore_rules=None, min_hidden: int = 0) -> tuple[list[RecurrentScan], list[Skipped]]:
    """Rewrite every eligible LSTM/GRU of `model`'s main graph of hidden size `min_hidden` or more into
    projection MatMuls and a Scan per direction, in place, computing the same function in f32. (scans, ops
    left as they are and why)"""
    scans, skipped = [], []
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
    for node in list(model.graph):
        if node.op_type not in RECURRENT_OPS or node.domain not in ("", "ai.onnx"):
            continue
        name = node.name or node.outputs[0].name
        reason = _why_not(node, opset)
        if reason is None and (hidden := const_array(node.inputs[2]).shape[2]) < min_hidden:
            reason = (f"hidden size {hidden}, below {min_hidden}: int8 pays where the recurrent products are "
                      "larger (--int8-recurrent quantizes it)")
        if reason is None and ignore_rules is not None and (pattern := ignore_rules.match(node)):
            reason = f"ignored ({pattern})"
        if reason is not None:
            skipped.append(Skipped(name, node.op_type, f"recurrence left f32: {reason}"))
            continue
        scans += _rewrite(model.graph, node, opset)
    return scans, skipped


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if len(node.inputs) > index else None


def _why_not(node: ir.Node, opset: int) -> str | None:
    """None when `node` can be rewritten, else the reason it cannot."""
    op = node.op_type
    if opset < 9:
        return f"opset {opset}: the Scan form (Scan without a batch axis) needs opset 9"
    for index, what in ((1, "W"), (2, "R")):
        value = const_array(_input(node, index))
        if value is None:
            return f"{what} is computed in the graph, not a constant"
        if value.dtype != np.float32 or value.ndim != 3:
            return f"{what} is not 3-D f32"
    if _input(node, 3) is not None and const_array(_input(node, 3)) is None:
        return "B is computed in the graph, not a constant"
    if _input(node, 4) is not None:
        return "sequence_lens given (per-sequence lengths)"
    if op == "LSTM" and _input(node, 7) is not None:
        return "peepholes (P)"
    if node.inputs[0].dtype not in (None, ir.DataType.FLOAT):
        return f"X is {node.inputs[0].dtype}, not f32"
    if attribute(node, "layout", 0) != 0:
        return "layout 1 (batch first)"
    if attribute(node, "clip", None) is not None:
        return "clip"
    if op == "LSTM" and attribute(node, "input_forget", 0):
        return "input_forget"
    if op == "GRU" and not attribute(node, "linear_before_reset", 0):
        return "linear_before_reset=0: the candidate gate's product reads r⊙h, a second tensor to quantize"
    activations = attribute(node, "activations", None)
    directions = 2 if attribute(node, "direction", "forward") == "bidirectional" else 1
    if activations is not None and [a.lower() for a in activations] != [
            a.lower() for a in DEFAULT_ACTIVATIONS[op] * directions]:
        return f"activations {list(activations)}, not the default"
    if any(name in node.attributes for name in ("activation_alpha", "activation_beta")):
        return "activation_alpha/beta"
    return None


def _rewrite(graph: ir.Graph, node: ir.Node, opset: int) -> list[RecurrentScan]:
    op, base = node.op_type, node.name or node.outputs[0].name
    x = node.inputs[0]
    w, r = const_array(node.inputs[1]), const_array(node.inputs[2])
    directions, rows, hidden = w.shape[0], w.shape[1], r.shape[2]
    b = const_array(_input(node, 3))
    b = np.zeros((directions, 2 * rows), np.float32) if b is None else b.astype(np.float32)
    reverse = attribute(node, "direction", "forward") == "reverse"
    initial = {"h": _input(node, 5), "c": _input(node, 6) if op == "LSTM" else None}
    new: list[ir.Node] = []
    zeros = None
    scans, parts = [], {"Y": [], "Y_h": [], "Y_c": []}
    for d in range(directions):
        name = f"{base}/direction{d}"
        w_bias, r_bias = b[d, :rows], b[d, rows:]
        if op == "LSTM":  # both biases add to every gate
            x_bias, body_bias = w_bias + r_bias, None
        else:  # GRU, linear_before_reset: Rb of the candidate gate stays inside r ⊙ (h·Rhᵀ + Rbh)
            x_bias = w_bias + np.concatenate([r_bias[:2 * hidden], np.zeros(hidden, np.float32)])
            body_bias = r_bias[2 * hidden:]
        projections = []
        for g in range(rows // hidden):  # one MatMul per gate: the body then needs no Slice
            gate = slice(g * hidden, (g + 1) * hidden)
            projection = _node("MatMul", [x, add_constant(graph, f"{name}/W{g}_transposed",
                                                          np.ascontiguousarray(w[d, gate].T))],
                               f"{name}/input_projection{g}")
            biased = _node("Add", [projection.outputs[0], add_constant(graph, f"{name}/input_bias{g}", x_bias[gate])],
                           f"{name}/input_bias{g}")
            new += [projection, biased]
            projections.append(biased.outputs[0])
        states = []
        for key in ("h", "c") if op == "LSTM" else ("h",):
            if initial[key] is not None:
                gather = _node("Gather", [initial[key], add_constant(graph, f"{name}/index", np.int64(d))],
                               f"{name}/initial_{key}", axis=0)
                new.append(gather)
                states.append(gather.outputs[0])
            else:
                if zeros is None:
                    zeros = _zeros(graph, x, hidden, f"{base}/zero_state", new)
                states.append(zeros)
        body, matmuls = _body(op, r[d], body_bias, name)
        gates = len(projections)
        backwards = ({"scan_input_directions": [1] * gates, "scan_output_directions": [1]}
                     if reverse or d == 1 else {})
        scan = _node("Scan", [*states, *projections], f"{name}/Scan", outputs=len(states) + 1,
                     body=body, num_scan_inputs=gates, **backwards)
        new.append(scan)
        parts["Y_h"].append(scan.outputs[0])
        if op == "LSTM":
            parts["Y_c"].append(scan.outputs[1])
        parts["Y"].append(scan.outputs[-1])
        scans.append(RecurrentScan(base, op, scan, matmuls, (states[0], scan.outputs[-1])))
    for old, (key, axis) in zip(node.outputs, (("Y", 1), ("Y_h", 0), ("Y_c", 0))):
        if not (old.uses() or old.is_graph_output()):
            continue
        stacked = [_unsqueeze(graph, v, axis, opset, f"{base}/{key}_{i}", new) for i, v in enumerate(parts[key])]
        concat = _node("Concat", stacked, f"{base}/{key}", axis=axis)
        graph.insert_before(node, [*new, concat])
        new = []
        replace_value(old, concat.outputs[0])
    graph.insert_before(node, new)
    weights = [v for v in node.inputs[1:4] if v is not None]
    graph.remove(node, safe=True)
    for value in weights:  # the f32 W, R and B, unless something else reads them
        if not (value.uses() or value.is_graph_input() or value.is_graph_output()) and value.is_initializer():
            graph.initializers.pop(value.name)
    return scans


def _node(op_type: str, inputs, name: str, outputs: int = 1, **attributes) -> ir.Node:
    """A node whose f32 outputs are named after it: a body's values must not share names with the
    main graph's, and onnx_ir gives unnamed values the same default names in both."""
    values = [ir.Value(name=f"{name}/output{i}" if outputs > 1 else f"{name}/output",
                       type=ir.TensorType(ir.DataType.FLOAT)) for i in range(outputs)]
    return ir.node(op_type, inputs, attributes=attributes, name=name, outputs=values)


def _zeros(graph: ir.Graph, x: ir.Value, hidden: int, name: str, new: list) -> ir.Value:
    """[batch, hidden] zeros, batch read from X [T, batch, I] at run time."""
    shape = ir.node("Shape", [x], name=f"{name}/shape", outputs=[ir.Value(name=f"{name}/shape")])
    batch = ir.node("Gather", [shape.outputs[0], add_constant(graph, f"{name}/batch_axis", np.array([1], np.int64))],
                    attributes={"axis": 0}, name=f"{name}/batch", outputs=[ir.Value(name=f"{name}/batch")])
    size = ir.node("Concat", [batch.outputs[0], add_constant(graph, f"{name}/hidden", np.array([hidden], np.int64))],
                   attributes={"axis": 0}, name=f"{name}/size", outputs=[ir.Value(name=f"{name}/size")])
    zeros = _node("ConstantOfShape", [size.outputs[0]], name, value=ir.tensor(np.zeros(1, np.float32)))
    new += [shape, batch, size, zeros]
    return zeros.outputs[0]


def _unsqueeze(graph: ir.Graph, value: ir.Value, axis: int, opset: int, name: str, new: list) -> ir.Value:
    if opset >= 13:
        node = _node("Unsqueeze", [value, add_constant(graph, f"{name}/axes", np.array([axis], np.int64))], name)
    else:
        node = _node("Unsqueeze", [value], name, axes=[axis])
    new.append(node)
    return node.outputs[0]


def _body(op: str, r: np.ndarray, candidate_bias: np.ndarray | None, name: str) -> tuple[ir.Graph, tuple]:
    """The Scan body of one direction: (h, [c,] P_0 … P_G−1) → (h', [c',] h'), and its MatMuls h·R_gᵀ.

    ONNX's gates, P_g the input projection of gate g at this step:
        LSTM  i, o, f = σ(P + h·Rᵀ);  c̃ = tanh(P_c + h·R_cᵀ);  c' = f⊙c + i⊙c̃;  h' = o⊙tanh(c')
        GRU   z, r = σ(P + h·Rᵀ);  h̃ = tanh(P_h + r⊙(h·R_hᵀ + Rb_h));  h' = (1 − z)⊙h̃ + z⊙h
    """
    hidden = r.shape[1]
    gates = r.shape[0] // hidden
    state = ir.Shape([None, hidden])  # [batch, hidden]
    h = ir.Value(name=f"{name}/h", type=ir.TensorType(ir.DataType.FLOAT), shape=state)
    c = ir.Value(name=f"{name}/c", type=ir.TensorType(ir.DataType.FLOAT), shape=state) if op == "LSTM" else None
    p = [ir.Value(name=f"{name}/P{g}", type=ir.TensorType(ir.DataType.FLOAT), shape=state) for g in range(gates)]
    body = ir.Graph([v for v in (h, c) if v is not None] + p, [], nodes=[], name=f"{name}/body")

    def add(op_type, inputs, suffix):
        node = _node(op_type, inputs, f"{name}/{suffix}")
        body.append(node)
        return node.outputs[0]

    matmuls = []
    for g in range(gates):
        weight = np.ascontiguousarray(r[g * hidden:(g + 1) * hidden].T)
        matmuls.append(_node("MatMul", [h, add_constant(body, f"{name}/R{g}_transposed", weight)],
                             f"{name}/recurrent{g}"))
        body.append(matmuls[-1])
    product = [m.outputs[0] for m in matmuls]
    if op == "LSTM":
        i, o, f = (add("Sigmoid", [add("Add", [p[g], product[g]], f"sum{g}")], gate)
                   for g, gate in enumerate(("input_gate", "output_gate", "forget_gate")))
        candidate = add("Tanh", [add("Add", [p[3], product[3]], "sum3")], "cell_gate")
        c_next = add("Add", [add("Mul", [f, c], "keep"), add("Mul", [i, candidate], "write")], "cell")
        h_next = add("Mul", [o, add("Tanh", [c_next], "cell_tanh")], "hidden")
        outputs = [h_next, c_next]
    else:
        z, reset = (add("Sigmoid", [add("Add", [p[g], product[g]], f"sum{g}")], gate)
                    for g, gate in enumerate(("update_gate", "reset_gate")))
        recurrent = add("Add", [product[2], add_constant(body, f"{name}/recurrent_bias", candidate_bias)],
                        "recurrent_bias")
        candidate = add("Tanh", [add("Add", [p[2], add("Mul", [reset, recurrent], "reset")], "sum2")], "candidate")
        one = add_constant(body, f"{name}/one", np.float32(1))
        h_next = add("Add", [add("Mul", [add("Sub", [one, z], "keep_new"), candidate], "new"),
                             add("Mul", [z, h], "old")], "hidden")
        outputs = [h_next]
    emitted = add("Identity", [h_next], "emitted")  # the scan output: a value of its own
    for value in [*outputs, emitted]:
        value.shape = state
    body.outputs.extend([*outputs, emitted])
    return body, tuple(matmuls)


@dataclass(frozen=True)
class QuantizedRecurrence:
    """What the report says of one direction of an LSTM/GRU quantized in its Scan form."""

    op: str  # the LSTM/GRU node's name
    op_type: str
    scan: str
    hidden_low: float  # h's range, calibrated on the states it took
    hidden_high: float


def hidden_state_names(scans: list[RecurrentScan]) -> list[str]:
    """The main-graph tensors whose values the calibration pass collects for h's ranges."""
    return list(dict.fromkeys(v.name for s in scans for v in s.hidden_states))


def quantize_scans(scans: list[RecurrentScan], statistics, activations, weights) -> list[QuantizedRecurrence]:
    """Put an FQ on h and on each R_gᵀ before the body's MatMuls h·R_gᵀ, in place: h's range the union
    of the states' min/max in `statistics.hidden_states`, R_gᵀ symmetric per column (per gate row of R).
    A direction whose states had no finite value stays f32."""
    done = []
    for s in scans:
        collected = [statistics.hidden_states[v.name] for v in s.hidden_states]
        if any(c.empty for c in collected):
            logger.warning("%s: no finite hidden state in the calibration data; its recurrence stays f32", s.name)
            continue
        low = min(c.range()[0] for c in collected)
        high = max(c.range()[1] for c in collected)
        first = s.matmuls[0]
        body = first.graph
        quantized_h = activation_fake_quantize(*safe_range(low, high, s.name), activations).make_node(
            body, first.inputs[0], f"{s.scan.name}/h/fq")
        body.insert_before(first, quantized_h)
        for matmul in s.matmuls:
            weight = weight_fake_quantize(const_array(matmul.inputs[1]), 1, weights).make_node(
                body, matmul.inputs[1], f"{matmul.name}/weight/fq")
            body.insert_before(matmul, weight)
            matmul.replace_input_with(0, quantized_h.outputs[0])
            matmul.replace_input_with(1, weight.outputs[0])
        done.append(QuantizedRecurrence(s.op, s.op_type, s.scan.name, low, high))
    return done
