"""A graph for one set of input shapes: what those shapes decide is computed, and the Ifs they decide are inlined.

A scripted PyTorch model branches on shapes: silero_vad's decoder is If(state.shape[1] != 0, LSTM cell, …), and
inside it Ifs on its input's rank (Unsqueeze where unbatched, else Identity) and on its outputs' first dims
(squeeze where 1). onnxruntime runs each If's branch as a subgraph call and the shape arithmetic before it on
every run: the region took 100-112 µs, the LSTM's arithmetic in it a few. Once the inputs' shapes are known
the branches taken are known too, and what remains is a straight line of ops lpt runs itself.

    specialized = specialize(region_proto, {"state": (2, 1, 128), "x": (1, 128, 1)})

rounds, until nothing changes: infer every value's shape from the inputs'; replace a Shape or Size of a
value whose shape is known, and any node whose inputs are all constants, by its values (ONNX's reference
evaluator computes them: exact for the moves and integer arithmetic such graphs hold); put an If whose
condition is then a constant's taken branch in its place. Then what no output reads is dropped. None where
the model cannot be read so (shape inference fails, a branch's names clash with the graph's).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

logger = logging.getLogger(__name__)

MAX_ROUNDS = 16  # each round inlines at least one If or folds at least one node; nested Ifs need a round each
FOLDED_VALUES = 1 << 22  # a node whose outputs hold more values stays a node (a ConstantOfShape of a large shape)
_RANDOM_OPS = ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli")


def specialize(proto: onnx.ModelProto, input_shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto | None:
    """A copy of `proto` for inputs of exactly `input_shapes` (see the module doc), or None."""
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    graph = model.graph
    for value in graph.input:
        if value.name in input_shapes:
            shape = value.type.tensor_type.shape
            shape.Clear()
            shape.SetInParent()  # a scalar's: present, with no dimensions
            for dim in input_shapes[value.name]:
                shape.dim.add().dim_value = int(dim)
    try:
        for _ in range(MAX_ROUNDS):
            if not _fold_round(model):
                break
    except Exception as why:  # noqa: BLE001 - a model this cannot read stays as it is
        logger.info("the region is not specialized: %s", str(why).splitlines()[0] if str(why) else type(why).__name__)
        return None
    _bypass_identities(graph)
    _drop_unread(graph)
    del graph.value_info[:]
    return model


def _fold_round(model: onnx.ModelProto) -> bool:
    """One round (see the module doc); whether it changed the graph."""
    graph = model.graph
    del graph.value_info[:]  # the last round's, some of them for values folded since
    shapes = static_shapes(onnx.shape_inference.infer_shapes(model).graph)
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    changed, nodes = False, []
    for index, node in enumerate(graph.node):
        values = _node_values(node, constants, shapes, model)
        if values is not None:
            for name, array in zip(node.output, values):
                if name:
                    constants[name] = array
                    graph.initializer.append(numpy_helper.from_array(array, name))
            changed = True
            continue
        if node.op_type == "If" and node.domain in ("", "ai.onnx") and node.input[0] in constants:
            inlined = _inline(index, bool(constants[node.input[0]].reshape(-1)[0]), graph)
            if inlined is not None:
                nodes.extend(inlined)
                changed = True
                continue
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return changed


def _node_values(node: onnx.NodeProto, constants: dict, shapes: dict,
                 model: onnx.ModelProto) -> list[np.ndarray] | None:
    """The node's outputs where the shapes or its constant inputs give them, else None (an If among them:
    _fold_round inlines it instead)."""
    if node.domain not in ("", "ai.onnx") or node.op_type in _RANDOM_OPS or \
            any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return None
    if node.op_type in ("Shape", "Size") and node.input[0] in shapes:
        shape = shapes[node.input[0]]
        if node.op_type == "Size":
            return [np.array(math.prod(shape), np.int64)]
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        start, end = attributes.get("start", 0), attributes.get("end", len(shape))
        return [np.array(shape[slice(start, end)], np.int64)]
    if any(name and name not in constants for name in node.input):
        return None
    single = helper.make_graph([node], "fold", [], [onnx.ValueInfoProto(name=n) for n in node.output if n],
                               [numpy_helper.from_array(constants[n], n) for n in dict.fromkeys(node.input) if n])
    evaluated = ReferenceEvaluator(helper.make_model(single, opset_imports=list(model.opset_import))).run(None, {})
    values = [np.asarray(v) for v in evaluated]
    if sum(v.size for v in values) > FOLDED_VALUES:
        return None
    return values


def _inline(index: int, condition: bool, graph: onnx.GraphProto) -> list | None:
    """The taken branch's nodes of the If graph.node[index], and Identities from its outputs to the If's; None
    where a name it defines is the graph's already (onnx asks subgraphs for names of their own, not every
    exporter keeps to it)."""
    node = graph.node[index]
    branch = next(helper.get_attribute_value(a) for a in node.attribute
                  if a.name == ("then_branch" if condition else "else_branch"))
    if _names_defined(branch) & _names_defined(graph, leaving_out=index):
        return None
    graph.initializer.extend(branch.initializer)
    outputs = [helper.make_node("Identity", [inner.name], [outer], name=f"{node.name}/{outer}")
               for inner, outer in zip(branch.output, node.output) if outer]
    return [*branch.node, *outputs]


def _names_defined(graph: onnx.GraphProto, leaving_out: int = -1) -> set[str]:
    """The names a graph gives values, its subgraphs' included (but the subgraphs of node `leaving_out`)."""
    names = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    for index, node in enumerate(graph.node):
        names.update(n for n in node.output if n)
        for subgraph in [] if index == leaving_out else [g for a in node.attribute for g in subgraphs(a)]:
            names |= _names_defined(subgraph)
    return names


def names_read(node: onnx.NodeProto) -> set[str]:
    """The names a node reads, its subgraphs' reads of outer values included (a superset: also their own)."""
    names = {n for n in node.input if n}
    for attribute in node.attribute:
        for subgraph in subgraphs(attribute):
            for inner in subgraph.node:
                names |= names_read(inner)
            names.update(v.name for v in subgraph.output)
    return names


def subgraphs(attribute: onnx.AttributeProto) -> list[onnx.GraphProto]:
    """The graphs an attribute holds (an If's branch, a Loop's body), none for other attributes."""
    if attribute.type == onnx.AttributeProto.GRAPH:
        return [attribute.g]
    return list(attribute.graphs) if attribute.type == onnx.AttributeProto.GRAPHS else []


def static_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    """The values whose every dimension inference made a number."""
    shapes = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor = value.type.tensor_type
        if value.type.HasField("tensor_type") and tensor.HasField("shape") and \
                all(d.HasField("dim_value") for d in tensor.shape.dim):
            shapes[value.name] = tuple(d.dim_value for d in tensor.shape.dim)
    return shapes


def _bypass_identities(graph: onnx.GraphProto) -> None:
    """What reads an Identity's output (an inlined branch's, mostly) reads its input instead: each is a step less."""
    outputs = {v.name for v in graph.output}
    source = {}
    for node in graph.node:
        if node.op_type == "Identity" and node.domain in ("", "ai.onnx") and node.output[0] not in outputs:
            source[node.output[0]] = source.get(node.input[0], node.input[0])
    _rename_reads(graph, source)


def _rename_reads(graph: onnx.GraphProto, source: dict[str, str]) -> None:
    """Each read of a name in `source` (the graph's nodes', its subgraphs', and their outputs, which may be outer
    values) made a read of its source; the graph's own outputs are never in it."""
    for node in graph.node:
        for position, name in enumerate(node.input):
            node.input[position] = source.get(name, name)
        for attribute in node.attribute:
            for subgraph in subgraphs(attribute):
                _rename_reads(subgraph, source)
                for value in subgraph.output:
                    value.name = source.get(value.name, value.name)


def _drop_unread(graph: onnx.GraphProto) -> None:
    """The nodes and initializers no output depends on, removed."""
    needed = {v.name for v in graph.output}
    kept = []
    for node in reversed(graph.node):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed |= names_read(node)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    initializers = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
