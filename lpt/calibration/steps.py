"""The data steps of calibrate(): statistics, then ranges, each kept as plain data that can be applied again.

    collect_statistics(model, placement, data, config) → Statistics   one pass over the data
    estimate_ranges(statistics, config)                → {tensor: (low, high)}

Both are keyed by names (tensor names, layer names), not by nodes of one copy of the model, so a
later step can place and insert again on a fresh copy (fewer FQs, say) with what was collected
once: insertion.fake_quantizes and insertion.insert turn ranges into FQs, bias_correction.bias_shifts
and apply_shifts correct the biases from the statistics.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

import onnx_ir as ir

from lpt.calibration.bias_correction import InputMean, bias_targets
from lpt.calibration.config import CalibrationConfig
from lpt.calibration.data import CalibrationData
from lpt.calibration.estimators import MinMaxCollector, collector, estimate
from lpt.calibration.placement import Placement
from lpt.calibration.statistics import collect

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Statistics:
    """What one pass over the calibration data leaves: fixed-size state, not the data."""

    activations: dict[str, object]  # tensor name → its range collector (estimators.collector)
    input_means: dict[str, InputMean]  # layer name → running mean of its input, for bias correction
    bytes_per_sample: int  # of the tensors fetched: a later pass runs in the same parts
    hidden_states: dict[str, object] = field(default_factory=dict)  # recurrent states' min/max collectors, by tensor


def collect_statistics(model: ir.Model, placement: Placement, data: CalibrationData, config: CalibrationConfig,
                       *, quiet: bool = False, collect=collect, hidden_states=()) -> Statistics:
    """One range collector per activation FQ of `placement`, one input mean per layer whose bias is corrected,
    a min/max per tensor of `hidden_states` (names: the states a recurrence emits, lpt.calibration.recurrent).
    `collect` fills them (statistics.collect; lpt.distributed.collect shares the batches among Ray workers)."""
    collectors: dict[str, list] = defaultdict(list)
    activations = {}
    for p in placement.activations:
        activations[p.name] = collector(config.estimator, config.histogram_bins)
        collectors[p.name].append(activations[p.name])
    means = {}
    for t in bias_targets(placement.layers) if config.bias_correction else ():
        means[t.layer.name] = InputMean(t.per_element)
        collectors[t.input.name].append(means[t.layer.name])
    states = {}
    for name in hidden_states:  # min/max: a clipped state would feed every later step
        states[name] = MinMaxCollector()
        collectors[name].append(states[name])
    per_sample = collect(model, collectors, data, quiet=quiet)
    return Statistics(activations, means, per_sample, states)


def estimate_ranges(statistics: Statistics, config: CalibrationConfig) -> dict[str, tuple[float, float]]:
    """[low, high] per activation tensor by `config.estimator`; tensors with no finite values have none."""
    ranges = {}
    for name, stats in statistics.activations.items():
        if stats.empty:
            logger.warning("%s: no finite values in its statistics; left in f32", name)
            continue
        ranges[name] = estimate(config.estimator, stats, config.activations, config.percentile)
    return ranges
