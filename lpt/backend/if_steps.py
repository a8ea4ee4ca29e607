"""An If runs as a step of lpt's: its condition read, then the branch it names run as a plan of its own.

Left in an onnxruntime region, an If costs a session call even where it only passes a value on
(openWakeWord's classifiers end in `If(score >= threshold, verifier(x), score)`, its else branch an
Identity: oww_hey_jarvis ran in 111-131 µs with the If in a session, 65-80 µs with it here), and a
branch holding int8 ops runs on onnxruntime's integer kernels, which on CPUs without VNNI saturate
pairs of products (lpt.backend.emulation).
Here each branch is compiled once, as a model whose inputs are the outer values it reads, into a
plan: its int8 chains on lpt's kernels, its float32 ops as any plan places them.

Taken: an If (default domain) whose condition one of lpt's steps makes, or whose branches hold
integer ops, and whose branches read only outer values of known element type. Others stay in
their onnxruntime region.

One If is no branch at all: `x.squeeze(d)` in a scripted PyTorch model exports as
If(Shape(x)[d] == 1, Squeeze(x, d), Identity(x)) (silero_vad_16k_op15 has one before its LSTM and one before
its last ReduceMean, each an onnxruntime region between two native programs). With its condition, it is
one step (try_squeeze_if_step): an axis squeezed where it is 1, the tensor as it is otherwise, and the
engine's instruction "squeeze_ones".
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir

from lpt.backend.fallback import region_inputs
from lpt.backend.float_steps import BACKEND as FLOAT_BACKEND
from lpt.backend.step import Step
from lpt.errors import DataError
from lpt.graph.branches import BRANCHES, branch_model
from lpt.graph.constants import const_array
from lpt.graph.ops import QUANTIZED_OPS, attribute

logger = logging.getLogger(__name__)


def try_if_step(node: ir.Node, opsets: dict[str, int], claimed: set[int], threads: int, native: bool,
                emulate=None) -> tuple[Step, list[ir.Node]] | None:
    """(Step, [node]) for an If lpt runs (see the module doc), else None."""
    if node.op_type != "If" or node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] is None:
        return None
    branches = [node.attributes[name].value for name in BRANCHES if name in node.attributes]
    if len(branches) != 2:
        return None
    condition = node.inputs[0]
    made_by_lpt = condition.producer() is not None and id(condition.producer()) in claimed
    integer_ops = any(n.op_type in QUANTIZED_OPS
                      for branch in branches for n in ir.traversal.RecursiveGraphIterator(branch))
    if not (made_by_lpt or integer_ops):
        return None
    outer = [v for v in region_inputs([node]) if v is not condition]
    if any(v.dtype is None for v in outer):
        return None  # a branch's model declares its inputs' types
    fed = [v for v in outer if v.const_value is None]  # the others go into the branches' models as constants
    from lpt.backend.plan import compile_model  # here: lpt.backend.plan imports this module

    try:
        plans = [compile_model(branch_model(branch, outer, opsets), threads=threads, native=native, emulate=emulate,
                               inputs_from_lpt=made_by_lpt) for branch in branches]
    except Exception as why:  # noqa: BLE001 - whatever stops a branch compiling, onnxruntime runs the If as before
        logger.info("%s stays in onnxruntime: a branch does not compile (%s)", node.name, why)
        return None
    names = [v.name for v in fed]
    calls = [_call(plan, names) for plan in plans]

    def run(cond, *values):
        cond = np.asarray(cond)
        if cond.size != 1:
            raise DataError(f"{node.name}: an If's condition holds {cond.size} values, not one")
        return calls[0 if bool(cond.reshape(-1)[0]) else 1](values)

    step = Step(run, (condition.name, *names), tuple(v.name for v in node.outputs), (node.name,), (node.op_type,),
                "int8 kernel" if integer_ops else FLOAT_BACKEND, plans=tuple(plans))
    return step, [node]


def _call(plan, names: list[str]):
    """outer values (in `names`' order) → the branch's outputs"""
    def call(values):
        results = plan.run(dict(zip(names, values)))
        return [results[name] for name in plan.outputs]
    return call


def try_squeeze_if_step(node: ir.Node, backend: str) -> tuple[Step, list[ir.Node]] | None:
    """(Step, [Shape, Gather, Equal, If]) for an If that squeezes axis d of x where it is 1 (see the module
    doc), whose condition only it reads; else None."""
    found = _squeeze_if(node)
    if found is None:
        return None
    x, axis, condition_nodes = found

    def squeeze_ones(a):
        a = np.asarray(a)
        if not -a.ndim <= axis < a.ndim:
            raise DataError(f"node {node.name!r} (If): axis {axis} of an input of rank {a.ndim}")
        return [np.squeeze(a, axis) if a.shape[axis] == 1 else a]

    nodes = [*condition_nodes, node]
    return Step(squeeze_ones, (x.name,), (node.outputs[0].name,), tuple(n.name for n in nodes),
                tuple(n.op_type for n in nodes), backend, native=("squeeze_ones", (axis,))), nodes


def _squeeze_if(node: ir.Node) -> tuple[ir.Value, int, list[ir.Node]] | None:
    """(x, d, [Shape, Gather, Equal]) of If(Equal(Gather(Shape(x), d), 1), Squeeze(x, d), Identity(x)), else None."""
    if node.op_type != "If" or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1 or not node.inputs:
        return None
    branches = [node.attributes[name].value for name in BRANCHES if name in node.attributes]
    if len(branches) != 2 or any(len([n for n in b if n.op_type != "Constant"]) != 1 for b in branches):
        return None
    (squeeze,), (identity,) = ([n for n in b if n.op_type != "Constant"] for b in branches)
    if squeeze.op_type != "Squeeze" or identity.op_type != "Identity" or squeeze.domain not in ("", "ai.onnx") \
            or identity.domain not in ("", "ai.onnx") or not squeeze.inputs or not identity.inputs:
        return None
    x = identity.inputs[0]
    if squeeze.inputs[0] is not x or [v.name for v in branches[0].outputs] != [squeeze.outputs[0].name] \
            or [v.name for v in branches[1].outputs] != [identity.outputs[0].name] or x.graph is not node.graph:
        return None
    axes = attribute(squeeze, "axes")  # before opset 13; an input from it on
    if axes is None and len(squeeze.inputs) > 1 and squeeze.inputs[1] is not None:
        axes = const_array(squeeze.inputs[1])
    axis = _one_integer(axes)
    equal = node.inputs[0].producer() if node.inputs[0] is not None else None
    if axis is None or equal is None or equal.op_type != "Equal" or len(equal.inputs) != 2:
        return None
    gather = equal.inputs[0].producer()
    if _one_integer(const_array(equal.inputs[1])) != 1 or gather is None or gather.op_type != "Gather" \
            or attribute(gather, "axis", 0) != 0 or _one_integer(const_array(gather.inputs[1])) != axis:
        return None
    shape = gather.inputs[0].producer()
    if shape is None or shape.op_type != "Shape" or shape.inputs[0] is not x or attribute(shape, "start") is not None \
            or attribute(shape, "end") is not None:
        return None
    condition_nodes = [shape, gather, equal]
    if any(len(v.uses()) != 1 or v.is_graph_output() for n in condition_nodes for v in n.outputs):
        return None  # something else reads the condition or its parts
    return x, axis, condition_nodes


def _one_integer(array) -> int | None:
    return int(np.reshape(array, -1)[0]) if array is not None and np.size(array) == 1 \
        and np.issubdtype(np.asarray(array).dtype, np.integer) else None
