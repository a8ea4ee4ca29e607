"""What the calibration does, as named presets and estimators (enums) and frozen configuration.

    performance  symmetric activations: u8 [0, max] for non-negative tensors, i8 ±max|x| otherwise, zp 0
    mixed        asymmetric u8 activations, the zero point an integer (range nudged so 0.0 is exact)

Weights are the same in both: symmetric int8 per output channel, narrow range (levels 255,
scale = max|w|/127). Activations are per tensor, 256 levels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from lpt.errors import QuantizationError


class Preset(str, Enum):
    PERFORMANCE = "performance"
    MIXED = "mixed"


class Estimator(str, Enum):
    """How an activation's range comes from its statistics."""

    MINMAX = "minmax"  # min and max over every sample
    MEAN_MINMAX = "mean_minmax"  # per-sample min and max, averaged (NNCF's per-tensor default)
    PERCENTILE = "percentile"  # the PERCENTILE-th and (100 − PERCENTILE)-th percentiles
    MSE = "mse"  # the clipping range with the least quantization MSE (on the histogram)
    KL = "kl"  # TensorRT's entropy calibration (least KL divergence, on the |x| histogram)
    AUTO = "auto"  # per tensor, the candidate above with the least error at the output of the layers reading it


class OverflowFix(str, Enum):
    """Which weights go to 7 bits so that AVX2's int16 pair sums cannot saturate (lpt.calibration.overflow_fix)."""

    AUTO = "auto"  # the output channels where saturation moved a layer's output on the calibration data
    NONE = "none"
    FIRST = "first"  # the first quantized layer's weights
    ALL = "all"  # every quantized layer's weights


@dataclass(frozen=True)
class ActivationScheme:
    symmetric: bool
    levels: int = 256


@dataclass(frozen=True)
class WeightScheme:
    levels: int = 255  # narrow range [-127, 127]
    per_channel: bool = True


PRESETS = {
    Preset.PERFORMANCE: ActivationScheme(symmetric=True),
    Preset.MIXED: ActivationScheme(symmetric=False),
}

# Chosen on the bundled models (python bench/calibration_sqnr.py --sweep): "mixed" is never worse
# than "performance" and 4 dB better where activations are signed (digits_zoo, tabular_mlp);
# "minmax" keeps fp32's top-1 on all four models, where "mse" gains 0.5 dB of SQNR on average
# but loses one test sample on digits_cnn and digits_zoo, and costs a histogram pass.
DEFAULT_PRESET = Preset.MIXED
DEFAULT_ESTIMATOR = Estimator.MINMAX
# Measured on the bundled models (README, "int8 on AVX2 CPUs"): "auto" costs −0.08 to 0.37 dB on an
# exact backend and gives onnxruntime on an AVX2 CPU fp32's top-1 (digits_cnn: 0.74 pt lost with
# "none"); "first" costs as little there but up to 3.9 dB on corpus models; "auto" costs calibration time.
DEFAULT_OVERFLOW_FIX = OverflowFix.AUTO


@dataclass(frozen=True)
class CalibrationConfig:
    preset: Preset = DEFAULT_PRESET
    estimator: Estimator = DEFAULT_ESTIMATOR
    subset_size: int = 300
    batch_size: int = 32  # samples per onnxruntime run (a model with a fixed batch dim uses its own)
    ignore: tuple[str, ...] = ()
    bias_correction: bool = True
    skip_nonfinite: bool = False
    percentile: float = 99.99
    histogram_bins: int = 2048  # per sign
    weights: WeightScheme = field(default_factory=WeightScheme)
    overflow_fix: OverflowFix = DEFAULT_OVERFLOW_FIX
    smooth_quant: float | None = None  # SmoothQuant's alpha in [0, 1] (lpt.calibration.smooth_quant); None: off
    # LSTM/GRU as a projection MatMul and a Scan with int8 gate MatMuls (lpt.calibration.recurrent): True every
    # one it takes, False none, None (auto) those of hidden size recurrent.AUTO_HIDDEN or more
    int8_recurrent: bool | None = None

    def __post_init__(self):
        object.__setattr__(self, "preset", _member(Preset, self.preset, "preset"))
        object.__setattr__(self, "overflow_fix", _member(OverflowFix, self.overflow_fix, "overflow fix"))
        object.__setattr__(self, "estimator", _member(Estimator, self.estimator, "estimator"))
        object.__setattr__(self, "ignore", tuple(self.ignore))
        if int(self.subset_size) < 1:
            raise QuantizationError(f"subset_size must be at least 1, got {self.subset_size}")
        if self.smooth_quant is not None:
            try:
                alpha = float(self.smooth_quant)
            except (TypeError, ValueError):
                alpha = float("nan")
            if not 0.0 <= alpha <= 1.0:
                raise QuantizationError(f"smooth_quant (SmoothQuant's alpha) must be in [0, 1], got {self.smooth_quant!r}")
            object.__setattr__(self, "smooth_quant", alpha)
        if not 50.0 < self.percentile <= 100.0:
            raise QuantizationError(f"percentile must be in (50, 100], got {self.percentile}")

    @property
    def activations(self) -> ActivationScheme:
        return PRESETS[self.preset]


def _member(enum: type[Enum], value, what: str):
    try:
        return enum(value.value if isinstance(value, Enum) else value)
    except ValueError:
        choices = ", ".join(m.value for m in enum)
        raise QuantizationError(f"unknown {what} {value!r}: choose one of {choices}") from None
