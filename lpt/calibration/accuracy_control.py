"""Accuracy control (NNCF's quantize_with_accuracy_control): revert the most harmful layers to f32
until a target holds on validation data, without calibrating again.

    target   top-1 drop ≤ max_drop points (labels needed), or output SQNR ≥ min_sqnr dB (worst output)
    rank     once, on the default quantization: a layer costs the SQNR of its worst input FQ's own
             quantization (lpt.compare per layer: that FQ applied to the fp32 tensor), worst first
    search   revert the k worst layers, k = 1, 2, 4, … until the target holds, bisect down to the least
             such k, then give back each of those k layers (least harmful first) the target does not need
    revert   each trial edits a copy of calibrate()'s FQ model: the layers' FQ uses read the float
             tensor again and their biases are fp32's; every other FQ and bias is left as calibrated

NNCF reverts one group at a time and ranks again after each (a full evaluation per layer); ranking
once and searching on prefixes takes about 2·log2(layers) trials to find the count, plus one per
reverted layer to prune. A layer is a node reading activation FQs (Conv, ConvTranspose, MatMul, Gemm,
or an Add/Mul of two quantized branches) with its weight FQs, found by placing FQs again on a fresh
copy of the fp32 model (the placement calibrate() made, by node names). Layers that read one FQ
through a shared precision-preserving op (a MaxPool feeding two convs) revert together: that one FQ
serves both.

The search stops starting trials when the next one is expected to end past `max_time`, and the
result is always a model: the one meeting the target with the fewest reverts, else the best measured.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from lpt.backend import compile_model
from lpt.calibration import _working_copy
from lpt.calibration.bias_correction import bias_targets
from lpt.calibration.config import CalibrationConfig
from lpt.calibration.data import CalibrationData, input_specs, split_labels
from lpt.calibration.placement import ACTIVATION, place
from lpt.compare import compare
from lpt.errors import QuantizationError
from lpt.graph.constants import add_constant, const_array
from lpt.graph.fake_quantize_op import is_fake_quantize
from lpt.graph.ops import PRECISION_PRESERVING_OPS
from lpt.model_io import clone
from lpt.transformations.pipeline import transform

logger = logging.getLogger(__name__)

DEFAULT_MAX_TIME = 600.0  # seconds: a bound a user notices, long enough for a few dozen trials on small models
LATENCY_ROUNDS, LATENCY_REPEATS = 3, 5  # timed runs of one sample per model (median): an estimate, not a benchmark

Use = tuple[str, str, int]  # (FQ'd tensor, consumer node, input index), by name: valid on every fresh copy


@dataclass(frozen=True)
class Layer:
    """What one revert undoes: the FQ uses feeding `nodes` (activations and weights)."""

    nodes: tuple[str, ...]
    ops: tuple[str, ...]
    uses: frozenset[Use]
    tensor: str | None = None  # its worst activation FQ (by the ranking), None if none was measured
    sqnr_db: float = math.inf  # that FQ's own cost: its quantization alone, against the fp32 tensor

    @property
    def name(self) -> str:
        return "+".join(self.nodes)

    @property
    def op(self) -> str:
        return "+".join(dict.fromkeys(self.ops))

    def to_dict(self) -> dict:
        return {"node": self.name, "op": self.op, "tensor": self.tensor, "sqnr_db": self.sqnr_db}


@dataclass(frozen=True)
class Measure:
    """The int8 model (on lpt's backend) against fp32 on the evaluation data."""

    sqnr_db: float  # of the worst output
    top1: float | None = None  # with labels: the int8 model's top-1 (fraction)
    reference_top1: float | None = None  # the fp32 model's

    @property
    def drop_pt(self) -> float | None:
        """Top-1 points lost (negative: gained)."""
        return None if self.top1 is None else 100 * (self.reference_top1 - self.top1)

    def to_dict(self) -> dict:
        return {"sqnr_db": self.sqnr_db, "top1": self.top1, "reference_top1": self.reference_top1,
                "drop_pt": self.drop_pt}


@dataclass(frozen=True)
class Target:
    max_drop: float | None = None  # top-1 points
    min_sqnr: float | None = None  # dB

    def __post_init__(self):
        if (self.max_drop is None) == (self.min_sqnr is None):
            raise QuantizationError("accuracy control needs one target: max_drop (top-1 points) or min_sqnr (dB)")
        value = self.max_drop if self.max_drop is not None else self.min_sqnr
        if not math.isfinite(value):
            raise QuantizationError(f"accuracy target {value}: must be a finite number")

    def holds(self, m: Measure) -> bool:
        if self.max_drop is not None:
            return m.drop_pt <= self.max_drop + 1e-9  # one sample's worth is a fraction: no float ties
        return m.sqnr_db >= self.min_sqnr

    def score(self, m: Measure) -> float:
        """Higher is better: what the best model is chosen by when the target is missed."""
        return -m.drop_pt if self.max_drop is not None else m.sqnr_db

    def describe(self) -> str:
        if self.max_drop is not None:
            return f"top-1 drop ≤ {self.max_drop:g} pt"
        return f"output SQNR ≥ {self.min_sqnr:g} dB"

    def to_dict(self) -> dict:
        return {"max_drop_pt": self.max_drop, "min_sqnr_db": self.min_sqnr}


@dataclass(frozen=True)
class Trial:
    reverted: tuple[str, ...]  # layer names, in ranking order
    measure: Measure
    holds: bool
    seconds: float

    def to_dict(self) -> dict:
        return {"reverted": list(self.reverted), **self.measure.to_dict(), "holds": self.holds,
                "seconds": self.seconds}


@dataclass
class AccuracyControlReport:
    target: Target
    samples: int | None  # evaluation samples
    ranking: list[Layer]  # worst first: the order reverts are taken in
    reverted: list[Layer]
    before: Measure  # the default quantization
    after: Measure  # the model returned
    met: bool
    stopped: str | None = None  # why the search ended early (time limit), None if it ran to its end
    trials: list[Trial] = field(default_factory=list)
    latency_ms: dict[str, float] = field(default_factory=dict)  # lpt's backend, one sample: before, after
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"target": self.target.to_dict(), "met": self.met, "stopped": self.stopped,
                "samples": self.samples, "before": self.before.to_dict(), "after": self.after.to_dict(),
                "reverted": [layer.to_dict() for layer in self.reverted],
                "ranking": [layer.to_dict() for layer in self.ranking],
                "latency_ms": self.latency_ms, "trials": [t.to_dict() for t in self.trials],
                "seconds": self.seconds}


@dataclass(frozen=True, eq=False)
class AccuracyControlResult:
    model: ir.Model  # the FQ model chosen (reverted layers without FQs)
    report: AccuracyControlReport


def check_options(max_drop: float | None, min_sqnr: float | None, labels: str | None,
                  max_time: float | None) -> Target:
    """The target, or QuantizationError naming the option that cannot work (before any calibration)."""
    target = Target(max_drop, min_sqnr)
    if max_drop is not None and labels is None:
        raise QuantizationError("max_drop needs labels: the key of the labels in the evaluation data (--labels)")
    if max_time is not None and not max_time > 0:
        raise QuantizationError(f"max_time {max_time:g}: must be a positive number of seconds")
    return target


class _OutOfTime(Exception):
    pass


def control_accuracy(fp32: ir.Model, calibration, data, *, max_drop: float | None = None,
                     min_sqnr: float | None = None, labels: str | None = None,
                     max_time: float | None = DEFAULT_MAX_TIME,
                     batch_axes: dict[str, int | None] | None = None, ray: str | None = None,
                     ray_workers: int | None = None) -> AccuracyControlResult:
    """Revert the fewest layers of `calibration` (a CalibrationResult of `fp32`) to f32 so that the int8
    model meets `max_drop` (top-1 points, `labels` the key of the labels in `data`) or `min_sqnr` (dB,
    worst output) on every sample of `data`, within `max_time` seconds (None: no limit). `ray`: each
    trial's evaluation runs on Ray workers (lpt.compare's `ray`, `ray_workers`)."""
    start = time.perf_counter()
    target = check_options(max_drop, min_sqnr, labels, max_time)
    config = calibration.config
    if config is None:  # calibrate() always records it; the FQs cannot be re-applied without it
        raise QuantizationError("accuracy control needs the CalibrationResult of lpt.calibrate (it has no config)")
    data = _reusable(data, fp32, batch_axes)
    inputs, _ = split_labels(data, labels, [s.name for s in input_specs(fp32)])
    samples = CalibrationData(inputs, input_specs(fp32), batch_axes=batch_axes).total

    def build(reverted: list[Layer]) -> ir.Model:
        return revert(calibration.model, fp32, frozenset().union(*(layer.uses for layer in reverted)))

    trials: dict[frozenset[str], Trial] = {}

    def trial(reverted: list[Layer]) -> Trial:
        key = frozenset(layer.name for layer in reverted)
        if key not in trials:
            spent = time.perf_counter() - start
            mean = sum(t.seconds for t in trials.values()) / max(len(trials), 1)
            if max_time is not None and spent + mean > max_time:
                raise _OutOfTime
            began = time.perf_counter()
            measure, _ = _measure(fp32, build(reverted), data, labels, batch_axes, target, ray=ray)
            trials[key] = Trial(tuple(layer.name for layer in reverted), measure, target.holds(measure),
                                time.perf_counter() - began)
            logger.info("reverted %d: %s", len(reverted), trials[key].to_dict())
        return trials[key]

    began = time.perf_counter()
    ray = None if ray is None else {"ray": ray, "ray_workers": ray_workers}
    before, costs = _measure(fp32, calibration.model, data, labels, batch_axes, target, per_layer=True, ray=ray)
    trials[frozenset()] = Trial((), before, target.holds(before), time.perf_counter() - began)
    ranking = rank(layers(fp32, calibration, config), costs)
    stopped = None
    if not trials[frozenset()].holds:
        try:
            _search(ranking, trial)
        except _OutOfTime:
            stopped = f"time limit of {max_time:g} s reached after {len(trials)} trials"
            logger.warning("accuracy control: %s", stopped)
    best = min(trials.values(), key=lambda t: (0, len(t.reverted)) if t.holds
               else (1, -target.score(t.measure), len(t.reverted)))
    reverted = [layer for layer in ranking if layer.name in best.reverted]
    model = calibration.model if not reverted else build(reverted)
    if not best.holds:
        logger.warning("accuracy control: %s not met (best: %s)", target.describe(), best.measure.to_dict())
    report = AccuracyControlReport(target, samples, ranking, reverted, before, best.measure, best.holds, stopped,
                                   list(trials.values()))
    report.latency_ms = _latency(calibration.model, model, inputs, fp32, batch_axes)
    report.seconds = time.perf_counter() - start
    return AccuracyControlResult(model, report)


def _search(ranking: list[Layer], trial) -> list[Layer]:
    """The fewest layers, taken worst first, whose revert makes the target hold ([] if none does)."""
    failing, holding, k = 0, None, 1
    while holding is None and failing < len(ranking):  # growing: 1, 2, 4, …, all
        k = min(k, len(ranking))
        if trial(ranking[:k]).holds:
            holding = k
        else:
            failing, k = k, 2 * k
    if holding is None:
        return []  # even reverting every layer misses it
    while holding - failing > 1:  # bisect: prefix `failing` misses, prefix `holding` meets the target
        middle = (failing + holding) // 2
        if trial(ranking[:middle]).holds:
            holding = middle
        else:
            failing = middle
    chosen = list(ranking[:holding])
    # The ranking is a guess: a layer early in the prefix may not be needed once the later ones are
    # reverted. The last one is (the prefix without it missed); give back the others, least harmful first.
    for layer in reversed(chosen[:-1]):
        rest = [other for other in chosen if other is not layer]
        if trial(rest).holds:
            chosen = rest
    return chosen


def _measure(fp32: ir.Model, fq: ir.Model, data, labels, batch_axes, target: Target, *, per_layer: bool = False,
             ray: dict | None = None):
    """(Measure of `fq` on lpt's backend against `fp32`, {FQ'd tensor: its own SQNR cost} with `per_layer`);
    `ray`: compare's ray options, or None."""
    comparison = compare(fp32, fq, data, labels=labels, per_layer=per_layer, batch_axes=batch_axes, **(ray or {}))
    sqnr = min(a.sqnr_db for a in comparison.outputs.values())
    top1 = comparison.top1 if comparison.has_labels else None
    if target.max_drop is not None and top1 is None:
        raise QuantizationError("max_drop needs a classifier output ([N, classes]) for top-1; use min_sqnr instead")
    measure = Measure(float(sqnr), *(() if top1 is None else (top1.candidate_accuracy, top1.reference_accuracy)))
    return measure, {layer.name: float(layer.sqnr_db) for layer in comparison.layers}


def _reusable(data, fp32: ir.Model, batch_axes):
    """`data` in a form compare can read once per trial: a one-shot iterator (a generator) is read into
    arrays first; paths, arrays, lists and data sources are read again each time."""
    if not isinstance(data, Iterator):
        return data
    return CalibrationData(data, input_specs(fp32), batch_axes=batch_axes).collect()


def _latency(before: ir.Model, after: ir.Model, inputs, fp32: ir.Model, batch_axes) -> dict[str, float]:
    """Median ms of one sample on lpt's backend, the default quantization and the chosen model, timed in
    alternating rounds so that the shared machine's load falls on both alike."""
    # the first batch of one sample, or of as many as the model fixes (subset_size=1 left none for a model whose
    # batch axis, given by batch_axes, holds 2)
    feeds = next(iter(CalibrationData(inputs, input_specs(fp32), batch_size=1, batch_axes=batch_axes).batches()))
    plans = {}
    for name, model in (("before", before), ("after", after)):
        if name == "after" and after is before:
            continue
        int8 = clone(model)
        transform(int8)
        plans[name] = compile_model(int8)
        plans[name].run(feeds)  # warm-up: first-run allocations and lazy kernel setup
    times: dict[str, list[float]] = {name: [] for name in plans}
    for _ in range(LATENCY_ROUNDS):
        for name, plan in plans.items():
            for _ in range(LATENCY_REPEATS):
                began = time.perf_counter()
                plan.run(feeds)
                times[name].append((time.perf_counter() - began) * 1e3)
    medians = {name: statistics.median(t) for name, t in times.items()}
    medians.setdefault("after", medians["before"])  # nothing reverted: the same model
    return medians


# -- layers and rebuilding


def layers(fp32: ir.Model, calibration, config: CalibrationConfig) -> list[Layer]:
    """The revertible layers of the calibrated model, in graph order, each with the FQ uses feeding it."""
    working = _working_copy(fp32)
    placement = place(working, config.ignore)
    order = {node.name: i for i, node in enumerate(working.graph)}
    parent: dict[str, str] = {}  # union-find over layer names: layers served by one FQ use revert together

    def find(name: str) -> str:
        while parent.setdefault(name, name) != name:
            name = parent[name]
        return name

    owners: list[tuple[Use, list[ir.Node]]] = []
    for point in placement.points:
        if point.kind == ACTIVATION and point.name not in calibration.ranges:
            continue  # no finite statistics: calibrate() left it without an FQ
        for node, index in point.uses:
            consumers = _consumers(node) if point.kind == ACTIVATION else [node]
            owners.append(((point.name, node.name, index), consumers))
            for other in consumers[1:]:
                parent[find(other.name)] = find(consumers[0].name)
    groups: dict[str, tuple[dict[str, str], set[Use]]] = {}
    for use, consumers in owners:
        nodes, uses = groups.setdefault(find(consumers[0].name), ({}, set()))
        uses.add(use)
        nodes.update((node.name, node.op_type) for node in consumers)
    found = []
    for nodes, uses in groups.values():
        names = sorted(nodes, key=order.__getitem__)
        found.append(Layer(tuple(names), tuple(nodes[n] for n in names), frozenset(uses)))
    return sorted(found, key=lambda layer: order[layer.nodes[0]])


_PASS_THROUGH = PRECISION_PRESERVING_OPS + ("Concat",)  # what placement moves an FQ up through


def _consumers(node: ir.Node) -> list[ir.Node]:
    """The layers an activation FQ read by `node` serves: `node` itself, or the layers after the
    precision-preserving ops (and Concats) the FQ was moved up through."""
    found, seen, stack = [], set(), [node]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if current.op_type not in _PASS_THROUGH:
            found.append(current)
        else:
            stack.extend(use.node for out in current.outputs for use in out.uses())
    return sorted(found, key=lambda n: n.name) or [node]


def rank(found: list[Layer], costs: dict[str, float]) -> list[Layer]:
    """Layers worst first by their worst activation FQ's own SQNR cost (unmeasured ones last, graph order kept)."""
    ranked = []
    for layer in found:
        measured = [(costs[t], t) for t, _, _ in layer.uses if t in costs]
        if measured:
            sqnr, tensor = min(measured)
            layer = dataclasses.replace(layer, tensor=tensor, sqnr_db=sqnr)
        ranked.append(layer)
    return sorted(ranked, key=lambda layer: layer.sqnr_db)


def revert(calibrated: ir.Model, fp32: ir.Model, reverted: frozenset[Use]) -> ir.Model:
    """A copy of the FQ model where the `reverted` uses read the float tensor again: FQ → layer becomes
    tensor → layer, an FQ nobody reads any more is removed, and a layer left without FQs gets fp32's
    bias back (bias correction shifted it for the FQs it had). Ranges, weights' FQs (7-bit channels
    of the overflow fix included) and every other bias stay as calibrate() made them."""
    model = clone(calibrated)
    nodes = {node.name: node for node in model.graph}
    for tensor, consumer, index in sorted(reverted):
        node = nodes[consumer]
        fq = node.inputs[index].producer() if node.inputs[index] is not None else None
        if fq is None or not is_fake_quantize(fq) or fq.inputs[0].name != tensor:
            raise QuantizationError(f"{consumer}: input {index} is not the FakeQuantize of {tensor!r} calibrate() "
                                    "inserted; cannot revert it")
        node.replace_input_with(index, fq.inputs[0])
        if not fq.outputs[0].uses() and not fq.outputs[0].is_graph_output():
            model.graph.remove(fq, safe=True)
    still_quantized = {use.node.name for node in model.graph if is_fake_quantize(node)
                       for use in node.outputs[0].uses()}
    originals = {node.name: node for node in fp32.graph}
    layers_reverted = sorted({consumer for _, consumer, _ in reverted} - still_quantized)
    for target in bias_targets([nodes[name] for name in layers_reverted]):
        original = bias_targets([originals[target.layer.name]])
        bias = const_array(original[0].bias_node.inputs[original[0].bias_index]) if original else None
        value = target.bias_node.inputs[target.bias_index]
        if bias is None or np.array_equal(const_array(value), bias):
            continue
        if value.is_initializer() and len(value.uses()) == 1:
            value.const_value = ir.Tensor(bias, name=value.name)
        else:  # shared, or a Constant node's output: this layer gets its own
            target.bias_node.replace_input_with(target.bias_index,
                                                add_constant(model.graph, f"{value.name}/fp32", bias))
    RemoveUnusedNodesPass()(model)  # the removed FQs' constants, a corrected bias no longer read
    return model
