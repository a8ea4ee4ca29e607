"""Integer transposed convolution: acc = ConvTranspose(q_src − zp_src, q_wei − zp_wei), exact.

Each input pixel scatters its products over a kernel-sized patch of the output. The products
are summed by a float64 GEMM (W'ᵀ · X: every partial sum is an integer of magnitude at most
C_in·255·255 < 2^53, so float64 holds each exactly, in any order), then scattered tap by tap
into an int64 output (col2im) and cropped by the pads.
"""

from __future__ import annotations

import numpy as np

from lpt.kernels.gemm import accumulator_dtype, deviation_bound


def conv_transpose_output_shape(spatial, kernel, strides, dilations, pads, output_padding) -> tuple[int, ...]:
    """out_i = s_i·(in_i − 1) + output_padding_i + d_i·(k_i − 1) + 1 − pad_begin_i − pad_end_i (ONNX)."""
    rank = len(kernel)
    return tuple(strides[i] * (spatial[i] - 1) + output_padding[i] + dilations[i] * (kernel[i] - 1) + 1
                 - pads[i] - pads[rank + i] for i in range(rank))


def conv_transpose_accumulate(src_q, weights_q, src_zero_point=0, weight_zero_point=0, groups: int = 1,
                              strides=None, dilations=None, pads=None, output_padding=None) -> np.ndarray:
    """acc[n, oc, o] = Σ (q_src − zp_src)·(q_wei − zp_wei) over the inputs that reach o: int32 [N, OC, *out].

    weights_q is ONNX's [C_in, C_out/groups, *kernel]; weight_zero_point one value or one per
    output channel. int64 instead when the accumulators might exceed int32.
    """
    src = np.asarray(src_q)
    weights = np.asarray(weights_q)
    batch, in_channels, *spatial = src.shape
    kernel = weights.shape[2:]
    rank = len(kernel)
    strides = tuple(strides or (1,) * rank)
    dilations = tuple(dilations or (1,) * rank)
    pads = tuple(pads or (0,) * (2 * rank))
    output_padding = tuple(output_padding or (0,) * rank)
    out_per_group = weights.shape[1]
    zp_w = np.asarray(weight_zero_point, dtype=np.int64).reshape(-1)
    if zp_w.size > 1:  # per output channel: [C_out] → each group's slice, broadcast over [C_in/g, C_out/g, *k]
        zp_w = zp_w.reshape(groups, out_per_group, *(1,) * rank)
    centred_w = weights.astype(np.int64).reshape(groups, in_channels // groups, out_per_group, *kernel)
    centred_w = (centred_w - (zp_w[:, None] if zp_w.ndim > 1 else zp_w[0])).astype(np.float64)
    x = (src.astype(np.int64) - int(src_zero_point)).astype(np.float64)
    x = x.reshape(batch, groups, in_channels // groups, -1)  # [N, g, C_in/g, P]
    # cols[n, g, (oc, taps), p] = Σ_ci W'[g, ci, oc, taps] · x[n, g, ci, p]
    w_matrix = centred_w.reshape(groups, in_channels // groups, -1).transpose(0, 2, 1)
    cols = np.matmul(w_matrix, x).reshape(batch, groups * out_per_group, *kernel, *spatial)
    full = [strides[i] * (spatial[i] - 1) + dilations[i] * (kernel[i] - 1) + 1 + output_padding[i]
            for i in range(rank)]
    out = np.zeros((batch, groups * out_per_group, *full), dtype=np.int64)
    for taps in np.ndindex(*kernel):
        index = (slice(None), slice(None)) + tuple(
            slice(t * d, t * d + s * (n - 1) + 1, s) for t, d, s, n in zip(taps, dilations, strides, spatial))
        out[index] += np.rint(cols[(slice(None), slice(None)) + taps]).astype(np.int64)
    crop = (slice(None), slice(None)) + tuple(slice(pads[i], full[i] - pads[rank + i]) for i in range(rank))
    acc = out[crop]
    bound = (in_channels // groups) * int(np.prod(kernel)) * deviation_bound(src.dtype, src_zero_point) * max(
        1, int(np.abs(centred_w).max(initial=0)))
    return acc.astype(accumulator_dtype(bound))
