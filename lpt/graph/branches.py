"""An If's branch as a model of its own: what lpt compiles (lpt.backend.if_steps) and calibrates
(lpt.calibration.branches) in place of the branch."""

from __future__ import annotations

import onnx
import onnx_ir as ir

BRANCHES = ("then_branch", "else_branch")


def branch_model(branch: ir.Graph, outer: list[ir.Value], opsets: dict[str, int]) -> ir.Model:
    """A model of its own holding a copy of `branch`: the outer constants it may read as its initializers,
    the other outer values as its inputs (every one, read by this branch or not)."""
    graph = ir.serde.serialize_graph(branch)
    for value in outer:
        if value.const_value is not None:
            graph.initializer.append(ir.serde.serialize_tensor(value.const_value))
            graph.initializer[-1].name = value.name
        else:
            dims = None if value.shape is None else [d if isinstance(d, int) else None for d in value.shape]
            graph.input.append(onnx.helper.make_tensor_value_info(value.name, value.dtype.value, dims))
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()])
    return ir.serde.deserialize_model(proto)
