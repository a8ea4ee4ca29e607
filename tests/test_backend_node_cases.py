"""ONNX's backend node test cases for the int8 ops, their models compiled and run by lpt's backend.

Every node runs on lpt's kernels (the test asserts no step fell back to onnxruntime), and the
outputs equal the expected ones exactly: integers as ONNX's runner compares them, floats bit
for bit (stricter than its rtol 1e-3).
"""

from __future__ import annotations

import importlib

import numpy as np
import onnx
import onnx.backend.test.case.node as node_cases
import onnx_ir as ir
import pytest
from onnx import numpy_helper

from lpt.backend import compile_model
from lpt.numerics.quantize_linear import INTEGER_TYPES

OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "ConvInteger", "MatMulInteger",
       "QLinearConv", "QLinearMatMul")
for _module in ("quantizelinear", "dequantizelinear", "dynamicquantizelinear", "convinteger", "matmulinteger",
                "qlinearconv", "qlinearmatmul"):
    importlib.import_module(f"onnx.backend.test.case.node.{_module}")
CASES = [case for case in node_cases._NodeTestCases
         if len(case.model.graph.node) == 1 and case.model.graph.node[0].op_type in OPS]
UNSUPPORTED_REASON = "lpt's int8 backend takes 4/8/16-bit integers and float32 (no float8/float4/int2/float16)"
MIN_CASES_RUN = 26  # 15 of QuantizeLinear/DequantizeLinear/DynamicQuantizeLinear, 11 of the integer Conv/MatMul ops


def _arrays(values) -> list[np.ndarray]:
    return [numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v) for v in values]


def _unsupported(case) -> bool:
    inputs, outputs = case.data_sets[0]
    supported = set(INTEGER_TYPES) | {"float32", "int32"}  # int32: ConvInteger/MatMulInteger accumulators
    return any(a.dtype.name not in supported for a in _arrays(inputs + outputs))


def _param(case):
    marks = [pytest.mark.skip(reason=UNSUPPORTED_REASON)] if _unsupported(case) else []
    return pytest.param(case, id=case.name, marks=marks)


def test_enough_cases_run_and_every_op_is_among_them():
    ran = [case for case in CASES if not _unsupported(case)]
    assert len(ran) >= MIN_CASES_RUN
    assert {case.model.graph.node[0].op_type for case in ran} == set(OPS)


@pytest.mark.parametrize("case", [_param(case) for case in CASES])
def test_node_case_on_the_backend(case):
    plan = compile_model(ir.serde.deserialize_model(case.model))
    assert {step.backend for step in plan.steps} == {"int8 kernel"}
    names = [v.name for v in case.model.graph.input]
    for inputs, expected in case.data_sets:
        outputs = plan.run(dict(zip(names, _arrays(inputs))))
        for name, want in zip(plan.outputs, _arrays(expected)):
            got = outputs[name]
            assert got.shape == want.shape
            if want.dtype.kind in "iu":
                assert got.dtype.kind == want.dtype.kind
            np.testing.assert_array_equal(got, want)
