"""The int8 chains the backend runs on lpt's kernels, each prepared once into a Step.

    ConvInteger|lpt::ConvTransposeInteger|MatMulInteger → Cast → Mul(m) [→ Add(bias)] [→ Relu|Clip|Sigmoid]*
        [→ QuantizeLinear|lpt::Quantize]
        one kernel call: weights packed and compensation precomputed here, then the oneDNN
        output stage (f32 dequantization, bias, post-ops, destination quantization);
    QuantizeLinear, lpt::Quantize                     quantize kernels (f32 → u8/i8);
    Cast → [Sub] → Mul [→ QuantizeLinear]             dequantize (the graph's own f32 operations),
                                                      and requantize when a quantize follows;
    Cast → [Sub] → Mul → AveragePool|GlobalAveragePool → QuantizeLinear
                                                      integer average (exact half-to-even, see
                                                      lpt.kernels.pooling), rescaled to the output;
    MaxPool, Relu, Max(zero point), Clip on integers  integer kernels;
    Add|Mul|Concat of dequantized branches [→ Relu] → QuantizeLinear|lpt::Quantize
                                                      argument scaling: each branch dequantized
                                                      with its own scale, joined, requantized.

Every step computes the same f32 operations, in the same order, as the ONNX nodes it replaces,
so a plan and onnxruntime running the same int8 graph agree bit for bit (see the tests) — except
the integer average, which rounds once where the graph rounds twice (at most 1 LSB apart).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import onnx_ir as ir

from lpt import kernels
from lpt.backend.plan import Step
from lpt.graph.constants import const_array
from lpt.graph.fake_quantize_op import read_fake_quantize
from lpt.numerics.levels import level_range
from lpt.transformations.dequantization import Dequantization

_INTEGER = (ir.DataType.UINT8, ir.DataType.INT8)
_POST_OPS = ("Relu", "Clip", "Sigmoid")
_POOLS = ("AveragePool", "GlobalAveragePool")


def _only_consumer(value: ir.Value, op_types: tuple[str, ...], domain: str = "") -> ir.Node | None:
    users = list(value.consumers())
    if len(users) != 1 or value.is_graph_output():
        return None
    node = users[0]
    return node if node.op_type in op_types and node.domain in (domain, "ai.onnx" if domain == "" else domain) else None


def _attr(node: ir.Node, name: str, default=None):
    return node.attributes[name].value if name in node.attributes else default


def _step(run, inputs, nodes, outputs=None) -> tuple[Step, list[ir.Node]]:
    outputs = outputs or [nodes[-1].outputs[0]]
    return (Step(run, tuple(v.name for v in inputs), tuple(v.name for v in outputs),
                 tuple(n.name for n in nodes), tuple(n.op_type for n in nodes), "int8 kernel"), nodes)


def try_int8_step(node: ir.Node, threads: int = 0) -> tuple[Step, list[ir.Node]] | None:
    """A kernel step starting at `node` and the nodes it covers, or None (the node falls back).

    `threads` is for the integer GEMM (0: one per core).
    """
    if node.domain not in ("", "ai.onnx", "lpt"):
        return None
    integer_input = node.inputs and node.inputs[0] is not None and node.inputs[0].dtype in _INTEGER
    if node.op_type in ("ConvInteger", "MatMulInteger", "ConvTransposeInteger"):
        return _accumulate_chain(node, threads)
    if (node.op_type, node.domain) in (("QuantizeLinear", ""), ("QuantizeLinear", "ai.onnx"), ("Quantize", "lpt")):
        return _quantize(node)
    if node.op_type == "Cast" and node.inputs[0].dtype in _INTEGER + (ir.DataType.INT32,):
        return _dequantize(node)
    if integer_input and node.op_type in ("MaxPool", "Relu", "Max", "Clip"):
        return _integer_op(node)
    return None


def try_join_step(node: ir.Node) -> tuple[Step, list[ir.Node]] | None:
    """Add, Mul or Concat of dequantized 8-bit branches followed by a quantize: one step from integers to integers."""
    if node.op_type not in ("Add", "Mul", "Concat") or node.domain not in ("", "ai.onnx"):
        return None
    branches = []
    for value in node.inputs:
        dq = Dequantization.of(value)
        if dq is None or dq.data.dtype not in _INTEGER or len(list(value.consumers())) != 1 or value.is_graph_output():
            return None
        branches.append(dq)
    if len(branches) < 2:
        return None
    nodes, last = [n for dq in branches for n in dq.nodes] + [node], node
    relu = _only_consumer(node.outputs[0], ("Relu",))
    if relu is not None:
        nodes.append(relu)
        last = relu
    destination = _destination(last.outputs[0], in_place=True)
    if destination is None:
        return None
    nodes.append(destination[0])
    parameters = [(dq.scale, dq.shift) for dq in branches]
    axis = _attr(node, "axis", 0)

    fused = _per_tensor_quantize_linear(destination[0])  # the quantize inside join_q, in one pass where it can

    def run(*integers):
        if node.op_type == "Concat":
            parts = [kernels.dequantize_shifted(q, shift, scale) for q, (scale, shift) in zip(integers, parameters)]
            x = np.concatenate(parts, axis=axis)
            return [destination[1](np.maximum(x, np.float32(0), out=x) if relu is not None else x)]
        (scale1, shift1), (scale2, shift2) = parameters
        joined = kernels.join_q(node.op_type == "Mul", integers[0], shift1, scale1, integers[1], shift2, scale2,
                                relu is not None, **(fused or {}))
        return [joined if fused else destination[1](joined)]

    return _step(run, [dq.data for dq in branches], nodes)


def _accumulate_chain(node: ir.Node, threads: int):
    x, w = node.inputs[0], node.inputs[1]
    x_zp, w_zp = _optional_constant(node, 2), _optional_constant(node, 3)
    if x_zp is None or w_zp is None or x.dtype not in _INTEGER or w.dtype not in _INTEGER:
        return None
    weights = const_array(w)
    if node.op_type == "ConvInteger":
        if weights is None:
            return None
        packed = kernels.pack_conv(weights, w_zp, int(x_zp), _attr(node, "group", 1), _attr(node, "strides"),
                                   _attr(node, "dilations"), _attr(node, "pads"), threads,
                                   auto_pad=_attr(node, "auto_pad", "NOTSET"))
        accumulate, runtime_inputs, axis = partial(kernels.conv_accumulate, packed=packed), [x], 1
    elif node.op_type == "ConvTransposeInteger":
        if weights is None or _attr(node, "auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
            return None
        accumulate = partial(kernels.conv_transpose_accumulate, weights_q=weights, src_zero_point=int(x_zp),
                             weight_zero_point=w_zp, groups=_attr(node, "group", 1), strides=_attr(node, "strides"),
                             dilations=_attr(node, "dilations"), pads=_attr(node, "pads"),
                             output_padding=_attr(node, "output_padding"))
        runtime_inputs, axis = [x], 1
    elif weights is not None:
        packed = kernels.pack_matmul_weights(weights, w_zp, x_zp, threads=threads)
        accumulate, runtime_inputs, axis = partial(kernels.matmul_accumulate_packed, packed=packed), [x], -1
    else:
        def accumulate(a, b):
            return kernels.matmul_accumulate(a, x_zp, b, w_zp)
        runtime_inputs, axis = [x, w], -1

    nodes = [node]
    cast = _only_consumer(node.outputs[0], ("Cast",))
    mul = _only_consumer(cast.outputs[0], ("Mul",)) if cast else None
    multiplier = const_array(mul.inputs[1]) if mul else None
    if multiplier is None:  # the accumulator itself is wanted
        return _step(lambda *a: [accumulate(*a)], runtime_inputs, nodes)
    if node.op_type == "ConvInteger":  # the output stage reads f32: skip the int32 round trip where exact
        accumulate = partial(kernels.conv_accumulate, packed=packed, exact_float=True)
    nodes += [cast, mul]
    multiplier = _per_channel(multiplier, axis)
    bias, post_ops, last = None, [], mul
    add = _only_consumer(mul.outputs[0], ("Add",))
    bias_value = next((v for v in add.inputs if v is not mul.outputs[0]), None) if add is not None else None
    if bias_value is not None and const_array(bias_value) is not None:  # either side: Add commutes
        bias = _per_channel(const_array(bias_value), axis)
        nodes.append(add)
        last = add
    while (op := _only_consumer(last.outputs[0], _POST_OPS) or _only_consumer(last.outputs[0], ("FakeQuantize",), "lpt")
           ) is not None and (post_op := _post_op(op)) is not None:
        post_ops.append(post_op)
        nodes.append(op)
        last = op
    quantize = _destination(last.outputs[0], in_place=True)
    if quantize is not None:
        nodes.append(quantize[0])

    fused = _per_tensor_quantize_linear(quantize[0]) if quantize else None  # into the output stage's one pass

    def run(*arrays):
        acc = accumulate(*arrays)
        out = kernels.output_stage(acc, multiplier, bias, tuple(post_ops), axis=axis, **(fused or {}))
        return [quantize[1](out) if quantize and not fused else out]

    return _step(run, runtime_inputs, nodes)


def _optional_constant(node: ir.Node, index: int) -> np.ndarray | None:
    """An optional constant input (absent → 0); None when it is present but not constant."""
    if len(node.inputs) <= index or node.inputs[index] is None:
        return np.zeros((), np.int32)
    return const_array(node.inputs[index])


def _per_channel(array: np.ndarray, axis: int) -> np.ndarray:
    """A constant shaped to broadcast per channel ([1, C, 1, 1] or [N]) as the kernels' 1-D vector."""
    if array.size == 1:
        return array.reshape(())
    return array.reshape(-1) if axis == -1 or array.ndim == 1 else array.reshape(array.shape[1])


def _post_op(node: ir.Node):
    if node.domain == "lpt":  # an FQ that could not be split: OpenVINO's FQ post-op chain
        fq = read_fake_quantize(node)
        if fq is None or fq.scale is not None:
            return None
        return kernels.FakeQuantize(fq.input_low, fq.input_high, fq.output_low, fq.output_high, fq.levels)
    if node.op_type == "Relu":
        return kernels.Relu()
    if node.op_type == "Sigmoid":
        return kernels.Sigmoid()
    if node.op_type == "Clip":
        low, high = _optional_bound(node, 1, -np.inf), _optional_bound(node, 2, np.inf)
        if low is not None and high is not None:
            return kernels.Clip(float(low), float(high))
    return None


def _optional_bound(node: ir.Node, index: int, default: float) -> np.ndarray | None:
    if len(node.inputs) <= index or node.inputs[index] is None:
        return np.float32(default)
    return const_array(node.inputs[index])


def _destination(value: ir.Value, in_place: bool = False):
    """(node, f32 → int function) when `value` is quantized next by QuantizeLinear or lpt::Quantize.

    With `in_place`, the function may overwrite its argument: for steps that own their f32 tensor.
    """
    node = _only_consumer(value, ("QuantizeLinear",)) or _only_consumer(value, ("Quantize",), domain="lpt")
    if node is None:
        return None
    function = quantize_function(node, in_place)
    return (node, function) if function is not None else None


def quantize_function(node: ir.Node, in_place: bool = False):
    """The f32 → integer function of a QuantizeLinear or lpt::Quantize node with constant parameters, or None.

    With `in_place`, a QuantizeLinear's function overwrites its f32 argument (see kernels.quantize).
    """
    if node.domain == "lpt":
        il, ih = const_array(node.inputs[1]), const_array(node.inputs[2])
        if il is None or ih is None:
            return None
        levels = _attr(node, "levels")
        qmin, qmax = level_range(levels, ir.DataType(_attr(node, "to")) == ir.DataType.INT8)
        affine = kernels.fq_input_affine(il, ih, levels)
        return partial(_quantize_fq_kernel, affine=affine, qmin=qmin, qmax=qmax)
    parameters = _quantize_linear_parameters(node)
    return None if parameters is None else partial(kernels.quantize, **parameters, in_place=in_place)


def _quantize_linear_parameters(node: ir.Node) -> dict | None:
    """QuantizeLinear's constant scale, zero_point, qmin, qmax (its zero point type's range) and axis, or None."""
    scale = const_array(node.inputs[1])
    zero_point = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else np.uint8(0)
    if scale is None or zero_point is None:
        return None
    info = np.iinfo(zero_point.dtype)
    axis = _attr(node, "axis", 1) if scale.size > 1 else None
    return dict(scale=scale, zero_point=zero_point, qmin=int(info.min), qmax=int(info.max), axis=axis)


def _per_tensor_quantize_linear(node: ir.Node) -> dict | None:
    """A QuantizeLinear with one scale and zero point as the destination arguments of the kernels, or None."""
    parameters = _quantize_linear_parameters(node) if node.domain != "lpt" else None
    if parameters is None or parameters["axis"] is not None or parameters["zero_point"].size != 1:
        return None
    return dict(dst_scale=parameters["scale"], dst_zero_point=parameters["zero_point"], qmin=parameters["qmin"],
                qmax=parameters["qmax"])


def _quantize_fq_kernel(x, affine, qmin, qmax):
    return kernels.quantize_fq(x, *affine, qmin, qmax)


def _quantize(node: ir.Node):
    function = quantize_function(node)
    return None if function is None else _step(lambda x: [function(x)], [node.inputs[0]], [node])


def _dequantize(node: ir.Node):
    """Cast → [Sub(shift)] → Mul(scale), with what may follow it fused: a quantize or an average pool."""
    nodes, shift = [node], None
    subtract = _only_consumer(node.outputs[0], ("Sub",))
    if subtract is not None and (shift := const_array(subtract.inputs[1])) is not None:
        nodes.append(subtract)
    multiply = _only_consumer(nodes[-1].outputs[0], ("Mul",))
    scale = const_array(multiply.inputs[1]) if multiply is not None else None
    if scale is None:
        return None
    nodes.append(multiply)
    shift = None if shift is None else shift.astype(np.float32)
    scale = scale.astype(np.float32)
    pool = _only_consumer(multiply.outputs[0], _POOLS)
    if pool is not None and (fused := _average_pool(node, nodes + [pool], scale, shift)) is not None:
        return fused
    destination = _destination(multiply.outputs[0], in_place=True)  # x below is the step's own

    def run(q):
        x = kernels.dequantize_shifted(q, shift, scale)
        return [destination[1](x) if destination else x]

    return _step(run, [node.inputs[0]], nodes + ([destination[0]] if destination else []))


def _average_pool(cast: ir.Node, nodes: list[ir.Node], scale: np.ndarray, shift: np.ndarray | None):
    """The integer average pool: the dequantization's zero point in, the next quantize's scale out."""
    pool = nodes[-1]
    quantize = _only_consumer(pool.outputs[0], ("QuantizeLinear",))
    zero_point = np.zeros((), np.int32) if shift is None else shift
    if (quantize is None or scale.size != 1 or np.size(zero_point) != 1 or zero_point != np.round(zero_point)
            or cast.inputs[0].dtype not in _INTEGER or _attr(pool, "auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET")
            or _attr(pool, "ceil_mode", 0)):
        return None
    out_scale, out_zp = const_array(quantize.inputs[1]), _optional_constant(quantize, 2)
    if out_scale is None or out_scale.size != 1 or out_zp is None:
        return None
    info = np.iinfo(out_zp.dtype if out_zp.dtype != np.int32 else np.uint8)
    rescale = dict(multiplier=np.float32(scale.reshape(())) / np.float32(out_scale.reshape(())),
                   out_zero_point=int(out_zp), qmin=int(info.min), qmax=int(info.max))
    zp = int(zero_point)
    if pool.op_type == "GlobalAveragePool":
        run = partial(kernels.global_average_pool_q, zero_point=zp, **rescale)
    else:
        run = partial(kernels.average_pool_q, zero_point=zp, kernel_shape=_attr(pool, "kernel_shape"),
                      strides=_attr(pool, "strides"), pads=_attr(pool, "pads"),
                      count_include_pad=bool(_attr(pool, "count_include_pad", 0)), dilations=_attr(pool, "dilations"),
                      **rescale)
    return _step(lambda q: [run(q)], [cast.inputs[0]], nodes + [quantize])


def _integer_op(node: ir.Node):
    x = node.inputs[0]
    if node.op_type == "MaxPool":
        if _attr(node, "auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET") or _attr(node, "ceil_mode", 0) or (
                len(node.outputs) > 1 and node.outputs[1].uses()):
            return None
        run = partial(kernels.max_pool_q, kernel_shape=_attr(node, "kernel_shape"), strides=_attr(node, "strides"),
                      pads=_attr(node, "pads"), dilations=_attr(node, "dilations"))
        return _step(lambda q: [run(q)], [x], [node], [node.outputs[0]])
    if node.op_type == "Relu":
        return _step(lambda q: [kernels.relu_q(q, 0)], [x], [node])
    if node.op_type == "Max" and len(node.inputs) == 2 and (zp := const_array(node.inputs[1])) is not None and zp.size == 1:
        return _step(lambda q: [kernels.relu_q(q, zp)], [x], [node])
    if node.op_type == "Clip" and len(node.inputs) == 3:
        low, high = const_array(node.inputs[1]), const_array(node.inputs[2])
        if low is not None and high is not None:
            return _step(lambda q: [kernels.clip_q(q, low, high)], [x], [node])
    return None
