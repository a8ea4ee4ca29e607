"""The layers inside an If's branches, calibrated: each branch as a model of its own.

A model may keep its network in an If: silero_vad's whole graph is If(sr == 16000, 16 kHz network,
8 kHz network). The data pass cannot see a value inside a branch (onnxruntime returns only the
outer graph's), so each branch becomes a model whose inputs are the outer values it reads
(lpt.graph.branches.branch_model), fed with what those values are on the calibration batches whose
condition picks that branch, and calibrate() runs on it whole: placement, estimator, bias correction,
overflow fix, its own Ifs. Its fake-quantized graph then replaces the branch. A branch no batch
takes stays f32 and is reported so. lpt's backend runs a branch with integer ops as a plan of its own
(lpt.backend.if_steps).

Only an If of the outer graph that some branch's layers (Conv, MatMul, ...) make worth it is taken;
one whose branches read a value of unknown element type stays f32 (a branch's model declares its
inputs' types).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir

from lpt.backend.fallback import region_inputs
from lpt.calibration.data import CalibrationData
from lpt.calibration.placement import Skipped
from lpt.calibration.statistics import session
from lpt.graph.branches import BRANCHES, branch_model
from lpt.graph.ops import QUANTIZABLE_OPS
from lpt.model_io import to_proto

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class CalibratedBranch:
    node: str  # the If
    branch: str  # "then_branch" or "else_branch"
    result: object  # the branch model's CalibrationResult


def calibrate_branches(working: ir.Model, fp32_copy, data: CalibrationData, config, *, calibrate,
                       quiet: bool = False) -> tuple[list[CalibratedBranch], list[Skipped]]:
    """Each If of `working`'s graph with layers in its branches gets its branches fake-quantized (in place) by
    `calibrate` (lpt.calibration.calibrate, which imports this module), on the batches of `data` that take
    them; `fp32_copy()` gives the same model without FQs, whose run gives the values the branches read (held
    in memory for every batch: subset_size samples at most), made only where such an If is.
    (branches calibrated, Ifs or branches left f32 and why)"""
    ifs = [node for node in working.graph if _has_layers(node)]
    if not ifs:
        return [], []
    fp32 = fp32_copy()
    fp32_nodes = {node.name: node for node in fp32.graph}
    calibrated, left = [], []
    for node in ifs:
        condition = node.inputs[0]
        outer = [v for v in region_inputs([node]) if v is not condition]
        unknown = [v.name for v in outer if v.dtype is None]
        if unknown or node.name not in fp32_nodes:
            left.append(Skipped(node.name, node.op_type, f"its branches read {unknown[0]!r}, of unknown element type"
                                if unknown else "not found in the fp32 model"))
            continue
        fed = [v for v in outer if v.const_value is None]
        taken = _branch_batches(fp32, condition, fed, data)
        for index, name in enumerate(BRANCHES):
            batches = taken[index]
            if not batches:
                left.append(Skipped(f"{node.name}/{name}", node.op_type,
                                    "no calibration sample takes this branch: its layers stay f32"))
                continue
            model = branch_model(node.attributes[name].value, outer, working.opset_imports)
            axes = {v.name: data.specs[v.name].batch_axis for v in fed if v.name in data.specs}
            logger.info("%s: calibrating its %s on %d batches", node.name, name, len(batches))
            result = calibrate(model, batches, config=config, quiet=quiet, batch_axes=axes)
            _replace_branch(node, name, result.model.graph, outer, working)
            calibrated.append(CalibratedBranch(node.name, name, result))
    return calibrated, left


def _has_layers(node: ir.Node) -> bool:
    """An If (default domain) with both branches, one of which holds a layer calibrate quantizes."""
    if node.op_type != "If" or node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] is None \
            or any(name not in node.attributes for name in BRANCHES):
        return False
    return any(n.op_type in QUANTIZABLE_OPS and n.domain in ("", "ai.onnx")
               for name in BRANCHES for n in ir.traversal.RecursiveGraphIterator(node.attributes[name].value))


def _branch_batches(fp32: ir.Model, condition: ir.Value, fed: list[ir.Value], data: CalibrationData):
    """The values `fed` take on each batch of `data`, as feeds of the branch's model, sorted by the branch the
    batch's condition picks: ([then batches], [else batches])."""
    inputs = set(data.specs)
    fetched = [v for v in [condition, *fed] if v.name not in inputs]
    proto = to_proto(fp32)
    for value in fetched:  # their own element types (with_outputs declares float32)
        proto.graph.output.append(onnx.helper.make_tensor_value_info(value.name, value.dtype.value, None))
    sess = session(proto) if fetched else None
    taken: tuple[list, list] = ([], [])
    for batch in data.batches():
        values = dict(zip((v.name for v in fetched), sess.run([v.name for v in fetched], batch))) if sess else {}
        values.update(batch)
        picked = np.asarray(values[condition.name])
        if picked.size != 1:
            continue  # onnxruntime refuses it as well: the If's condition is one value
        taken[0 if bool(picked.reshape(-1)[0]) else 1].append({v.name: values[v.name] for v in fed})
    return taken


def _replace_branch(node: ir.Node, name: str, branch: ir.Graph, outer: list[ir.Value], model: ir.Model) -> None:
    """`branch` (a branch model's graph) as the If's branch `name`: its inputs, and the initializers that were outer
    constants, become the outer values themselves; a value it added whose name the model already uses is renamed."""
    by_name = {v.name: v for v in outer}
    for value in list(branch.inputs):
        value.replace_all_uses_with(by_name[value.name])
    branch.inputs.clear()
    for value_name in [n for n in branch.initializers if n in by_name]:
        branch.initializers[value_name].replace_all_uses_with(by_name[value_name])
        branch.initializers.pop(value_name)
    old = node.attributes[name].value
    taken = {v.name for n in ir.traversal.RecursiveGraphIterator(model.graph) for v in n.outputs} | \
        {v.name for v in model.graph.inputs} | set(model.graph.initializers)
    taken -= {v.name for n in ir.traversal.RecursiveGraphIterator(old) for v in n.outputs}
    added = [v for n in ir.traversal.RecursiveGraphIterator(branch) for v in n.outputs] + list(branch.initializers.values())
    for value in added:
        if value.name in taken:
            base, suffix = value.name, 1
            while f"{base}.{suffix}" in taken:
                suffix += 1
            value.name = f"{base}.{suffix}"
        taken.add(value.name)
    node.attributes[name] = ir.AttrGraph(name, branch)
