"""Reading an int8 graph's fused chains into data (lpt.backend.step), once, for everyone who needs them.

    ConvInteger|lpt::ConvTransposeInteger|MatMulInteger → Cast → Mul(m) [→ Add(bias)]
        [→ Relu|Clip|LeakyRelu|Max|Min|Sigmoid|SiLU|HardSwish|GELU|lpt::FakeQuantize]*
        [→ QuantizeLinear|lpt::Quantize]                                               an Int8Layer
    (Max and Min with one scalar constant, which are clips; SiLU's Sigmoid and Mul by x, _silu_of;
    a HardSwish node, or a HardSigmoid and a Mul by x, _hard_swish_of; GELU's five ops, read_gelu.)
    QuantizeLinear, lpt::Quantize with constant parameters                             a Quantization

A chain is followed only through values with a single reader that is not a graph output: what
it fuses away is then never needed by anyone else. Identity nodes between its links belong to it.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from lpt import kernels
from lpt.backend.step import Int8Layer, Quantization
from lpt.graph.constants import const_array
from lpt.graph.fake_quantize_op import read_fake_quantize
from lpt.graph.ops import attribute
from lpt.kernels.float_ops import HARD_SWISH_ALPHA, HARD_SWISH_BETA
from lpt.numerics.levels import level_range

INTEGER_TYPES = (ir.DataType.UINT8, ir.DataType.INT8)
POST_OPS = ("Relu", "Clip", "LeakyRelu", "Max", "Min", "Sigmoid", "HardSwish")
_ACCUMULATING = {"ConvInteger": "conv", "MatMulInteger": "matmul", "ConvTransposeInteger": "conv_transpose"}


def only_consumer(value: ir.Value, op_types: tuple[str, ...], domain: str = "") -> ir.Node | None:
    """The one node reading `value`, if it is one of `op_types` and `value` is not a graph output."""
    users = list(value.consumers())
    if len(users) != 1 or value.is_graph_output():
        return None
    node = users[0]
    return node if node.op_type in op_types and node.domain in (domain, "ai.onnx" if domain == "" else domain) else None


def optional_constant(node: ir.Node, index: int) -> np.ndarray | None:
    """An optional constant input (absent → 0); None when it is present but not constant."""
    if len(node.inputs) <= index or node.inputs[index] is None:
        return np.zeros((), np.int32)
    return const_array(node.inputs[index])


def is_quantize(node: ir.Node) -> bool:
    return (node.op_type, node.domain) in (("QuantizeLinear", ""), ("QuantizeLinear", "ai.onnx"), ("Quantize", "lpt"))


def read_quantization(node: ir.Node) -> Quantization | None:
    """The Quantization of a QuantizeLinear or lpt::Quantize node whose parameters are constant, or None."""
    if node.domain == "lpt":
        low, high = const_array(node.inputs[1]), const_array(node.inputs[2])
        if low is None or high is None:
            return None
        levels = attribute(node, "levels")
        qmin, qmax = level_range(levels, ir.DataType(attribute(node, "to")) == ir.DataType.INT8)
        scale = (high - low) / np.float32(levels - 1)
        return Quantization(scale, qmin - low / scale, qmin, qmax,
                            fake_quantize=kernels.fq_input_affine(low, high, levels))
    scale = const_array(node.inputs[1])
    zero_point = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else np.uint8(0)
    if scale is None or zero_point is None:
        return None
    info = np.iinfo(zero_point.dtype)
    axis = attribute(node, "axis", 1) if scale.size > 1 else None
    return Quantization(scale, zero_point, int(info.min), int(info.max), axis)


def quantized_next(value: ir.Value) -> tuple[ir.Node, Quantization] | None:
    """(node, its Quantization) when `value` is quantized next, by QuantizeLinear or lpt::Quantize, and only read there."""
    node = only_consumer(value, ("QuantizeLinear",)) or only_consumer(value, ("Quantize",), domain="lpt")
    quantization = read_quantization(node) if node is not None else None
    return (node, quantization) if quantization is not None else None


def read_int8_layer(node: ir.Node) -> tuple[Int8Layer, list[ir.Node]] | None:
    """The Int8Layer starting at an integer ConvInteger / MatMulInteger / lpt::ConvTransposeInteger, and
    the nodes it covers; None when its zero points are not constant or its types are not 8-bit."""
    op = _ACCUMULATING.get(node.op_type)
    if op is None or node.domain not in (("lpt",) if op == "conv_transpose" else ("", "ai.onnx")):
        return None
    x, w = node.inputs[0], node.inputs[1]
    src_zp, weight_zp = optional_constant(node, 2), optional_constant(node, 3)
    weights = const_array(w)
    if src_zp is None or weight_zp is None or x.dtype not in INTEGER_TYPES or w.dtype not in INTEGER_TYPES:
        return None
    if weights is None and op != "matmul":
        return None
    layer = dict(op=op, weights=weights, src_zero_point=src_zp, weight_zero_point=weight_zp,
                 attributes={name: attr.value for name, attr in node.attributes.items()})
    nodes = [node]
    cast, between = _next(node.outputs[0], ("Cast",))
    mul, more = _next(cast.outputs[0], ("Mul",)) if cast else (None, [])
    multiplier = const_array(mul.inputs[1]) if mul else None
    if multiplier is None:  # the accumulator itself is wanted
        return Int8Layer(**layer), nodes
    axis = -1 if op == "matmul" else 1
    nodes += between + [cast] + more + [mul]
    layer["multiplier"] = _channel_vector(multiplier, axis)
    last = mul
    add, between = _next(mul.outputs[0], ("Add",))
    read = between[-1].outputs[0] if between else mul.outputs[0]
    bias_value = next((v for v in add.inputs if v is not read), None) if add is not None else None
    if bias_value is not None and const_array(bias_value) is not None:  # either side: Add commutes
        layer["bias"] = _channel_vector(const_array(bias_value), axis)
        nodes += between + [add]
        last = add
    post_ops = []
    while True:
        next_op, between = _next(last.outputs[0], POST_OPS)
        if next_op is None:
            next_op, between = _next(last.outputs[0], ("FakeQuantize",), "lpt")
        read = between[-1].outputs[0] if between else last.outputs[0]
        if next_op is None and (fused := _gelu_of(read) or _silu_of(read) or _hard_swish_of(read)) is not None:
            post_ops.append(fused[0])
            nodes += between + fused[1]
            last = fused[1][-1]
            continue
        if next_op is None or (post_op := read_post_op(next_op, read)) is None:
            break
        post_ops.append(post_op)
        nodes += between + [next_op]
        last = next_op
    layer["post_ops"] = tuple(post_ops)
    _, between = _next(last.outputs[0], ())
    if (destination := quantized_next(between[-1].outputs[0] if between else last.outputs[0])) is not None:
        nodes += between + [destination[0]]
        layer["destination"] = destination[1]
    return Int8Layer(**layer), nodes


def _next(value: ir.Value, op_types: tuple[str, ...], domain: str = "") -> tuple[ir.Node | None, list[ir.Node]]:
    """The one node reading `value` if it is one of `op_types` (only_consumer), looking past Identity
    nodes alone in between (Paddle's exports leave them inside a layer's chain), and those Identities."""
    identities = []
    while (identity := only_consumer(value, ("Identity",))) is not None:
        identities.append(identity)
        value = identity.outputs[0]
    return only_consumer(value, op_types, domain), identities


def _channel_vector(array: np.ndarray, axis: int) -> np.ndarray:
    """A constant shaped to broadcast per channel ([1, C, 1, 1] or [N]) as the kernels' 1-D vector (or a scalar)."""
    if array.size == 1:
        return array.reshape(())
    return array.reshape(-1) if axis == -1 or array.ndim == 1 else array.reshape(array.shape[1])


def read_post_op(node: ir.Node, value: ir.Value | None = None) -> kernels.PostOp | None:
    """The output-stage post-op a node reading `value` stands for, or None."""
    if node.domain == "lpt":  # an FQ that could not be split: OpenVINO's FQ post-op chain
        fq = read_fake_quantize(node)
        if fq is None or fq.scale is not None:
            return None
        return kernels.FakeQuantize(fq.input_low, fq.input_high, fq.output_low, fq.output_high, fq.levels)
    if node.op_type == "Relu":
        return kernels.Relu()
    if node.op_type == "LeakyRelu":
        return kernels.LeakyRelu(node.attributes["alpha"].as_float() if "alpha" in node.attributes else 0.01)
    if node.op_type == "Sigmoid":
        return kernels.Sigmoid()
    if node.op_type == "HardSwish":
        return kernels.HardSwish(float(HARD_SWISH_ALPHA), float(HARD_SWISH_BETA))
    if node.op_type == "Clip":
        low, high = _optional_bound(node, 1, -np.inf), _optional_bound(node, 2, np.inf)
        if low is not None and high is not None:
            return kernels.Clip(float(low), float(high))
    if node.op_type in ("Max", "Min") and len(node.inputs) == 2 and value is not None:
        # max(x, c) is a clip below at c, min(x, c) one above, where c is one constant that does not
        # widen x's shape (TensorFlow exports write a ReLU6 or a floor this way)
        other = node.inputs[1] if node.inputs[0] is value else node.inputs[0]
        bound = const_array(other)
        rank = len(value.shape) if value.shape is not None else None
        if bound is None or bound.size != 1 or (bound.ndim > 1 and (rank is None or bound.ndim > rank)):
            return None
        c = float(np.float32(bound.reshape(())))
        return kernels.Clip(c, np.inf) if node.op_type == "Max" else kernels.Clip(-np.inf, c)
    return None


def read_gelu(div: ir.Node) -> tuple[kernels.Gelu, list[ir.Node]] | None:
    """Div(x, d) → Erf → Add(1) → Mul(x) → Mul(0.5), as PaddlePaddle's exporter writes GELU, with the same
    float32 operations in the same order as kernels.Gelu (an Add's or a Mul's operands in either order: both
    are commutative, bit for bit): the Gelu and its five nodes, or None for any other shape of it."""
    x, divisor = div.inputs[0], _scalar(div.inputs[1])
    chain = [div]
    for op_type in ("Erf", "Add", "Mul", "Mul"):
        chain.append(only_consumer(chain[-1].outputs[0], (op_type,)))
        if chain[-1] is None:
            return None
    _, erf_node, add, multiply, halve = chain
    if divisor is None:
        return None
    one = _scalar(add.inputs[1] if add.inputs[0] is erf_node.outputs[0] else add.inputs[0])
    other = multiply.inputs[1] if multiply.inputs[0] is add.outputs[0] else multiply.inputs[0]
    half = _scalar(halve.inputs[1] if halve.inputs[0] is multiply.outputs[0] else halve.inputs[0])
    if one is None or half is None or other is not x or halve.outputs[0].dtype != ir.DataType.FLOAT:
        return None
    return kernels.Gelu(divisor, one, half), chain


def read_tanh_gelu(cube: ir.Node) -> tuple[tuple[float, float, float, float], ir.Value, list[ir.Node]] | None:
    """Mul(c, x) → Mul(x) → Mul(x) → Add(x) → Mul(r) → Tanh → Add(1) → Mul(0.5) → Mul(x), GELU's tanh
    approximation as jax2tf writes it, with the same float32 operations in the same order as
    kernels.tanh_gelu (a Mul's or an Add's operands in either order): (c, r, 1, 0.5), x and the nine
    nodes, or None for any other shape of it. Its constants have no more axes than x: the result has x's shape."""
    if cube.op_type != "Mul" or len(cube.inputs) != 2:
        return None
    x, factor = (cube.inputs[1], cube.inputs[0]) if _scalar(cube.inputs[0]) is not None else cube.inputs
    chain = [cube]
    for op_type in ("Mul", "Mul", "Add"):  # x·(c·x), x·(x·(c·x)), x + x·(x·(c·x))
        node = only_consumer(chain[-1].outputs[0], (op_type,))
        if node is None or {id(v) for v in node.inputs} != {id(x), id(chain[-1].outputs[0])}:
            return None
        chain.append(node)
    constants = [factor]
    for op_type in ("Mul", "Tanh", "Add", "Mul"):  # ·r, tanh, 1 +, ·0.5
        node = only_consumer(chain[-1].outputs[0], (op_type,))
        if node is None:
            return None
        if op_type != "Tanh":
            constants.append(node.inputs[1] if node.inputs[0] is chain[-1].outputs[0] else node.inputs[0])
        chain.append(node)
    last = only_consumer(chain[-1].outputs[0], ("Mul",))
    if last is None or {id(v) for v in last.inputs} != {id(x), id(chain[-1].outputs[0])} or \
            last.outputs[0].dtype != ir.DataType.FLOAT or x.shape is None:
        return None
    values = [_scalar(c) for c in constants]
    if any(v is None for v in values) or any(len(c.shape or ()) > len(x.shape) for c in constants):
        return None
    return tuple(values), x, chain + [last]


def read_moment_layer_norm(sum_x: ir.Node) -> tuple[tuple, ir.Value, list[ir.Node], list[ir.Node]] | None:
    """jax2tf's LayerNorm (flax's) over axis 1 of x [N, C, T] or [N, C], from ReduceSum(x), as
    kernels.moment_layer_norm computes it, op for op (a Mul's or an Add's operands in either order):

        m = ReduceSum(x)·f, Max(0, ReduceSum(x·x)·f − m·m) → Reshape → Expand → + ε → Sqrt → Reciprocal → ·γ
        (x − Expand(Reshape(m)))·that + β        (sums keepdims 0; the Reshapes and Expands to [N, 1, T])

    ((f, ε, γ [C], β [C]), x, the nineteen nodes, and the Reshapes and Expands whose shapes the run must
    check), or None for any other shape of it. The shapes the Reshapes and Expands are given are computed
    in the graph: their results' inferred shapes must say [N, 1, T], but for the first dimension where
    both it and x's are symbols that shape inference could not tie (magika's second LayerNorm, whose
    shape comes from the model input's batch): that Reshape or Expand is returned, for its shape to be
    compared with x's at each run (float_steps.reduced_shapes_hold)."""
    def summed_over_channels(node):
        axes = const_array(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        return node.op_type == "ReduceSum" and axes is not None and axes.reshape(-1).tolist() == [1] and \
            attribute(node, "keepdims", 1) == 0

    def other(node, value):  # the operand of a two-input node that is not `value`
        return node.inputs[1] if node.inputs[0] is value else node.inputs[0]

    def only(value, op_type, operand=None):  # the one reader of `value`, of `op_type`, whose other operand is `operand`
        node = only_consumer(value, (op_type,))
        return node if node is not None and (operand is None or other(node, value) is operand) else None

    x = sum_x.inputs[0]
    if not summed_over_channels(sum_x) or x.shape is None or len(x.shape) not in (2, 3) or \
            not isinstance(x.shape[1], int) or x.shape[1] < 1:
        return None
    square = next((n for n in x.consumers() if n.op_type == "Mul" and n.inputs[0] is x and n.inputs[1] is x), None)
    sum_squares = only(square.outputs[0], "ReduceSum") if square is not None else None
    mean, second = only(sum_x.outputs[0], "Mul"), only(sum_squares.outputs[0], "Mul") if sum_squares else None
    if sum_squares is None or not summed_over_channels(sum_squares) or mean is None or second is None:
        return None
    factor = _scalar(other(mean, sum_x.outputs[0]))
    if factor is None or _scalar(other(second, sum_squares.outputs[0])) != factor:
        return None
    readers = list(mean.outputs[0].consumers())
    mean_square = next((n for n in readers if n.op_type == "Mul" and n.inputs[0] is n.inputs[1]), None)
    mean_reshape = next((n for n in readers if n.op_type == "Reshape" and n.inputs[0] is mean.outputs[0]), None)
    if len(readers) != 2 or mean.outputs[0].is_graph_output() or mean_square is None or mean_reshape is None:
        return None
    variance = only(second.outputs[0], "Sub", mean_square.outputs[0])
    if variance is None or variance.inputs[0] is not second.outputs[0] or only(mean_square.outputs[0], "Sub") is None:
        return None
    positive = only(variance.outputs[0], "Max")
    if positive is None or len(positive.inputs) != 2 or _scalar(other(positive, variance.outputs[0])) != 0.0:
        return None
    chain = [positive]
    for op_type in ("Reshape", "Expand", "Add", "Sqrt", "Reciprocal", "Mul"):
        chain.append(only(chain[-1].outputs[0], op_type))
        if chain[-1] is None or (op_type in ("Reshape", "Expand") and chain[-1].inputs[0] is not chain[-2].outputs[0]):
            return None
    _, variance_reshape, variance_expand, add_epsilon, _, _, scale_mul = chain
    epsilon = _scalar(other(add_epsilon, variance_expand.outputs[0]))
    mean_expand = only(mean_reshape.outputs[0], "Expand")
    centered = only(mean_expand.outputs[0], "Sub") if mean_expand is not None else None
    if epsilon is None or centered is None or centered.inputs[0] is not x or mean_expand.inputs[0] is not mean_reshape.outputs[0]:
        return None
    scaled = only(centered.outputs[0], "Mul", scale_mul.outputs[0])
    if scaled is None or only(scale_mul.outputs[0], "Mul") is not scaled:
        return None
    shift = only(scaled.outputs[0], "Add")
    channels = x.shape[1]
    gamma, beta = const_array(other(scale_mul, chain[-2].outputs[0])), const_array(other(shift, scaled.outputs[0])) \
        if shift is not None else None
    expanded, per_channel = (x.shape[0], 1, *x.shape[2:]), (1, channels) + (1,) * (len(x.shape) - 2)
    if gamma is None or beta is None or gamma.shape != per_channel or beta.shape != per_channel or \
            gamma.dtype != np.float32 or beta.dtype != np.float32 or shift.outputs[0].dtype != ir.DataType.FLOAT:
        return None
    checked = _shapes_to_check((variance_reshape, variance_expand, mean_reshape, mean_expand), x, expanded)
    if checked is None:
        return None
    nodes = [sum_x, square, sum_squares, second, mean, mean_square, variance, *chain, mean_reshape, mean_expand,
             centered, scaled, shift]
    return (factor, epsilon, gamma.reshape(-1), beta.reshape(-1)), x, nodes, checked


def _shapes_to_check(nodes, x: ir.Value, expanded: tuple) -> list[ir.Node] | None:
    """Of a written-out reduction's Reshapes and Expands, which the run must check (reduced_shapes_hold): those
    whose inferred shape is `expanded` (x's with 1 at the reduced axis) but for a first dimension that is
    another symbol than x's, their shape computed; None where another one's shape is not `expanded`."""
    checked = []
    for node in nodes:
        shape = tuple(node.outputs[0].shape or ())
        untied = len(shape) == len(expanded) and shape[1:] == expanded[1:] and not isinstance(shape[0], int) and \
            not isinstance(x.shape[0], int) and const_array(node.inputs[1]) is None
        if shape != expanded and not untied:
            return None
        if shape != expanded:
            checked.append(node)
    return checked


def read_written_softmax(reduce_max: ir.Node) -> tuple[ir.Value, list[ir.Node], list[ir.Node]] | None:
    """A softmax over x's last axis as jax2tf writes jax.nn.softmax, from its ReduceMax, as kernels.softmax
    computes it (the sums keepdims 0; the Reshapes and Expands to x's shape with 1 last):

        m = Max(−inf, ReduceMax(x)) → Reshape → Expand;  e = Exp(x − m);  e / Expand(Reshape(ReduceSum(e)))

    (x, the ten nodes, the Reshapes and Expands whose shapes the run must check: _shapes_to_check), or None."""
    x = reduce_max.inputs[0] if reduce_max.inputs else None
    if x is None or x.dtype != ir.DataType.FLOAT or x.shape is None or not x.shape or x.is_graph_output():
        return None

    def over_last_axis(node):
        axes = attribute(node, "axes") if len(node.inputs) < 2 or node.inputs[1] is None else const_array(node.inputs[1])
        return axes is not None and [a % len(x.shape) for a in np.reshape(axes, -1).tolist()] == [len(x.shape) - 1] \
            and attribute(node, "keepdims", 1) == 0

    def next_of(node, op_type, first=True):  # the one reader of node's output, which it reads first (or either)
        reader = only_consumer(node.outputs[0], (op_type,))
        return reader if reader is not None and (not first or reader.inputs[0] is node.outputs[0]) else None

    if reduce_max.op_type != "ReduceMax" or not over_last_axis(reduce_max):
        return None
    maximum = next_of(reduce_max, "Max", first=False)
    if maximum is None or len(maximum.inputs) != 2 or \
            _scalar(maximum.inputs[0] if maximum.inputs[1] is reduce_max.outputs[0] else maximum.inputs[1]) != -np.inf:
        return None
    shift_reshape = next_of(maximum, "Reshape")
    shift_expand = next_of(shift_reshape, "Expand") if shift_reshape is not None else None
    sub = next_of(shift_expand, "Sub", first=False) if shift_expand is not None else None
    if sub is None or sub.inputs[0] is not x:
        return None
    exp = next_of(sub, "Exp")
    readers = list(exp.outputs[0].consumers()) if exp is not None else []
    reduce_sum = next((n for n in readers if n.op_type == "ReduceSum"), None)
    if len(readers) != 2 or reduce_sum is None or not over_last_axis(reduce_sum) or exp.outputs[0].is_graph_output():
        return None
    sum_reshape = next_of(reduce_sum, "Reshape")
    sum_expand = next_of(sum_reshape, "Expand") if sum_reshape is not None else None
    div = next_of(sum_expand, "Div", first=False) if sum_expand is not None else None
    if div is None or div.inputs[0] is not exp.outputs[0] or div not in readers:
        return None
    reshapes = (shift_reshape, shift_expand, sum_reshape, sum_expand)
    checked = _shapes_to_check(reshapes, x, (*x.shape[:-1], 1))
    if checked is None:
        return None
    return x, [reduce_max, maximum, shift_reshape, shift_expand, sub, exp, reduce_sum, sum_reshape, sum_expand, div], checked


def read_one_hot(node: ir.Node) -> tuple[np.ndarray, ir.Value, ir.Value | None, Quantization, list[ir.Node]] | None:
    """A one-hot that is quantized next, as jax2tf writes jax.nn.one_hot(v, K) before a Dense, from its first node:

        [Expand(v, shape) →] Equal(·, table) → Cast(to float32) → QuantizeLinear (per tensor)

    where v holds integers (int32 or int64) and ends in an axis of 1, and the table is a constant integer
    vector [K] (or [1, …, 1, K], of at most v's rank): each value of v becomes K levels, the quantized 1
    where it equals the table's value there and the quantized 0 elsewhere. (the table [K], v, the
    Expand's shape or None, the Quantization, the nodes), or None."""
    expand = None
    if node.op_type == "Expand" and node.domain in ("", "ai.onnx") and len(node.inputs) == 2:
        expand, node = node, only_consumer(node.outputs[0], ("Equal",))
        if node is None:
            return None
    if node.op_type != "Equal" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2 or None in node.inputs:
        return None
    tables = [const_array(v) for v in node.inputs]
    if (tables[0] is None) == (tables[1] is None):
        return None
    table, v = (tables[1], node.inputs[0]) if tables[1] is not None else (tables[0], node.inputs[1])
    if expand is not None and v is not expand.outputs[0]:
        return None
    source = expand.inputs[0] if expand is not None else v
    integers = (ir.DataType.INT32, ir.DataType.INT64)
    if source.dtype not in integers or table.dtype not in (np.int32, np.int64) or source.shape is None or \
            not source.shape or source.shape[-1] != 1 or table.ndim > len(source.shape) or table.ndim == 0 or \
            any(d != 1 for d in table.shape[:-1]) or table.shape[-1] < 1:
        return None
    cast = only_consumer(node.outputs[0], ("Cast",))
    if cast is None or ir.DataType(attribute(cast, "to", 0)) != ir.DataType.FLOAT:
        return None
    quantized = quantized_next(cast.outputs[0])
    if quantized is None or not quantized[1].is_per_tensor:
        return None
    nodes = [n for n in (expand, node, cast, quantized[0]) if n is not None]
    return table.reshape(-1), source, expand.inputs[1] if expand is not None else None, quantized[1], nodes


def _gelu_of(value: ir.Value) -> tuple[kernels.Gelu, list[ir.Node]] | None:
    """The GELU of `value` as a post-op: its Div and its Mul by x read `value`, and nothing else does."""
    readers = list(value.consumers())
    div = next((n for n in readers if n.op_type == "Div" and n.inputs[0] is value), None)
    found = read_gelu(div) if div is not None and not value.is_graph_output() else None
    if found is None or len(readers) != 2 or found[1][3] not in readers:
        return None
    return found


def _times_x(value: ir.Value, op_type: str) -> list[ir.Node] | None:
    """[f, Mul] where `value` x is read by one `op_type` node f and by the float Mul of x and f(x), and by
    nothing else (x·Sigmoid(x), x·HardSigmoid(x)). Mul commutes, bit for bit: either operand order."""
    readers = list(value.consumers())
    f = next((n for n in readers if n.op_type == op_type and n.domain in ("", "ai.onnx")), None)
    if f is None or len(readers) != 2 or value.is_graph_output():
        return None
    multiply = only_consumer(f.outputs[0], ("Mul",))
    if multiply is None or multiply not in readers or multiply.outputs[0].dtype != ir.DataType.FLOAT or \
            {id(v) for v in multiply.inputs} != {id(value), id(f.outputs[0])}:
        return None
    return [f, multiply]


def _silu_of(value: ir.Value) -> tuple[kernels.Silu, list[ir.Node]] | None:
    """x·Sigmoid(x) as a post-op (YOLO's and EfficientNet's SiLU)."""
    nodes = _times_x(value, "Sigmoid")
    return (kernels.Silu(), nodes) if nodes else None


def _hard_swish_of(value: ir.Value) -> tuple[kernels.HardSwish, list[ir.Node]] | None:
    """x·HardSigmoid(x) as a post-op (a hard swish as exports before opset 14 write it)."""
    nodes = _times_x(value, "HardSigmoid")
    if nodes is None:
        return None
    alpha, beta = attribute(nodes[0], "alpha", 0.2), attribute(nodes[0], "beta", 0.5)
    return kernels.HardSwish(float(np.float32(alpha)), float(np.float32(beta))), nodes


def _scalar(value: ir.Value | None) -> float | None:
    """A constant float32 holding one value, as a float (the float32's value exactly), else None."""
    array = const_array(value) if value is not None else None
    if array is None or array.size != 1 or array.dtype != np.float32:
        return None
    return float(array.reshape(()))


def _optional_bound(node: ir.Node, index: int, default: float) -> np.ndarray | None:
    if len(node.inputs) <= index or node.inputs[index] is None:
        return np.float32(default)
    return const_array(node.inputs[index])


def read_convolution_1d(node: ir.Node) -> tuple[np.ndarray, np.ndarray | None, int, tuple[int, int]] | None:
    """(weights, bias or None, stride, pads) of a Conv of float32 [N, C, length] by constant float32 weights
    [O, C, k], one group, a bias or none, explicit pads (or none), no dilation; else None."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.inputs) not in (2, 3):
        return None
    x, weights = node.inputs[0], const_array(node.inputs[1])
    bias = const_array(node.inputs[2]) if len(node.inputs) == 3 and node.inputs[2] is not None else None
    if x is None or x.dtype != ir.DataType.FLOAT or x.shape is None or len(x.shape) != 3:
        return None
    if weights is None or weights.dtype != np.float32 or weights.ndim != 3 or x.shape[1] != weights.shape[1]:
        return None
    if len(node.inputs) == 3 and node.inputs[2] is not None and (
            bias is None or bias.dtype != np.float32 or bias.shape != weights.shape[:1]):
        return None
    k = weights.shape[2]
    strides, pads = attribute(node, "strides", [1]), list(attribute(node, "pads", [0, 0]))
    plain = (attribute(node, "group", 1) == 1 and list(attribute(node, "dilations", [1])) == [1]
             and len(pads) == 2 and min(pads) >= 0 and (attribute(node, "auto_pad", "NOTSET") == "NOTSET"
                                                       or attribute(node, "auto_pad") == "VALID" and not any(pads))
             and list(attribute(node, "kernel_shape", [k])) == [k] and len(strides) == 1 and strides[0] >= 1)
    if not plain:
        return None
    return weights, None if bias is None else np.ascontiguousarray(bias), int(strides[0]), (int(pads[0]), int(pads[1]))


def read_stft_convolution(node: ir.Node) -> tuple[np.ndarray, np.ndarray | None, int] | None:
    """(weights, bias or None, stride) of an STFT's Conv: read_convolution_1d's of one channel ([N, 1, length] by
    [C, 1, k], each frequency's cosine or sine times the window), without pads; else None."""
    found = read_convolution_1d(node)
    if found is None or found[0].shape[1] != 1 or any(found[3]):
        return None
    return found[:3]
