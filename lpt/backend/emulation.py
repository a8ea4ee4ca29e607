"""`compile_model(..., emulate="avx2")`: int8 layers computed as an AVX2 CPU without VNNI computes them.

onnxruntime's u8 × s8 kernels there add pairs of products in a saturating int16 (lpt.kernels.saturating
says which pairs, and what is exact). An emulated layer computes lpt's exact accumulator, adds the
corrections sat16(p) − p of the pairs that saturate, and runs the same output stage; it also
counts, per output channel, whether any accumulator saturated, and measures what saturation cost
at the layer's output (the same input, exact against saturated), so a report can name the layers.
Layers the saturating kernel does not run (an int8 source, uint8 weights, a depthwise
convolution, a transposed convolution) run exactly, as on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from lpt import kernels
from lpt.backend.step import Int8Layer
from lpt.kernels.saturating import INT16_MAX, ConvPairSaturation, PairSaturation
from lpt.metrics import Agreement

EMULATIONS = ("avx2",)


@dataclass(frozen=True)
class Emulation:
    """What compile_model(emulate=...) emulates: "avx2" is Emulation(). A `limit` below 2^15 − 1
    saturates pair sums earlier than the CPU does: a margin, for asking which channels come close."""

    cpu: str = "avx2"
    limit: int = INT16_MAX
    measure: bool = True  # the SQNR of each layer's output, saturated against exact (a pass over every output)

    @classmethod
    def of(cls, emulate: str | Emulation) -> Emulation:
        if isinstance(emulate, Emulation):
            return emulate
        if emulate not in EMULATIONS:
            raise ValueError(f"unknown emulation {emulate!r}: one of {', '.join(EMULATIONS)}")
        return cls(emulate)


@dataclass
class LayerSaturation:
    """What saturation did to one layer over the batches it ran: channels hit, and the SQNR of its
    output with saturation against its exact output (+inf when nothing saturated)."""

    op: str
    channels: int
    saturated: np.ndarray  # bool [channels]: some accumulator of that channel saturated
    changed: np.ndarray  # bool [channels]: and its output moved by more than 1 LSB (f32 outputs: at all);
    # a Relu hides a clamped negative sum, and 1 LSB is what two exact runtimes may differ by anyway
    peak: np.ndarray  # int64 [channels]: the largest |pair sum| seen, where one passed the limit
    accumulators: int = 0  # accumulators computed
    saturated_accumulators: int = 0
    agreement: Agreement = field(default_factory=Agreement)

    @property
    def saturated_channels(self) -> int:
        return int(self.saturated.sum())

    @property
    def changed_channels(self) -> int:
        return int(self.changed.sum())

    @property
    def sqnr_db(self) -> float:
        return self.agreement.sqnr_db


class SaturatingLayer:
    """run(*runtime inputs) -> [output] of an Int8Layer whose accumulator saturates as AVX2's u8 × s8 kernel does."""

    def __init__(self, layer: Int8Layer, accumulate, pairs: PairSaturation | ConvPairSaturation | None,
                 limit: int = INT16_MAX, measure: bool = True):
        self.layer = layer
        self.limit = limit
        self.measure = measure
        self.accumulate = accumulate  # exact: run(*arrays) -> [acc]
        self.pairs = pairs  # None: a matmul whose right-hand side arrives at run time
        channels = layer.weights.shape[0 if layer.op == "conv" else -1] if layer.weights is not None else 0
        self.statistics = LayerSaturation(layer.op, channels, np.zeros(channels, bool), np.zeros(channels, bool),
                                          np.zeros(channels, np.int64))

    def __call__(self, *arrays):
        exact = self.accumulate(*arrays)[0]
        corrections = self._corrections(*arrays)
        if not self.measure and self._by_rows:
            return [self._sparse(exact, corrections)]
        hit = corrections != 0
        saturated = exact if not hit.any() else (exact + corrections).astype(exact.dtype)
        out = self._output(saturated)
        self._count(hit, exact, out)
        return [out]

    @property
    def _by_rows(self) -> bool:
        """Whether the output stage can run on some rows alone ([rows, channels]): per-channel values
        only, elementwise post-ops, a per-tensor destination (or none)."""
        layer = self.layer
        return ((layer.destination is None or layer.destination.output_stage_destination() is not None)
                and all(isinstance(op, kernels.ELEMENTWISE_POST_OPS) for op in layer.post_ops))

    def _sparse(self, exact: np.ndarray, corrections: np.ndarray) -> np.ndarray:
        """The saturated output, its statistics counted on the rows (one output position, every channel)
        that some correction touches: elsewhere the exact and the saturated outputs are the same values,
        so the exact output stage runs on those rows only, not on the whole tensor a second time."""
        stats, axis = self.statistics, self.layer.channel_axis
        channels = exact.shape[axis]
        touched = np.moveaxis(corrections, axis, -1).reshape(-1, channels) != 0
        rows = np.flatnonzero(touched.any(axis=1))
        if stats.saturated.size != channels:  # a right-hand side known only now
            stats.channels = channels
            stats.saturated, stats.changed = np.zeros(channels, bool), np.zeros(channels, bool)
            stats.peak = np.zeros(channels, np.int64)
        stats.accumulators += touched.size
        if not rows.size:
            return self._output(exact)
        hit = touched[rows]
        stats.saturated_accumulators += int(hit.sum())
        before = np.moveaxis(exact, axis, -1).reshape(-1, channels)[rows]  # [rows, channels]: a copy
        out = self._output((exact + corrections).astype(exact.dtype, copy=False))
        after = np.moveaxis(out, axis, -1).reshape(-1, channels)[rows]
        reference = self._output(before)  # channels on axis 1 = −1 of [rows, channels], as in the layer's output
        moved = (np.abs(reference.astype(np.int32) - after) > 1 if self.layer.destination is not None
                 else reference != after)
        stats.saturated |= hit.any(axis=0)
        stats.changed |= moved.any(axis=0)
        return out

    def _corrections(self, *arrays) -> np.ndarray:
        src, peaks = arrays[0], self.statistics.peak
        if self.layer.op == "conv":
            return self.pairs.corrections(src, int(self.layer.src_zero_point), peaks)
        rows = np.ascontiguousarray(src).reshape(-1, src.shape[-1])
        if self.pairs is not None:
            return self.pairs.corrections(rows, peaks).reshape(src.shape[:-1] + (self.pairs.columns,))
        b = np.asarray(arrays[1])
        if b.ndim == 2:
            return PairSaturation.of(b, self.limit).corrections(rows).reshape(src.shape[:-1] + (b.shape[-1],))
        a, b = np.broadcast_arrays(src[..., None], b[..., None, :, :])  # batched: pair by pair of matrices
        a, b = a[..., 0], b[..., 0, :, :]
        out = np.empty(a.shape[:-1] + (b.shape[-1],), np.int32)
        for index in np.ndindex(a.shape[:-2]):
            pairs = PairSaturation.of(np.ascontiguousarray(b[index]), self.limit)
            out[index] = pairs.corrections(np.ascontiguousarray(a[index]))
        return out

    def _output(self, acc: np.ndarray) -> np.ndarray:
        layer = self.layer
        if layer.multiplier is None:
            return acc
        destination = layer.destination
        fused = destination.output_stage_destination() if destination is not None else None
        out = kernels.output_stage(acc, layer.multiplier, layer.bias, layer.post_ops, axis=layer.channel_axis,
                                   **(fused or {}))
        return destination.quantize(out, in_place=True) if destination is not None and not fused else out

    def _count(self, hit: np.ndarray, exact: np.ndarray, out: np.ndarray) -> None:
        stats = self.statistics
        if stats.saturated.size != hit.shape[self.layer.channel_axis]:  # a right-hand side known only now
            stats.channels = hit.shape[self.layer.channel_axis]
            stats.saturated, stats.changed = np.zeros(stats.channels, bool), np.zeros(stats.channels, bool)
            stats.peak = np.zeros(stats.channels, np.int64)
        stats.accumulators += hit.size
        saturated_count = int(hit.sum())
        stats.saturated_accumulators += saturated_count
        reference = out
        if saturated_count:
            reference = self._output(exact)
            stats.saturated |= self._per_channel(hit)
            moved = (np.abs(reference.astype(np.int32) - out) > 1 if self.layer.destination is not None
                     else reference != out)
            stats.changed |= self._per_channel(moved)
        if self.measure:
            read = self.layer.destination.dequantize if self.layer.destination is not None else (lambda x: x)
            stats.agreement.add(read(reference), read(out))

    def _per_channel(self, mask: np.ndarray) -> np.ndarray:
        axis = self.layer.channel_axis % mask.ndim
        return np.moveaxis(mask, axis, 0).reshape(mask.shape[axis], -1).any(axis=1)


def saturating_layer_function(layer: Int8Layer, exact_function, emulate: str | Emulation):
    """(run, engine) for `layer` under `emulate`, or None where the emulated CPU computes it exactly.

    `exact_function(layer)` gives lpt's (run, engine) for a layer; it is called here with the
    output stage taken off (multiplier None), for the exact accumulator.
    """
    emulation = Emulation.of(emulate)
    weights = layer.weights
    if layer.op == "conv_transpose" or (weights is not None and weights.dtype != np.int8):
        return None
    if layer.op == "conv":
        pairs = ConvPairSaturation.of(weights, layer.attribute("group", 1), layer.attribute("strides"),
                                      layer.attribute("dilations"), layer.attribute("pads"),
                                      layer.attribute("auto_pad", "NOTSET"), emulation.limit)
        if not pairs.count:
            return None
    else:
        pairs = PairSaturation.of(weights, emulation.limit) if weights is not None and weights.ndim == 2 else None
        if weights is not None and (pairs is None or not pairs.count):
            return None  # batched constant weights: not an MLAS GEMM; or no pair can saturate
    accumulate, engine = exact_function(replace(layer, multiplier=None, bias=None, post_ops=(), destination=None))
    if accumulate is None:
        return None
    emulated = SaturatingLayer(layer, accumulate, pairs, emulation.limit, emulation.measure)

    def run(*arrays):
        if arrays[0].dtype != np.uint8 or (layer.weights is None and arrays[1].dtype != np.int8):
            return [emulated._output(accumulate(*arrays)[0])]  # s8 × s8, u8 × u8: exact on AVX2
        return emulated(*arrays)

    run.statistics = emulated.statistics
    return run, f"{engine}, emulating {emulation.cpu}"


@dataclass(frozen=True)
class SaturatedLayer:
    """One emulated layer of a plan run: how many output channels saturated on the data, how many of
    those moved the layer's output by more than 1 LSB, and the SQNR of its output with saturation
    against exact (same input; +inf when nothing moved)."""

    name: str  # the fp32 layer it computes (the int8 node without its "/integer")
    op: str
    channels: int
    saturated_channels: int
    changed_channels: int
    saturated_share: float  # of its accumulators
    sqnr_db: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def saturation_report(plan) -> list[SaturatedLayer]:
    """The emulated layers of `plan` (compiled with emulate=...) after runs, in plan order."""
    layers = []
    for step in plan.steps:
        stats = getattr(step.run, "statistics", None)
        if stats is None:
            continue
        share = stats.saturated_accumulators / stats.accumulators if stats.accumulators else 0.0
        name = step.nodes[0].removesuffix("/integer")  # the fp32 layer it came from
        layers.append(SaturatedLayer(name, stats.op, stats.channels, stats.saturated_channels,
                                     stats.changed_channels, share, stats.sqnr_db))
    return layers
