"""From ranges to FakeQuantize nodes (QDQ semantics, so `lpt.save` writes standard QDQ ONNX).

    activation, performance  [0, hi] → u8, scale = hi/255;  [lo<0, hi] → i8, scale = max(|lo|, hi)/127;  zp 0
    activation, mixed        u8, [min(lo, 0), max(hi, 0)] nudged so that the zero point is an integer
    weight (both presets)    i8 narrow range per output channel: scale[c] = max|w[c]|/127, zp 0, levels 255

A range narrower than MIN_RANGE (a constant activation) is widened to a tiny safe one.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir

from lpt.calibration.config import ActivationScheme, WeightScheme
from lpt.calibration.placement import ACTIVATION, Placement, QuantizationPoint
from lpt.graph.constants import const_array
from lpt.graph.fake_quantize_op import FakeQuantize
from lpt.numerics import nudged_params, symmetric_params

logger = logging.getLogger(__name__)

MIN_RANGE = 1e-6  # the narrowest activation range: a constant tensor gets [0, 1e-6] (or ±1e-6)


def safe_range(low: float, high: float, name: str = "tensor") -> tuple[float, float]:
    """[low, high] widened to hold 0 and to span at least MIN_RANGE (never a zero-width range)."""
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    if high - low < MIN_RANGE:
        logger.warning("%s: range [%g, %g] is (nearly) constant; using a tiny safe range", name, low, high)
        if low < 0 and high == 0:
            low = -MIN_RANGE
        else:
            high = low + MIN_RANGE if low < 0 else MIN_RANGE
    return low, high


def activation_params(lows, highs, scheme: ActivationScheme):
    """(scale f32, zero point, qmin, qmax) per candidate range: what an activation FQ uses (vectorized).

    Symmetric: u8 when every low ≥ 0, else i8; asymmetric: u8 nudged. `lows`/`highs` are 1-D.
    """
    lows = np.minimum(np.asarray(lows, np.float64).ravel(), 0.0)
    highs = np.maximum(np.asarray(highs, np.float64).ravel(), 0.0)
    highs = np.maximum(highs, lows + MIN_RANGE)
    if scheme.symmetric:
        signed = bool((lows < 0).any())
        absmax = np.maximum(-lows, highs) if signed else highs
        p = symmetric_params(absmax, scheme.levels, signed=signed, axis=0)
    else:
        p = nudged_params(lows, highs, 0, scheme.levels - 1, axis=0)
    return p.scale, p.zero_point.astype(np.float64), p.qmin, p.qmax


def activation_fake_quantize(low: float, high: float, scheme: ActivationScheme) -> FakeQuantize:
    """A per-tensor activation FQ for the (already safe) range [low, high]."""
    scale, zero_point, qmin, _ = activation_params([low], [high], scheme)
    dtype = np.int8 if qmin < 0 else np.uint8
    return FakeQuantize.from_qdq(scale[0], dtype(zero_point[0]), levels=scheme.levels)


DEFAULT_WEIGHTS = WeightScheme()


def weight_fake_quantize(weight: np.ndarray, axis: int | None, scheme: WeightScheme = DEFAULT_WEIGHTS) -> FakeQuantize:
    """Symmetric i8 narrow-range FQ, per index of `axis` (per tensor if None): scale = max|w|/127."""
    w = np.abs(np.asarray(weight, np.float64))
    if axis is None or w.ndim == 0 or w.shape[axis] == 1 or not scheme.per_channel:
        absmax = np.asarray(w.max() if w.size else 0.0)
        axis = None
    else:
        absmax = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1).max(axis=1)
    absmax = np.where(absmax > 0, absmax, 1.0)  # an all-zero channel: any scale represents it exactly
    p = symmetric_params(absmax, scheme.levels, signed=True, axis=axis)
    zero_point = np.zeros(p.scale.shape, np.int8)
    if axis is None:
        return FakeQuantize.from_qdq(p.scale.reshape(()), zero_point.reshape(()), levels=scheme.levels)
    return FakeQuantize.from_qdq(p.scale, zero_point, axis=axis, rank=w.ndim, levels=scheme.levels)


def fake_quantizes(placement: Placement, ranges: dict[str, tuple[float, float]], scheme: ActivationScheme,
                   weights: WeightScheme = DEFAULT_WEIGHTS) -> dict[QuantizationPoint, FakeQuantize]:
    """One FakeQuantize per point: activations from `ranges` (by tensor name; Concat groups share
    the union of their ranges), weights from the constants themselves. Points without a range
    (no finite statistics) are left out."""
    grouped: dict[int, tuple[float, float]] = {}
    for p in placement.activations:
        if p.group is not None and p.name in ranges:
            lo, hi = ranges[p.name]
            g_lo, g_hi = grouped.get(p.group, (lo, hi))
            grouped[p.group] = (min(lo, g_lo), max(hi, g_hi))
    out = {}
    for p in placement.points:
        if p.kind == ACTIVATION:
            if p.name not in ranges:
                continue
            lo, hi = grouped[p.group] if p.group is not None else ranges[p.name]
            out[p] = activation_fake_quantize(*safe_range(lo, hi, p.name), scheme)
        else:
            out[p] = weight_fake_quantize(const_array(p.value), p.axis, weights)
    return out


def insert(model: ir.Model, fqs: dict[QuantizationPoint, FakeQuantize]) -> list[ir.Node]:
    """Insert an lpt::FakeQuantize per point, read by the point's uses only (in place)."""
    graph = model.graph
    order = {node: i for i, node in enumerate(graph)}
    taken = {n.name for n in graph}
    nodes = []
    for point, fq in fqs.items():
        name = f"{point.name}/fq" if point.axis is None else f"{point.name}/fq_axis{point.axis}"
        name = _unique(name, taken)
        taken.add(name)
        node = fq.make_node(graph, point.value, name)
        node.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
        first = min((consumer for consumer, _ in point.uses), key=order.__getitem__)
        graph.insert_before(first, node)
        for consumer, index in point.uses:
            consumer.replace_input_with(index, node.outputs[0])
        nodes.append(node)
    return nodes


def _unique(name: str, taken: set) -> str:
    unique, i = name, 1
    while unique in taken:
        unique, i = f"{name}.{i}", i + 1
    return unique
