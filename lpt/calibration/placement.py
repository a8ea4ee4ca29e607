"""Which tensors get a FakeQuantize, and where (NNCF-style quantizer propagation).

    Conv/ConvTranspose/MatMul/Gemm     FQ on the activation input(s) and the weight (per output channel)
    Add/Mul of two quantized branches   FQ on both inputs (not where both are functions of one
                                        tensor: x·x, a tanh-GELU's x + c·x³)
    Concat feeding quantized consumers  FQ on each input, one range shared by all of them

An activation request moves up through precision-preserving ops (MaxPool, Reshape, Flatten,
…) while every use of what it passes through wants the FQ too, so that a branch gets one FQ
(Conv→Relu→MaxPool→Flatten→Gemm: one FQ on the Relu output serves the Gemm). It never moves
above a Relu/Clip (the FQ quantizes their output), onto a constant (an embedding table stays
f32), or off a model output. An FQ applies to the uses that asked for it only, so a model
output or an f32 consumer of the same tensor keeps reading the float value.

Transformer blocks stay f32 by default, each node listed in `skipped` with the reason
(transformer_blocks): Softmax, LayerNormalization and the ReduceMean/Sub/Pow/Sqrt/Div chain
exporters write for it, and Erf-GELU (Div/Erf/Add/Mul). Their outputs are still quantized where
a MatMul reads them; the attention MatMuls of two activations (Q·Kᵀ, attn·V) run int8.

Audio front ends keep their power spectrum in f32 (spectral_power): the Conv/MatMul whose output
is squared and summed (an STFT's re² + im²), and the layers reading that sum or its root before a
Log (a mel filterbank, a first encoder Conv). Layers after the Log are quantized as usual.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from dataclasses import dataclass

import onnx_ir as ir

from lpt.errors import QuantizationError
from lpt.graph.constants import const_array
from lpt.graph.ops import PRECISION_PRESERVING_OPS, QUANTIZABLE_OPS, attribute

logger = logging.getLogger(__name__)

ELEMENTWISE_OPS = ("Add", "Mul")
# Ops whose output lives on the integer grid of their quantized input, for the
# "comes from a quantized branch" test of Add/Mul.
_BRANCH_OPS = ("Relu", "Clip", "Concat")
_AFFINE_OPS = ("Add", "Sub", "Mul", "Div")  # with a constant: a bias or a scale on the layer's output

ACTIVATION, WEIGHT = "activation", "weight"

Use = tuple[ir.Node, int]  # (consumer node, input index)


@dataclass(frozen=True, eq=False)
class QuantizationPoint:
    """One FakeQuantize: on `value`, read by the `uses` listed (not necessarily all of its uses).

    Weights carry their output-channel `axis` (None: per tensor); activations that must share
    one range (the inputs of a Concat) carry the same `group`.
    """

    value: ir.Value
    kind: str  # ACTIVATION or WEIGHT
    uses: tuple[Use, ...]
    axis: int | None = None
    group: int | None = None

    @property
    def name(self) -> str:
        return self.value.name


@dataclass(frozen=True)
class Skipped:
    """A node left in f32, and why."""

    node: str
    op_type: str
    reason: str


@dataclass(frozen=True, eq=False)
class Placement:
    points: tuple[QuantizationPoint, ...]
    skipped: tuple[Skipped, ...]
    layers: tuple[ir.Node, ...]  # the Conv/ConvTranspose/MatMul/Gemm nodes that read FQs

    @property
    def activations(self) -> tuple[QuantizationPoint, ...]:
        return tuple(p for p in self.points if p.kind == ACTIVATION)

    @property
    def weights(self) -> tuple[QuantizationPoint, ...]:
        return tuple(p for p in self.points if p.kind == WEIGHT)


class IgnoreRules:
    """`ignore` entries: a node name, ``re:REGEX`` (searched in the node name), or an op type."""

    def __init__(self, patterns=()):
        self.patterns = tuple(patterns)
        self._regexes = {}
        for p in self.patterns:
            if p.startswith("re:"):
                try:
                    self._regexes[p] = re.compile(p[3:])
                except re.error as err:
                    raise QuantizationError(f"ignore pattern {p!r} is not a valid regex: {err}") from None

    def matches(self, pattern: str, node: ir.Node) -> bool:
        if pattern in self._regexes:
            return bool(node.name) and self._regexes[pattern].search(node.name) is not None
        return pattern in (node.name, node.op_type)

    def match(self, node: ir.Node) -> str | None:
        """The first pattern that ignores `node`, or None."""
        return next((p for p in self.patterns if self.matches(p, node)), None)

    def unused(self, graph: ir.Graph) -> list[str]:
        return [p for p in self.patterns if not any(self.matches(p, n) for n in graph)]


def place(model: ir.Model, ignore=()) -> Placement:
    """The FakeQuantizes `model` needs (nothing is inserted: see insertion.insert)."""
    return _Placer(model.graph, IgnoreRules(ignore)).run()


class _Placer:
    def __init__(self, graph: ir.Graph, rules: IgnoreRules):
        self.graph, self.rules = graph, rules
        self.requests: dict[ir.Value, list[tuple[ir.Node, int, int]]] = defaultdict(list)  # use + group token
        self.parent: list[int] = []  # union-find over tokens (Concat groups)
        self.weights: dict[tuple[ir.Value, int | None], list[Use]] = {}
        self.skipped: list[Skipped] = []
        self.ignored: set[ir.Node] = set()
        self.quantized: set[ir.Node] = set()  # nodes that read FQs: their outputs are quantized branches
        self.layers: list[ir.Node] = []

    def run(self) -> Placement:
        for pattern in self.rules.unused(self.graph):
            logger.warning("ignore pattern %r matches no node", pattern)
        kept_f32 = transformer_blocks(self.graph) | spectral_power(self.graph)
        for node in self.graph:
            pattern = self.rules.match(node)
            if pattern is not None:
                self.ignored.add(node)
                self.skipped.append(Skipped(node.name, node.op_type, f"ignored ({pattern})"))
            elif node in kept_f32:
                self._skip(node, kept_f32[node])  # never an FQ pair on a GELU's Mul, say
            elif node.domain in ("", "ai.onnx") and node.op_type in QUANTIZABLE_OPS:
                self._layer(node)
            elif node.domain in ("", "ai.onnx") and node.op_type in ELEMENTWISE_OPS:
                self._elementwise(node)
        self._propagate()
        return Placement(tuple(self._points()), tuple(self.skipped), tuple(self.layers))

    # -- requests

    def _token(self) -> int:
        self.parent.append(len(self.parent))
        return len(self.parent) - 1

    def _find(self, t: int) -> int:
        while self.parent[t] != t:
            self.parent[t] = self.parent[self.parent[t]]
            t = self.parent[t]
        return t

    def _union(self, a: int, b: int) -> None:
        self.parent[self._find(a)] = self._find(b)

    def _request(self, node: ir.Node, index: int) -> None:
        self.requests[node.inputs[index]].append((node, index, self._token()))

    def _skip(self, node: ir.Node, reason: str) -> None:
        self.skipped.append(Skipped(node.name, node.op_type, reason))

    def _layer(self, node: ir.Node) -> None:
        op = node.op_type
        a, b = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
        if a is None or b is None:
            return self._skip(node, "an input is missing")
        for v in (a, b):
            if not _is_float(v):
                return self._skip(node, f"input {v.name!r} is {v.dtype}, not float32")
        a_const, b_const = const_array(a) is not None, const_array(b) is not None
        if a_const and b_const:
            return self._skip(node, "both inputs are constants (fold them instead)")
        if op == "MatMul":
            for index, (v, is_const) in enumerate(((a, a_const), (b, b_const))):
                if is_const:
                    self._weight(node, index, _matmul_axis(const_array(v), index))
                else:
                    self._request(node, index)  # both activations: attention scores, context
        else:
            if a_const:
                return self._skip(node, "the data input is a constant")
            if not b_const:
                return self._skip(node, "the weight is not a constant")
            self._request(node, 0)
            self._weight(node, 1, _weight_axis(node, const_array(b)))
        self.quantized.add(node)
        self.layers.append(node)

    def _weight(self, node: ir.Node, index: int, axis: int | None) -> None:
        self.weights.setdefault((node.inputs[index], axis), []).append((node, index))

    def _elementwise(self, node: ir.Node) -> None:
        inputs = list(node.inputs)
        if len(inputs) != 2 or any(v is None or const_array(v) is not None for v in inputs):
            return  # a bias or a scale: nothing to quantize
        if not all(_is_float(v) for v in inputs):
            return self._skip(node, "an input is not float32")
        for v in inputs:
            if not self._from_quantized_branch(v):
                return self._skip(node, f"input {v.name!r} does not come from a quantized branch")
        source = _pointwise_source(inputs[0])
        if source is _pointwise_source(inputs[1]):
            return self._skip(node, f"both inputs are functions of {source.name!r} (x·x, x + c·x³): "
                                    "an int8 product of one tensor with itself gains no speed and costs accuracy")
        self._request(node, 0)
        self._request(node, 1)
        self.quantized.add(node)

    def _from_quantized_branch(self, value: ir.Value) -> bool:
        """`value` is a quantized layer's output, up through precision-preserving ops, Relu/Clip, Concat
        (all of its inputs) and a constant bias or scale (MatMul → Add(bias) is still the layer's output)."""
        node = value.producer()
        while node is not None and node not in self.quantized:
            if node in self.ignored:
                return False
            if node.op_type == "Concat":
                return all(v is not None and self._from_quantized_branch(v) for v in node.inputs)
            data = _affine_input(node) if node.op_type in _AFFINE_OPS else 0
            if data is None or node.op_type not in PRECISION_PRESERVING_OPS + _BRANCH_OPS + _AFFINE_OPS:
                return False
            if not node.inputs or node.inputs[data] is None:
                return False
            node = node.inputs[data].producer()
        return node is not None

    # -- propagation

    def _propagate(self) -> None:
        """Move requests up through precision-preserving ops (and Concat) until none moves."""
        moved = True
        while moved:
            moved = False
            for value in list(self.requests):
                if value in self.requests and self._try_move_up(value):
                    moved = True

    def _try_move_up(self, value: ir.Value) -> bool:
        node = value.producer()
        if node is None or node in self.ignored or node.graph is not self.graph:
            return False
        data = _data_inputs(node)
        if not data:
            return False
        if any(v is None or const_array(v) is not None or not _is_float(v) for v in (node.inputs[i] for i in data)):
            return False
        for out in node.outputs:  # every use of every output (an unused one aside) asks for the FQ
            if out.is_graph_output():
                return False
            uses = {(u.node, u.idx) for u in out.uses()}
            if uses != {(n, i) for n, i, _ in self.requests.get(out, ())}:
                return False
        token = self._token()  # ties the requests that moved: through a Concat, its inputs become one group
        for out in node.outputs:
            for _, _, t in self.requests.pop(out, ()):
                self._union(t, token)
        for i in data:
            self.requests[node.inputs[i]].append((node, i, token))
        return True

    def _points(self) -> list[QuantizationPoint]:
        points = []
        group_of = {}
        for uses in self.requests.values():
            tokens = [t for _, _, t in uses]
            for t in tokens[1:]:
                self._union(tokens[0], t)
        roots = [self._find(uses[0][2]) for uses in self.requests.values()]
        sizes = defaultdict(int)
        for r in roots:
            sizes[r] += 1
        for (value, uses), root in zip(self.requests.items(), roots):
            if sizes[root] > 1:
                group_of.setdefault(root, len(group_of))
            group = group_of.get(root)
            points.append(QuantizationPoint(value, ACTIVATION, tuple(dict.fromkeys((n, i) for n, i, _ in uses)),
                                            group=group))
        for (value, axis), uses in self.weights.items():
            points.append(QuantizationPoint(value, WEIGHT, tuple(uses), axis=axis))
        return points


# -- spectral power left in f32

# A power or magnitude spectrum (re² + im², its square root, a mel sum of it) spans many orders of
# magnitude: on an 8-bit linear grid sized by the loudest bin the quiet bins round to 0 (or get a relative
# error of 100%), and a log of them, or the layer that reads them, sees nothing of what the fp32 model
# sees. Measured on the corpus (bench/real_models.py): oww_melspectrogram's mel MatMul and STFT Convs
# quantized gave −2.4 dB at its output, 0.9 dB with the STFT alone; silero_vad_16k_op15's state 3.4 dB
# with its STFT Conv and first encoder Conv quantized, 13 dB with both in f32 (either alone: 3.3, 5.4);
# dnsmos_sig_bak_ovr (STFT, √(re² + im²), Log, then a CNN) 8.8 dB, 41 dB with its two STFT Convs in f32.
# What is left f32 is the front end only: the layers after the Log, or after the first reader, stay int8.
_SPECTRAL_TRANSFORM = "spectral power: the transform whose output is squared stays f32 (a power spectrum's quiet " \
                      "bins are lost on an 8-bit grid)"
_SPECTRAL_READER = "spectral power: a layer reading a power or magnitude spectrum stays f32 (its quiet bins are " \
                   "lost on an 8-bit grid)"
# Between the transform and the square: ops that move or scale its values (real and imaginary halves sliced
# out of one Conv's output, a window or a normalisation constant).
_TO_SQUARE_OPS = ("Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Slice", "Split", "Gather",
                  "Identity", "Concat", "Neg", "Cast", "Mul", "Div")
# After the square, up to the log or the layer: sums of squares, roots, floors, scales and moves.
_POWER_OPS = ("Add", "Sub", "Mul", "Div", "Sqrt", "Pow", "ReduceSum", "ReduceMean", "Clip", "Max", "Min", "Relu",
              "Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Slice", "Gather", "Identity", "Concat",
              "Cast")


def spectral_power(graph: ir.Graph) -> dict[ir.Node, str]:
    """The layers around a power spectrum, each with why it stays f32: the Conv/MatMul whose output is
    squared and summed (re² + im², or a ReduceSum over the pair), and the layers that read that sum (or its
    root, its mel projection...) before any Log. Only when the sum reaches a Log or a layer: an L2 norm
    (x / √Σx²) squares a layer's output too, but divides by the sum, and is left alone."""
    kept: dict[ir.Node, str] = {}
    for node in graph:
        x = _squared(node)
        if x is None:
            continue
        readers, summed, logged = _power_uses(node.outputs[0])
        if not summed or not (readers or logged):
            continue
        for layer in _transforms_of(x):
            kept.setdefault(layer, _SPECTRAL_TRANSFORM)
        for layer in readers:
            kept.setdefault(layer, _SPECTRAL_READER)
    return kept


def _squared(node: ir.Node) -> ir.Value | None:
    """x when `node` is x² (Pow(x, 2) or Mul(x, x)), else None."""
    if node.domain not in ("", "ai.onnx") or len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return None
    if node.op_type == "Mul" and node.inputs[0] is node.inputs[1] and const_array(node.inputs[0]) is None:
        return node.inputs[0]
    if node.op_type == "Pow":
        exponent = const_array(node.inputs[1])
        if exponent is not None and exponent.size == 1 and float(exponent.reshape(-1)[0]) == 2.0:
            return node.inputs[0]
    return None


def _power_uses(power: ir.Value) -> tuple[list[ir.Node], bool, bool]:
    """(layers reading `power` through _POWER_OPS, whether it is summed on the way, whether a Log reads it)."""
    readers, summed, logged = [], False, False
    pending, seen = [power], set()
    while pending:
        value = pending.pop()
        if value in seen or value.is_graph_output():
            continue
        seen.add(value)
        for use in value.uses():
            node = use.node
            if node.domain not in ("", "ai.onnx"):
                continue
            if node.op_type == "Log":
                logged = True
            elif node.op_type in QUANTIZABLE_OPS:
                if node not in readers and const_array(node.inputs[use.idx]) is None:
                    readers.append(node)
            elif node.op_type in _POWER_OPS:
                data = [v for v in node.inputs if v is not None and const_array(v) is None]
                if node.op_type in ("Add", "Sub", "Mul", "Div", "Max", "Min") and len(data) > 1:
                    if node.op_type != "Add":
                        continue  # a product or ratio of two tensors (an L2 norm's x / √Σx²): not a power any more
                    summed = True  # re² + im²
                summed |= node.op_type in ("ReduceSum", "ReduceMean")
                pending += [out for out in node.outputs if out is not None]
    return readers, summed, logged


def _transforms_of(x: ir.Value) -> list[ir.Node]:
    """The Conv/MatMul/Gemm layers `x` comes from through _TO_SQUARE_OPS (a constant scale at most)."""
    found, pending, seen = [], [x], set()
    while pending:
        value = pending.pop()
        node = value.producer() if value is not None else None
        if node is None or node in seen or node.domain not in ("", "ai.onnx"):
            continue
        seen.add(node)
        if node.op_type in QUANTIZABLE_OPS:
            found.append(node)
        elif node.op_type in _TO_SQUARE_OPS:
            data = [v for v in node.inputs if v is not None and const_array(v) is None]
            if node.op_type in ("Mul", "Div") and len(data) != 1:
                continue  # a product of two tensors is not a scaled transform
            pending += data if node.op_type == "Concat" else data[:1]
    return found


# -- transformer blocks left in f32

_SOFTMAX = "transformer default: Softmax stays f32 (exp and a row sum need float range)"
_LAYER_NORM = "transformer default: LayerNorm stays f32 (mean and variance need float range)"
_LAYER_NORM_CHAIN = "transformer default: LayerNorm (ReduceMean/Sub/Pow/Sqrt/Div) stays f32 (mean and variance " \
                    "need float range)"
_GELU = "transformer default: Erf-GELU stays f32 (Erf has no int8 form)"
_VARIANCE_OPS = ("Pow", "Mul", "ReduceMean", "Add", "Sqrt", "Reciprocal", "Cast")


def transformer_blocks(graph: ir.Graph) -> dict[ir.Node, str]:
    """The nodes of Softmax, LayerNorm (op or chain) and Erf-GELU blocks, each with why it stays f32."""
    kept: dict[ir.Node, str] = {}
    for node in graph:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "Softmax":
            kept[node] = _SOFTMAX
        elif node.op_type == "LayerNormalization":
            kept[node] = _LAYER_NORM
        elif node.op_type == "Sub":
            kept.update(dict.fromkeys(_layer_norm_chain(node), _LAYER_NORM_CHAIN))
        elif node.op_type == "Erf":
            kept.update(dict.fromkeys(_erf_gelu(node), _GELU))
    return kept


def _layer_norm_chain(sub: ir.Node) -> list[ir.Node]:
    """x − ReduceMean(x) → ÷ (or ×) a chain of Pow/ReduceMean/Add/Sqrt/Reciprocal of it, then × γ + β."""
    x, mean = ([*sub.inputs, None, None])[:2]
    reduce = mean.producer() if mean is not None else None
    if x is None or reduce is None or reduce.op_type != "ReduceMean" or reduce.inputs[0] is not x:
        return []
    centered = sub.outputs[0]
    for use in centered.uses():
        norm = use.node
        if norm.op_type not in ("Div", "Mul") or len(norm.inputs) != 2 or use.idx != 0:
            continue
        chain = _variance_of(norm.inputs[1], centered)
        if chain:
            nodes = [reduce, sub, *chain, norm]
            for op in ("Mul", "Add"):  # γ then β, when the exporter wrote them apart
                out = nodes[-1].outputs[0]
                uses = out.uses()
                if len(uses) == 1 and uses[0].node.op_type == op and _affine_input(uses[0].node) is not None:
                    nodes.append(uses[0].node)
            return nodes
    return []


def _variance_of(value: ir.Value, centered: ir.Value) -> list[ir.Node]:
    """The nodes computing `value` from `centered` and constants only, through _VARIANCE_OPS ([]: not so)."""
    nodes, stack, reached = [], [value], False
    while stack:
        v = stack.pop()
        if v is centered:
            reached = True
            continue
        if v is None or const_array(v) is not None:
            continue
        node = v.producer()
        if node is None or node.op_type not in _VARIANCE_OPS or len(nodes) > 8:
            return []
        if node not in nodes:
            nodes.append(node)
            stack.extend(node.inputs)
    return nodes[::-1] if reached else []


def _erf_gelu(erf: ir.Node) -> list[ir.Node]:
    """x · (Erf(x / √2) + 1) · 0.5, in the orders exporters write it (the 0.5 on x, or on the product)."""
    scale = erf.inputs[0].producer() if erf.inputs and erf.inputs[0] is not None else None
    if scale is None or scale.op_type not in ("Div", "Mul") or _affine_input(scale) is None:
        return []
    x = scale.inputs[_affine_input(scale)]
    uses = erf.outputs[0].uses()
    if len(uses) != 1 or uses[0].node.op_type != "Add" or _affine_input(uses[0].node) is None:
        return []
    plus_one = uses[0].node
    for use in plus_one.outputs[0].uses():
        mul = use.node
        if mul.op_type != "Mul" or len(mul.inputs) != 2:
            continue
        other = mul.inputs[1 - use.idx]
        half = other.producer() if other is not x and other is not None else None
        if other is not x and not (half is not None and half.op_type in ("Mul", "Div")
                                   and _affine_input(half) is not None and half.inputs[_affine_input(half)] is x):
            continue
        nodes = [scale, erf, plus_one] + ([half] if half is not None else []) + [mul]
        after = mul.outputs[0].uses()
        if half is None and len(after) == 1 and after[0].node.op_type in ("Mul", "Div") \
                and _affine_input(after[0].node) is not None:
            nodes.append(after[0].node)  # the 0.5 on the product
        return nodes
    return []


def _data_inputs(node: ir.Node) -> list[int]:
    """The inputs a precision-preserving op copies values from (empty: not precision-preserving)."""
    op = node.op_type
    if node.domain not in ("", "ai.onnx"):
        return []
    if op == "Concat":
        return list(range(len(node.inputs)))
    if op not in PRECISION_PRESERVING_OPS or not node.inputs:
        return []
    if op == "Resize" and attribute(node, "mode", "nearest") != "nearest":
        return []
    if op == "Pad" and not _pads_with_zero(node):
        return []
    if op == "MaxPool" and len(node.outputs) > 1 and node.outputs[1].uses():
        return []  # the Indices output is not a quantized tensor
    return [0]


def _pads_with_zero(node: ir.Node) -> bool:
    if attribute(node, "mode", "constant") != "constant":
        return True  # edge/reflect/wrap copy existing values
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        value = const_array(node.inputs[2])
        return value is not None and not value.any()
    return "value" not in node.attributes or node.attributes["value"].value == 0.0


def _pointwise_source(value: ir.Value, depth: int = 0) -> ir.Value:
    """The tensor `value` is computed from alone, through constant scales and biases and Add/Mul of
    such functions of it (x → c·x → x·(c·x) in a tanh-GELU's x + 0.044715·x³); else `value` itself."""
    node = value.producer()
    if node is None or depth > 16 or node.op_type not in _AFFINE_OPS:
        return value
    data = _affine_input(node)
    if data is not None:
        return _pointwise_source(node.inputs[data], depth + 1)
    if node.op_type in ELEMENTWISE_OPS and len(node.inputs) == 2 and all(v is not None for v in node.inputs):
        first, second = (_pointwise_source(v, depth + 1) for v in node.inputs)
        if first is second:
            return first
    return value


def _affine_input(node: ir.Node) -> int | None:
    """The activation input of an Add/Sub/Mul/Div whose other input is a constant, else None."""
    if len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return None
    constant = [const_array(v) is not None for v in node.inputs]
    if constant == [False, True]:
        return 0
    if constant == [True, False] and node.op_type in ("Add", "Mul"):
        return 1
    return None


def _is_float(value: ir.Value) -> bool:
    return value.dtype is None or value.dtype == ir.DataType.FLOAT


def _weight_axis(node: ir.Node, weight) -> int | None:
    """The output-channel axis of a Conv/ConvTranspose/Gemm weight."""
    if weight.ndim < 2:
        return None
    if node.op_type == "Conv":
        return 0  # [OC, IC/g, k...]
    if node.op_type == "ConvTranspose":
        return 1  # [IC, OC/g, k...]
    return 0 if attribute(node, "transB", 0) else 1  # Gemm: B is [K, N], or [N, K] transposed


def _matmul_axis(weight, index: int) -> int | None:
    """MatMul: B's output columns are its last axis; a constant A's output rows its second-to-last."""
    if weight.ndim < 2:
        return None
    return weight.ndim - 1 if index == 1 else weight.ndim - 2
