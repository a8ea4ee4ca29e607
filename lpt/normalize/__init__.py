"""Stage 1: every FakeQuantize-equivalent pattern becomes one lpt::FakeQuantize form.

The passes run in this order; each is one file with its own tests:

1. `QLinearOpsToQdq`: pre-quantized operators become QDQ around float ops (so step 2 sees them);
2. `QdqToFakeQuantize`: QuantizeLinear → DequantizeLinear pairs and dequantized integer weights;
3. `OpenVinoFakeQuantizeToLpt`: OpenVINO's FakeQuantize op;
4. `ArithmeticToFakeQuantize`: the arithmetic spellings (Div → Round → Clip → Mul, Clip → ... → Round).
"""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass, RemoveUnusedOpsetsPass

from lpt.normalize.arithmetic import ArithmeticToFakeQuantize
from lpt.normalize.openvino import OpenVinoFakeQuantizeToLpt
from lpt.normalize.qdq import QdqToFakeQuantize
from lpt.normalize.qlinear import QLinearOpsToQdq

PASSES = (QLinearOpsToQdq, QdqToFakeQuantize, OpenVinoFakeQuantizeToLpt, ArithmeticToFakeQuantize)


def normalize(model: ir.Model) -> ir.passes.PassResult:
    """Run the normalization passes in place, then drop nodes and opsets left unused."""
    passes = [p() for p in PASSES] + [RemoveUnusedNodesPass(), RemoveUnusedOpsetsPass()]
    return ir.passes.Sequential(*passes)(model)
