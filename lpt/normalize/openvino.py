"""OpenVINO's FakeQuantize op (domain org.openvinotoolkit) ⇒ lpt::FakeQuantize, same semantics.

    x → org.openvinotoolkit::FakeQuantize(il, ih, ol, oh; levels)  ⇒  x → lpt::FakeQuantize(il, ih, ol, oh; levels)
"""

from __future__ import annotations

import onnx_ir as ir

from lpt.graph.fake_quantize_op import DOMAIN, OP_TYPE, OPENVINO_DOMAIN


class OpenVinoFakeQuantizeToLpt(ir.passes.InPlacePass):
    """Move OpenVINO FakeQuantize nodes into lpt's domain; they already have the normalized form."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in ir.traversal.RecursiveGraphIterator(model.graph):
            if node.op_type == OP_TYPE and node.domain == OPENVINO_DOMAIN and len(node.inputs) == 5:
                node.domain = DOMAIN
                modified = True
        if modified:
            model.opset_imports.setdefault(DOMAIN, 1)
        return ir.passes.PassResult(model, modified)
