"""ONNX's backend node test cases for ConvInteger, MatMulInteger, QLinearConv and QLinearMatMul, through the kernels.

Integer outputs are compared exactly (dtype, shape, values), as ONNX's backend runner does for them.
"""

from __future__ import annotations

import importlib

import numpy as np
import onnx
import onnx.backend.test.case.node as node_cases
import pytest
from onnx import numpy_helper

from lpt.kernels import conv_accumulate, matmul_accumulate, pack_conv, qlinear_multiplier, qlinear_output

OPS = ("ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul")

# collect_testcases() runs every operator's exporter (about 10 s here) and filters by op type only on
# its first call in a process; importing these four exporter modules registers their cases in
# node_cases._NodeTestCases in a fraction of a second (as tests/numerics does for its ops).
for _module in ("convinteger", "matmulinteger", "qlinearconv", "qlinearmatmul"):
    importlib.import_module(f"onnx.backend.test.case.node.{_module}")
CASES = [case for case in node_cases._NodeTestCases if case.model.graph.node[0].op_type in OPS]

UNSUPPORTED_REASON = "float16 scales: the kernels' f32 arithmetic is the contract (DESIGN.md §2), not f16's"
MIN_CASES_RUN = 8  # 2 ConvInteger, 1 MatMulInteger, 1 QLinearConv, 4 QLinearMatMul (u8/s8, 2-D/3-D, f32 scales)


def _arrays(values) -> list[np.ndarray]:
    return [numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v) for v in values]


def _has_float16_scales(case) -> bool:
    return any(a.dtype == np.float16 for a in _arrays(case.data_sets[0][0]))


def _inputs_by_position(case, arrays) -> list[np.ndarray | None]:
    """The op's inputs by their position in its signature, None where the node leaves one out."""
    present = iter(arrays)
    inputs = [next(present) if name else None for name in case.model.graph.node[0].input]
    return inputs + [None] * (9 - len(inputs))


def _conv_window(attributes: dict) -> dict:
    assert attributes.get("auto_pad", "NOTSET") == "NOTSET", "explicit pads only"
    return dict(groups=attributes.get("group", 1), strides=attributes.get("strides"),
                dilations=attributes.get("dilations"), pads=attributes.get("pads"))


def _run(case, arrays: list[np.ndarray]) -> np.ndarray:
    node = case.model.graph.node[0]
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    inputs = _inputs_by_position(case, arrays)
    zero = np.zeros((), dtype=np.int64)
    if node.op_type == "ConvInteger":
        x, w, x_zp, w_zp = inputs[:4]
        x_zp = 0 if x_zp is None else int(x_zp)
        return conv_accumulate(x, pack_conv(w, zero if w_zp is None else w_zp, x_zp, **_conv_window(attributes)))
    if node.op_type == "MatMulInteger":
        a, b, a_zp, b_zp = inputs[:4]
        return matmul_accumulate(a, zero if a_zp is None else a_zp, b, zero if b_zp is None else b_zp)
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias = inputs[:9]
    qmin, qmax = int(np.iinfo(y_zp.dtype).min), int(np.iinfo(y_zp.dtype).max)
    multiplier = qlinear_multiplier(x_scale, w_scale, y_scale)
    if node.op_type == "QLinearConv":
        acc = conv_accumulate(x, pack_conv(w, w_zp, int(x_zp), **_conv_window(attributes)))
        return qlinear_output(acc, multiplier, y_zp, qmin, qmax, bias=bias)
    return qlinear_output(matmul_accumulate(x, x_zp, w, w_zp), multiplier, y_zp, qmin, qmax, axis=-1)


def _param(case):
    marks = [pytest.mark.skip(reason=UNSUPPORTED_REASON)] if _has_float16_scales(case) else []
    return pytest.param(case, id=case.name, marks=marks)


def test_the_cases_are_collected_and_the_skip_filter_is_named():
    ran = [case for case in CASES if not _has_float16_scales(case)]
    assert len(ran) >= MIN_CASES_RUN
    assert {case.model.graph.node[0].op_type for case in ran} == set(OPS)


@pytest.mark.parametrize("case", [_param(case) for case in CASES])
def test_node_case(case):
    for inputs, expected in case.data_sets:
        (expected,) = _arrays(expected)
        got = _run(case, _arrays(inputs))
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
