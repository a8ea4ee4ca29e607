"""Quantization numerics: FakeQuantize, ONNX (De)QuantizeLinear, and integer quantization parameters."""

from lpt.numerics.fake_quantize import fake_quantize, fake_quantize_levels, fake_quantize_spec
from lpt.numerics.params import (
    QuantParams,
    interval_to_params,
    nudged_params,
    params_to_interval,
    symmetric_params,
)
from lpt.numerics.quantize_linear import dequantize_linear, dynamic_quantize_linear, quantize_linear

__all__ = [
    "QuantParams", "dequantize_linear", "dynamic_quantize_linear", "fake_quantize", "fake_quantize_levels",
    "fake_quantize_spec", "interval_to_params", "nudged_params", "params_to_interval", "quantize_linear",
    "symmetric_params",
]
