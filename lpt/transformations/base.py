"""The contract every low precision transformation keeps: match → can_be_transformed → transform."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx_ir as ir

logger = logging.getLogger(__name__)

# Where a node records why it was left in float: node.doc_string survives saving at any IR version.
REASON_PREFIX = "lpt: f32: "


@dataclass(frozen=True)
class Check:
    """The verdict of `can_be_transformed`: ok, or the reason it is not."""

    passed: bool
    reason: str = ""

    @classmethod
    def ok(cls) -> Check:
        return cls(True)

    @classmethod
    def fail(cls, reason: str) -> Check:
        return cls(False, reason)

    def __bool__(self) -> bool:
        return self.passed


def record_reason(node: ir.Node, reason: str) -> None:
    node.doc_string = REASON_PREFIX + reason


def recorded_reason(node: ir.Node) -> str | None:
    doc = node.doc_string or ""
    return doc[len(REASON_PREFIX):] if doc.startswith(REASON_PREFIX) else None


class LayerTransformation(ir.passes.InPlacePass):
    """Walks the graph, applies `transform` where `can_be_transformed` passes, records why not.

    Subclasses set `op_types` and implement `can_be_transformed(node) -> Check` and
    `transform(node)`. `precision_preserved` says the op's integer output keeps the input's
    quantization (MaxPool, Reshape, ...): such ops never need their own FakeQuantize.
    """

    op_types: tuple[str, ...] = ()
    precision_preserved: bool = False

    def can_be_transformed(self, node: ir.Node) -> Check:
        raise NotImplementedError

    def transform(self, node: ir.Node) -> None:
        raise NotImplementedError

    def matches(self, node: ir.Node) -> bool:
        return node.op_type in self.op_types and node.domain in ("", "ai.onnx")

    def __init__(self) -> None:
        super().__init__()
        self.applied: list[str] = []  # names of the nodes transformed, in order

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
            if node.graph is None or not self.matches(node):
                continue
            check = self.can_be_transformed(node)
            if check:
                self.applied.append(node.name or node.op_type)
                self.transform(node)
                modified = True
            else:
                logger.debug("%s %r: %s", type(self).__name__, node.name, check.reason)
                record_reason(node, check.reason)
        return ir.passes.PassResult(model, modified)
