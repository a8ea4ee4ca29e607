"""Small graph edits every pass needs: replace a value, remove what became unused."""

from __future__ import annotations

import onnx_ir as ir


def take_name(new: ir.Value, old: ir.Value) -> None:
    """Let `new` carry `old`'s name (tensor names are how layers are matched across models), and
    its shape when `new` has none: it is the same tensor, computed another way."""
    name = old.name
    old.name = None
    new.name = name
    if new.shape is None and old.shape is not None:
        new.shape = old.shape


def replace_value(old: ir.Value, new: ir.Value, *, keep_name: bool = True) -> None:
    """Point every consumer of `old` at `new`, which takes `old`'s name when `keep_name`.

    Graph output names are the model's interface: when `new` cannot take the output's name
    (it is an input, an initializer, another output, or keeps its own name) an Identity does.
    """
    graph = old.graph
    # Inputs, initializers and outputs are named by the model's interface: never renamed here.
    fixed = new.is_graph_input() or new.is_initializer() or new.is_graph_output()
    if old.is_graph_output() and (fixed or not keep_name) and graph is not None:
        identity = ir.node("Identity", [new], name=f"{old.name}/keep_name")
        producer = new.producer()
        if producer is not None and producer.graph is graph:
            graph.insert_after(producer, identity)
        else:
            graph.insert_before(graph[0], identity)
        new = identity.outputs[0]
        new.type, new.shape = old.type, old.shape
        fixed, keep_name = False, True
    if keep_name and not fixed:
        take_name(new, old)
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)


def remove_unused(graph: ir.Graph, nodes) -> None:
    """Remove those of `nodes` whose outputs nobody reads any more."""
    for node in nodes:
        if node.graph is graph and not any(v.uses() or v.is_graph_output() for v in node.outputs):
            graph.remove(node, safe=True)
