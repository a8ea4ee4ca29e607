"""lpt's int8 kernels: plain functions over arrays, exact integer arithmetic, f32 where DESIGN.md §2 names it.

Heavy ops are prepared once and run many times (pack_conv → conv_accumulate, pack_matmul_weights →
matmul_accumulate_packed); accumulators then go through output_stage (oneDNN's scheme) or
qlinear_output (ONNX QLinear*). Each kernel has a slow twin in lpt.kernels.reference.
"""

from lpt.kernels.conv import PackedConv, conv_accumulate, pack_conv
from lpt.kernels.conv_transpose import conv_transpose_accumulate, conv_transpose_output_shape
from lpt.kernels.float_ops import (average_pool, convolution_1d, dense, extreme_over_middle_axes, folded_convolution_1d,
                                   gelu, hard_sigmoid, hard_swish, layer_norm, mean_over_axis_1, mean_over_last_axis, moment_layer_norm, relu,
                                   slope_and_clip, softmax, tanh_gelu)
from lpt.kernels.elementwise import add_q, clip_q, concat_q, dequantize_shifted, join_q, mul_q, relu_q
from lpt.kernels.gemm import exact_chunk, integer_matmul
from lpt.kernels.matmul import PackedMatMul, matmul_accumulate, matmul_accumulate_packed, pack_matmul_weights
from lpt.kernels.output_stage import (ELEMENTWISE_POST_OPS, Clip, FakeQuantize, Gelu, HardSwish, LeakyRelu, PostOp, Relu,
                                      Sigmoid, Silu, Sum, dequantization_multiplier, output_stage, qlinear_multiplier, qlinear_output)
from lpt.kernels.pooling import average_pool_q, global_average_pool, global_average_pool_q, max_pool_q, upsample_nearest
from lpt.kernels.quantize import (dequantize, fq_input_affine, one_hot_levels, quantize, quantize_fq,
                                  quantize_multiplier, requantize, requantize_fixed_point)
from lpt.kernels.window import Window

__all__ = [
    "ELEMENTWISE_POST_OPS", "Clip", "FakeQuantize", "Gelu", "HardSwish", "LeakyRelu", "PackedConv", "PackedMatMul", "PostOp",
    "Relu", "Sigmoid", "Silu", "Sum", "Window",
    "add_q", "average_pool", "average_pool_q", "clip_q", "concat_q", "conv_accumulate", "convolution_1d", "conv_transpose_accumulate",
    "conv_transpose_output_shape", "dense", "folded_convolution_1d", "dequantization_multiplier", "dequantize", "dequantize_shifted", "exact_chunk",
    "extreme_over_middle_axes", "fq_input_affine", "gelu", "global_average_pool", "global_average_pool_q", "hard_sigmoid", "hard_swish", "integer_matmul", "join_q",
    "layer_norm", "matmul_accumulate", "matmul_accumulate_packed", "max_pool_q", "mean_over_axis_1", "mean_over_last_axis", "moment_layer_norm", "mul_q",
    "one_hot_levels",
    "output_stage", "pack_conv", "pack_matmul_weights", "qlinear_multiplier", "qlinear_output", "quantize",
    "quantize_fq", "quantize_multiplier", "relu", "relu_q", "requantize", "requantize_fixed_point", "slope_and_clip", "softmax",
    "tanh_gelu",
    "upsample_nearest",
]
