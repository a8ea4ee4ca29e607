"""The runtime stage, written out: which low precision transformations run, in what order.

0. prerequisites: every node and value gets a unique name;
1. decomposition: weights fold into integer constants; activation FakeQuantizes split into
   quantize + dequantize;
2. main: dequantizations move down through the graph, repeated until nothing changes, so a
   dequantization pushed past one op can go on past the next;
3. cleanup: drop what became unused.

Each step is a LayerTransformation in its own file; pass a subset to `transform` to run only
those (as OpenVINO's SimpleLowPrecisionTransformer does in its tests).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import onnx_ir as ir
from onnx_ir.passes.common import NameFixPass, RemoveUnusedNodesPass

from lpt.transformations.base import LayerTransformation
from lpt.transformations.clip import ClipTransformation
from lpt.transformations.concat import ConcatTransformation
from lpt.transformations.constant_arithmetic import ConstantArithmeticTransformation
from lpt.transformations.conv import ConvTransformation
from lpt.transformations.fake_quantize_decomposition import FakeQuantizeDecomposition
from lpt.transformations.fold_weight_fake_quantize import FoldWeightFakeQuantize
from lpt.transformations.matmul import MatMulTransformation
from lpt.transformations.precision_preserved import MoveThroughPrecisionPreserved
from lpt.transformations.relu import ReluTransformation

logger = logging.getLogger(__name__)

DECOMPOSITION = (FoldWeightFakeQuantize, FakeQuantizeDecomposition)
MAIN = (
    MoveThroughPrecisionPreserved,
    ReluTransformation,
    ClipTransformation,
    ConcatTransformation,
    ConstantArithmeticTransformation,
    ConvTransformation,
    MatMulTransformation,
)
_MAX_ROUNDS = 100  # each round moves every dequantization at least one op, or stops
# Model metadata marking lpt's int8 graphs: loading one again must not normalize its integer ops
# (MatMulInteger → Cast → Mul is also what third-party pre-quantized models look like).
INT8_GRAPH_KEY, INT8_GRAPH_VALUE = "lpt.graph", "int8"


@dataclass
class TransformResult:
    model: ir.Model
    applied: list[tuple[str, str]] = field(default_factory=list)  # (transformation, node), in order

    @property
    def modified(self) -> bool:
        return bool(self.applied)


def transform(model: ir.Model, transformations=DECOMPOSITION + MAIN) -> TransformResult:
    """Run the low precision transformations on `model` in place."""
    result = TransformResult(model)
    NameFixPass()(model)  # the rewrites name what they add after the node they rewrite: names must be unique

    def run(cls: type[LayerTransformation]) -> bool:
        instance = cls()
        modified = instance(model).modified
        result.applied += [(cls.__name__, n) for n in instance.applied]
        return modified

    for cls in (t for t in DECOMPOSITION if t in transformations):
        run(cls)
    main = [t for t in MAIN if t in transformations]
    for _ in range(_MAX_ROUNDS):
        if not any([run(cls) for cls in main]):
            break
    RemoveUnusedNodesPass()(model)
    model.metadata_props[INT8_GRAPH_KEY] = INT8_GRAPH_VALUE
    logger.info("%d rewrites", len(result.applied))
    return result
