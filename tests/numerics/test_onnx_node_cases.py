"""ONNX's backend node test cases for QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear, run through lpt.

Comparison: the output dtype and shape as ONNX's backend runner checks them (4-bit outputs in
lpt's int8/uint8 container), then the values bit for bit — stricter than the runner's
assert_allclose(rtol=1e-3, atol=1e-7), and every case that runs passes it.
"""

from __future__ import annotations

import importlib

import numpy as np
import onnx
import onnx.backend.test.case.node as node_cases
import pytest
from onnx import numpy_helper

from lpt.numerics import dequantize_linear, dynamic_quantize_linear, quantize_linear
from lpt.numerics.quantize_linear import INTEGER_TYPES

OPS = {"test_quantizelinear": "QuantizeLinear", "test_dequantizelinear": "DequantizeLinear",
       "test_dynamicquantizelinear": "DynamicQuantizeLinear"}

# collect_testcases() imports and runs every operator's exporter (about 10 s here) and can filter
# by one op type per process; importing the exporter modules of these three ops registers the
# same cases in node_cases._NodeTestCases in a fraction of a second.
for _module in ("quantizelinear", "dequantizelinear", "dynamicquantizelinear"):
    importlib.import_module(f"onnx.backend.test.case.node.{_module}")
CASES = [case for case in node_cases._NodeTestCases if case.name.startswith(tuple(OPS))]

UNSUPPORTED_REASON = ("lpt quantizes to 4-, 8- and 16-bit integers with float32 scales; this case uses float8, "
                      "float4, 2-bit integers or float16")
UNSUPPORTED = {  # the cases skipped for UNSUPPORTED_REASON, by name
    "test_quantizelinear_e4m3fn", "test_quantizelinear_e5m2", "test_quantizelinear_float4e2m1",
    "test_quantizelinear_int2", "test_quantizelinear_uint2",
    "test_dequantizelinear_e4m3fn", "test_dequantizelinear_e4m3fn_float16", "test_dequantizelinear_e4m3fn_zero_point",
    "test_dequantizelinear_e5m2", "test_dequantizelinear_float4e2m1",
    "test_dequantizelinear_int2", "test_dequantizelinear_uint2",
}
MIN_CASES_RUN = 21


def _arrays(values) -> list[np.ndarray]:
    return [numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v) for v in values]


def _uses_unsupported_type(case) -> bool:
    """A tensor of a type lpt does not quantize to (float8, float4, 2-bit integers; float16 scales)."""
    inputs, outputs = case.data_sets[0]
    return any(a.dtype.name not in INTEGER_TYPES and a.dtype != np.float32 for a in _arrays(inputs + outputs))


def _op_type(case) -> str:
    return next(op for prefix, op in OPS.items() if case.name.startswith(prefix))


def _attributes(case) -> dict:
    node = case.model.graph.node[0]
    if node.op_type != _op_type(case):  # a function-expanded DynamicQuantizeLinear: no attributes
        return {}
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _run_lpt(case, inputs: list[np.ndarray]) -> list[np.ndarray]:
    op, attributes = _op_type(case), _attributes(case)
    if op == "DynamicQuantizeLinear":
        return list(dynamic_quantize_linear(*inputs))
    assert attributes.get("saturate", 1) == 1  # the attribute only matters for float8 outputs
    axis, block_size = attributes.get("axis", 1), attributes.get("block_size", 0)
    if op == "QuantizeLinear":
        output_dtype = attributes.get("output_dtype")
        if output_dtype is not None:
            output_dtype = onnx.helper.tensor_dtype_to_np_dtype(output_dtype)
        return [quantize_linear(*inputs, axis=axis, block_size=block_size, output_dtype=output_dtype)]
    return [dequantize_linear(*inputs, axis=axis, block_size=block_size)]


def _param(case):
    marks = [pytest.mark.skip(reason=UNSUPPORTED_REASON)] if _uses_unsupported_type(case) else []
    return pytest.param(case, id=case.name, marks=marks)


def test_the_cases_are_collected_and_the_skip_list_is_explicit():
    skipped = {case.name for case in CASES if _uses_unsupported_type(case)}
    assert skipped <= UNSUPPORTED, f"new cases of unsupported types: {sorted(skipped - UNSUPPORTED)}"
    assert len(CASES) - len(skipped) >= MIN_CASES_RUN
    assert {_op_type(case) for case in CASES if case.name not in skipped} == set(OPS.values())


@pytest.mark.parametrize("case", [_param(case) for case in CASES])
def test_node_case(case):
    for inputs, expected in case.data_sets:
        got = _run_lpt(case, _arrays(inputs))
        expected = _arrays(expected)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.shape == e.shape
            assert g.dtype == INTEGER_TYPES.get(e.dtype.name, (None, None, e.dtype))[2]
            np.testing.assert_array_equal(g.astype(np.float64), e.astype(np.float64))
