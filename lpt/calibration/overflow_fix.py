"""Overflow fix: weights whose int16 pair sums do not saturate on an AVX2 CPU, where the data needs it.

On a CPU without VNNI, onnxruntime's u8 × s8 kernels add two products in a saturating int16
(lpt.kernels.saturating). A pair can saturate only if its weights share a sign and
|b0| + |b1| ≥ 129: 7-bit weights, |q| ≤ 63, never do. With per-channel symmetric weights every
channel has a ±127, so that worst case flags every channel; the data decides instead.

    none    nothing changes
    first   7-bit weights (levels 127: [-63, 63], scale = max|w|/63) on the first quantized layer
    all     7-bit weights on every quantized layer (NNCF's OverflowFix "enable"; onnxruntime's
            reduce_range does the same to every weight)
    auto    the FQ model's int8 graph runs on the calibration samples as an AVX2 CPU computes it
            (lpt.backend.emulation), with pair sums saturating at HEADROOM·(2^15 − 1), a margin
            for samples not seen. Each output channel whose output moved by more than 1 LSB gets
            scale[c] = max|w[c]|/q[c] in the same 8-bit FQ, q[c] the largest that keeps its
            largest pair sum under that limit (63 ≤ q < 127; of those, the grid rounding w[c]
            best). Narrowing a layer moves the next layer's inputs, so the check runs again on the
            narrowed model until no channel moves (at most MAX_ROUNDS passes over the data).

1 LSB: two exact runtimes may round a tie apart anyway, and a Relu hides a clamped negative sum;
narrowing such a channel would cost precision for nothing.

Reordering the reduction axis instead, so that large weights pair with small or opposite ones, is
legal only if the activation's axis is permuted the same way (the producer's output channels: a
graph change). For a convolution with one input channel, where the bundled models saturate most,
a pair spans two kernel positions, which no channel permutation reorders; README has what the
other layers would allow. lpt does not reorder.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from lpt.calibration.config import OverflowFix
from lpt.calibration.placement import WEIGHT, Placement, QuantizationPoint
from lpt.calibration.progress import sample_progress
from lpt.errors import QuantizationError
from lpt.graph.constants import const_array
from lpt.graph.fake_quantize_op import FakeQuantize
from lpt.kernels.saturating import INT16_MAX

logger = logging.getLogger(__name__)

NARROW_QMAX = 63  # |b0| + |b1| ≤ 126 < 129: no u8 pair sum reaches ±2^15
MAX_ROUNDS = 3  # emulated passes over the calibration data (auto)
EMULATION_BUDGET = 256 << 20  # bytes an emulated run's layer arrays may take (see _run_in_parts)
HEADROOM = 0.8  # auto emulates pair sums saturating at HEADROOM·(2^15 − 1): below 1, a margin for unseen data


@dataclass(frozen=True)
class NarrowedLayer:
    """One weight whose channels got a coarser grid, and what that cost: the SQNR of the quantized
    weights against the fp32 ones, as calibrated (8-bit) and with the narrowing."""

    weight: str
    layers: tuple[str, ...]  # the Conv/MatMul/Gemm nodes reading it
    channels: int
    narrowed: int
    smallest_qmax: int  # the narrowest channel's integers lie within ±smallest_qmax (63: 7 bits)
    weight_sqnr_db: float  # 8-bit
    narrowed_sqnr_db: float

    @property
    def cost_db(self) -> float:
        return self.weight_sqnr_db - self.narrowed_sqnr_db


def weight_points(placement: Placement) -> list[QuantizationPoint]:
    """The weight points of the layers' right-hand sides (input 1), in graph order."""
    return [p for p in placement.weights if any(index == 1 for _, index in p.uses)]


def channel_masks(mode: OverflowFix, placement: Placement) -> dict[str, np.ndarray | bool]:
    """What `mode` narrows before any data: {weight name: True} (the whole weight on 7 bits) for first
    and all; nothing for none and auto. Auto adds {weight name: qmax per channel} from the data."""
    points = weight_points(placement)
    if mode == OverflowFix.ALL:
        return {p.name: True for p in points}
    if mode == OverflowFix.FIRST and points:
        order = {node: i for i, node in enumerate(placement.layers)}
        first = min(points, key=lambda p: min(order.get(n, len(order)) for n, _ in p.uses))
        return {first.name: True}
    return {}


def narrow(fqs: dict[QuantizationPoint, FakeQuantize], masks: dict[str, np.ndarray | bool]
           ) -> dict[QuantizationPoint, FakeQuantize]:
    """The FQs with the weights of `masks` narrowed: True puts the whole weight on 7 bits (levels 127,
    [-63, 63]); an array gives each channel c its own largest integer qmax[c] ≤ 127 in the same
    255-level FQ (scale[c] = max|w[c]|/qmax[c]), 127 leaving the channel as it was."""
    out = dict(fqs)
    for point, fq in fqs.items():
        mask = masks.get(point.name) if point.kind == WEIGHT else None
        if mask is None or (mask is not True and np.all(np.asarray(mask) >= 127)):
            continue
        if fq.scale is None or fq.levels != 255 or not fq.is_symmetric:
            raise QuantizationError(f"{point.name}: the overflow fix needs symmetric 255-level weights, "
                                    f"not levels {fq.levels}")
        if mask is True:
            scale, levels = fq.scale * np.float32(127 / NARROW_QMAX), 127
        else:
            qmax = _qmax(const_array(point.value), point.axis, np.asarray(mask).reshape(-1), fq.scale.size)
            scale, levels = fq.scale * (np.float32(127) / qmax.astype(np.float32)).reshape(fq.scale.shape), 255
        out[point] = FakeQuantize.from_qdq(scale.astype(np.float32), fq.zero_point, axis=fq.axis,
                                           rank=np.ndim(const_array(point.value)), levels=levels)
    return out


def _qmax(weight: np.ndarray, axis: int | None, caps: np.ndarray, scales: int) -> np.ndarray:
    """The qmax per scale of the FQ: per channel, or one for a per-tensor FQ (under every channel's cap)."""
    if scales == 1:
        return _best_qmax(weight, None, np.min(caps, keepdims=True))
    return _best_qmax(weight, axis, caps)


def _best_qmax(weight: np.ndarray, axis: int | None, caps: np.ndarray) -> np.ndarray:
    """Per channel, the qmax in [NARROW_QMAX, cap] whose grid max|w[c]|/qmax rounds w[c] with the least
    squared error (127 where the cap is 127). Any qmax under the cap keeps the pair sums under the
    limit; a first layer has 9 or 27 weights per channel, whose rounding errors a larger qmax does not
    always shrink."""
    w = np.asarray(weight, np.float64)
    rows = (w.reshape(1, -1) if axis is None else np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1))
    best = np.asarray(caps, np.int64).copy()
    for c in np.flatnonzero(best < 127):
        row = rows[c]
        absmax = np.abs(row).max(initial=0.0)
        if absmax == 0:
            continue
        candidates = np.arange(NARROW_QMAX, best[c] + 1)
        scales = absmax / candidates
        errors = ((np.round(row[None, :] / scales[:, None]) * scales[:, None] - row[None, :]) ** 2).sum(axis=1)
        best[c] = candidates[int(np.argmin(errors))]
    return best


def describe(fqs: dict[QuantizationPoint, FakeQuantize], narrowed: dict[QuantizationPoint, FakeQuantize],
             masks: dict[str, np.ndarray | bool]) -> tuple[NarrowedLayer, ...]:
    """One NarrowedLayer per weight that `masks` narrowed, in graph order."""
    layers = []
    for point, fq in fqs.items():
        mask = masks.get(point.name) if point.kind == WEIGHT else None
        if mask is None or narrowed[point] is fq:
            continue
        w = const_array(point.value)
        channels = w.shape[point.axis] if point.axis is not None and w.ndim else 1
        qmax = (np.full(channels, NARROW_QMAX) if mask is True
                else _qmax(w, point.axis, np.asarray(mask).reshape(-1), fq.scale.size))
        count = int(np.sum(np.broadcast_to(qmax, (channels,)) < 127))  # a per-tensor grid narrows every channel
        layers.append(NarrowedLayer(point.name, tuple(dict.fromkeys(n.name for n, _ in point.uses)), channels, count,
                                    int(qmax.min()), _sqnr(w, fq.apply(w)), _sqnr(w, narrowed[point].apply(w))))
    return tuple(layers)


def _sqnr(reference: np.ndarray, quantized: np.ndarray) -> float:
    noise = float(np.sum((reference.astype(np.float64) - quantized) ** 2))
    signal = float(np.sum(reference.astype(np.float64) ** 2))
    return float("inf") if noise == 0 else float(10 * np.log10(signal / noise)) if signal else float("-inf")


def saturating_channels(fq_model: ir.Model, placement: Placement, data, masks: dict[str, np.ndarray | bool],
                        fqs: dict[QuantizationPoint, FakeQuantize], *, quiet: bool = False, threads: int = 0
                        ) -> dict[str, np.ndarray] | None:
    """{weight name: qmax per output channel} for the weights of layers whose output moved through pair
    saturation when `fq_model` (holding `fqs`, narrowed by `masks`) ran on `data` (a CalibrationData)
    as an AVX2 CPU runs its int8 graph, with pair sums saturating at HEADROOM·(2^15 − 1).

    A moved channel whose largest risky pair sum was `peak` with integers up to qmax now gets
    qmax·(limit − 510)/peak: scaling a weight by r changes each integer by at most r·|q| + 1, so a
    pair sum by at most r·|p| + 2·255. Never below NARROW_QMAX, which no data can saturate.
    None, with a warning, where the int8 graph cannot run on the data: the weights stay as they are."""
    from lpt.backend import compile_model
    from lpt.backend.emulation import Emulation
    from lpt.model_io import clone
    from lpt.normalize import normalize
    from lpt.transformations.pipeline import transform

    limit = int(HEADROOM * INT16_MAX)
    try:
        int8 = clone(fq_model)
        normalize(int8)
        transform(int8)
        plan = compile_model(int8, threads=threads, emulate=Emulation(limit=limit, measure=False))
        _run_in_parts(plan, data, quiet)
    except Exception as err:  # noqa: BLE001 - a step the user did not ask for must not end the calibration
        line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        logger.warning("overflow fix skipped: the int8 graph did not run on the data (%s); weights stay 8-bit", line)
        return None
    moved = {}
    for step in plan.steps:
        statistics = getattr(step.run, "statistics", None)
        if statistics is not None and step.nodes and step.nodes[0].endswith("/integer"):
            moved[step.nodes[0][: -len("/integer")]] = statistics
    proposals = {}
    for point in weight_points(placement):
        fq = fqs.get(point)
        for node, index in point.uses:
            statistics = moved.get(node.name)
            if (index != 1 or statistics is None or fq is None or not statistics.changed.any()
                    or masks.get(point.name) is True):
                continue
            weight = const_array(point.value)
            if point.axis is None or weight.shape[point.axis] != statistics.channels:
                continue  # not the layer's output channels (a batched constant, say): left as it is
            changed, peak = statistics.changed, np.maximum(statistics.peak, 1)
            absmax = np.abs(np.moveaxis(weight, point.axis, 0).reshape(statistics.channels, -1)).max(axis=1)
            current = np.round(absmax / fq.scale.reshape(-1)).astype(np.int64)  # the integers the FQ holds now
            cap = np.asarray(masks.get(point.name, np.full(changed.size, 127)), np.int64)
            wanted = np.floor(current * (limit - 510) / peak).astype(np.int64)
            lower = np.clip(wanted, NARROW_QMAX, np.maximum(current - 1, NARROW_QMAX))
            qmax = np.where(changed, np.minimum(lower, cap), cap)
            proposals[point.name] = np.minimum(proposals.get(point.name, qmax), qmax)
    logger.info("overflow fix: saturation moved %d output channels in %d weights on the data (limit %d)",
                sum(int(np.sum(q < np.asarray(masks.get(n, 127)))) for n, q in proposals.items()), len(proposals), limit)
    return proposals


def _run_in_parts(plan, data, quiet: bool) -> None:
    """Run `plan` over every sample of `data`, a few samples at a time: an emulated layer holds about
    five arrays of its output's size at once (int32 accumulators, corrections, two output stages), and
    a batch of 32 spectrograms through a 128-channel convolution would be gigabytes of them."""
    per_run = None
    with sample_progress("overflow fix", data.total, quiet) as advance:
        for batch in data.batches():
            total, start = data.samples_in(batch), 0
            if data.fixed_batch:
                plan.run(batch)
                advance(total)
                continue
            while start < total:
                if per_run is None:  # the first sample alone, keeping its tensors to size the runs
                    kept = plan.run(data.part(batch, start, start + 1), keep=True)
                    largest = max((v.size for k, v in kept.items() if k not in plan.constants
                                   and isinstance(v, np.ndarray)), default=1)
                    per_run, stop = max(1, EMULATION_BUDGET // (5 * 4 * largest)), start + 1
                else:
                    stop = min(total, start + per_run)
                    plan.run(data.part(batch, start, stop))
                advance(stop - start)
                start = stop


def merge(masks: dict[str, np.ndarray | bool], more: dict[str, np.ndarray] | None) -> tuple[dict, bool]:
    """masks with `more`'s smaller qmax taken, and whether any channel narrowed further."""
    merged, grew = dict(masks), False
    for name, qmax in (more or {}).items():
        old = merged.get(name)
        if old is True:
            continue
        new = qmax if old is None else np.minimum(old, qmax)
        grew |= bool(np.any(new < (127 if old is None else old)))
        merged[name] = new
    return merged, grew
