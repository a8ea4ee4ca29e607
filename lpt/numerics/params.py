"""Integer quantization parameters, and the conversions between them and an FQ's output interval.

An FQ with output interval [ol, oh] and `levels` levels decomposes onto [qmin, qmax] as
scale = (oh − ol)/(qmax − qmin), shift = qmin − ol/scale, x = scale·(q − shift). Only an
integral shift can become an integer zero point; `nudged_params` chooses a range for which it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lpt.errors import QuantizationError
from lpt.numerics.levels import level_range

# A shift counts as integral within 16 f32 ulps of ol/scale: FQ limits arrive as f32 and the
# scale is rounded to f32 once, which moves ol/scale by a few ulps; a deliberate fractional
# zero point (63.75) is many orders of magnitude further off.
ZERO_POINT_RTOL = 2.0**-20


@dataclass(frozen=True, eq=False)  # eq=False: ndarray fields have no boolean ==; compare fields with numpy
class QuantParams:
    """x = scale · (q − zero_point), q in [qmin, qmax]; per tensor (axis None) or one value per index of `axis`.

    `shift` is the exact (float) zero point of the interval the params came from; `zero_point`
    is it rounded to an integer, equal to it when `has_integral_zero_point`.
    """

    scale: np.ndarray  # float32
    zero_point: np.ndarray  # int32
    shift: np.ndarray  # float64
    qmin: int
    qmax: int
    axis: int | None = None

    def __post_init__(self):
        _check_integer_range(self.qmin, self.qmax)
        for name, dtype in (("scale", np.float32), ("zero_point", np.int32), ("shift", np.float64)):
            value = np.array(getattr(self, name), dtype=dtype)
            value.setflags(write=False)  # frozen all the way down
            object.__setattr__(self, name, value)

    @property
    def levels(self) -> int:
        return self.qmax - self.qmin + 1

    @property
    def dtype(self) -> type[np.integer]:
        """The narrowest numpy integer type holding [qmin, qmax]: uint8/int8, else uint16/int16."""
        if self.qmin >= 0:
            return np.uint8 if self.qmax <= 255 else np.uint16
        return np.int8 if -128 <= self.qmin and self.qmax <= 127 else np.int16

    @property
    def has_integral_zero_point(self) -> bool:
        tolerance = ZERO_POINT_RTOL * np.maximum(1.0, np.abs(self.shift - self.qmin))
        return bool(np.all(np.abs(self.shift - self.zero_point) <= tolerance))

    @property
    def is_symmetric(self) -> bool:
        """The zero point is exactly 0 (0.0 ↔ q = 0, no Subtract needed)."""
        return self.has_integral_zero_point and bool(np.all(self.zero_point == 0))


def interval_to_params(low, high, levels, signed: bool | None = None, axis: int | None = None) -> QuantParams:
    """scale = (high − low)/(qmax − qmin), shift = qmin − low/scale, [qmin, qmax] = `levels` integers.

    Signed when any low < 0 unless `signed` says otherwise (OpenVINO: u8 for a non-negative
    interval): levels 256 → [-128, 127] or [0, 255], 255 → [-127, 127] or [0, 254].
    Per channel when `axis` is given (low/high then hold one value per channel, any shape).
    """
    low, high = np.broadcast_arrays(_per_channel(low, axis), _per_channel(high, axis))
    _check_interval(low, high)
    if signed is None:
        signed = bool(np.any(low < 0))
    qmin, qmax = level_range(levels, signed)
    scale = _f32_scale(low, high, qmax - qmin)
    shift = qmin - low / scale.astype(np.float64)  # from the f32 scale, so that scale·(qmin − shift) is low
    return QuantParams(scale, np.rint(shift), shift, qmin, qmax, axis)


def params_to_interval(params: QuantParams) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) = ((qmin − zero_point)·scale, (qmax − zero_point)·scale) in float64: what the integers represent."""
    scale = params.scale.astype(np.float64)
    return (params.qmin - params.zero_point) * scale, (params.qmax - params.zero_point) * scale


def symmetric_params(absmax, levels, signed: bool = True, axis: int | None = None) -> QuantParams:
    """zero_point 0, scale = absmax/qmax: [qmin·scale, absmax] if signed (255 levels: ±absmax), else [0, absmax]."""
    absmax = _per_channel(absmax, axis)
    bad = ~(np.isfinite(absmax) & (absmax > 0))
    if np.any(bad):
        i = _first(bad)
        raise QuantizationError(f"absmax {absmax.ravel()[i]:g}{_channel(absmax, i)} is not positive and finite: "
                                "cannot compute a scale")
    qmin, qmax = level_range(levels, signed)
    if qmax < 1:
        raise QuantizationError(f"{levels} signed levels have no positive level to put absmax on")
    zeros = np.zeros_like(absmax)
    return QuantParams((absmax / qmax).astype(np.float32), zeros, zeros, qmin, qmax, axis)


def nudged_params(min_value, max_value, qmin: int, qmax: int, axis: int | None = None) -> QuantParams:
    """TFLite's ChooseQuantizationParams: the range extended to hold 0.0, scale = (max − min)/(qmax − qmin),
    zero_point = qmin − min/scale or qmax − max/scale (the one with the smaller error), clamped to
    [qmin, qmax] and rounded half away from zero (std::round): 0.0 is then exactly representable.
    """
    _check_integer_range(qmin, qmax)
    low, high = np.broadcast_arrays(_per_channel(min_value, axis), _per_channel(max_value, axis))
    if np.any(low > high):
        i = _first(low > high)
        raise QuantizationError(f"inverted range [{low.ravel()[i]:g}, {high.ravel()[i]:g}]{_channel(low, i)}: "
                                "min is above max")
    low, high = np.minimum(low, 0.0), np.maximum(high, 0.0)
    _check_interval(low, high)  # left: non-finite values, and [0, 0]
    scale = (high - low) / (qmax - qmin)  # float64, as TFLite chooses the zero point
    # TFLite's error estimate for each candidate: the magnitudes that were added together.
    use_min = abs(qmin) + np.abs(low / scale) < abs(qmax) + np.abs(high / scale)
    zero_point = np.clip(np.where(use_min, qmin - low / scale, qmax - high / scale), qmin, qmax)
    zero_point = np.sign(zero_point) * np.floor(np.abs(zero_point) + 0.5)
    return QuantParams(_f32_scale(low, high, qmax - qmin), zero_point, zero_point, qmin, qmax, axis)


def _per_channel(values, axis: int | None) -> np.ndarray:
    """Float64 values: 0-d per tensor, 1-D (one per channel, from any shape) when `axis` is given."""
    values = np.asarray(values, dtype=np.float64)
    if axis is not None:
        return values.ravel()
    if values.size != 1:
        raise QuantizationError(f"{values.size} values for per-tensor parameters: pass axis for per-channel ones")
    return values.reshape(())


def _check_interval(low: np.ndarray, high: np.ndarray) -> None:
    """QuantizationError naming the first [low, high] that has no scale: non-finite, zero-width or inverted."""
    bad = ~(np.isfinite(low) & np.isfinite(high) & (high > low))
    if np.any(bad):
        i = _first(bad)
        lo, hi = low.ravel()[i], high.ravel()[i]
        kind = "non-finite" if not np.isfinite(lo + hi) else "zero-width" if lo == hi else "inverted"
        raise QuantizationError(f"{kind} range [{lo:g}, {hi:g}]{_channel(low, i)}: cannot compute a scale")


def _check_integer_range(qmin: int, qmax: int) -> None:
    fits = 0 <= qmin and qmax <= 65535 or -32768 <= qmin and qmax <= 32767
    if not (qmin < qmax and fits):
        raise QuantizationError(f"integer range [{qmin}, {qmax}] is empty or does not fit 16 bits")


def _f32_scale(low: np.ndarray, high: np.ndarray, steps: int) -> np.ndarray:
    """(high − low)/steps in f32; QuantizationError if that underflows to 0 or overflows."""
    with np.errstate(over="ignore", under="ignore"):
        scale = ((high - low) / steps).astype(np.float32)
    bad = ~(np.isfinite(scale) & (scale > 0))
    if np.any(bad):
        i = _first(bad)
        raise QuantizationError(f"range [{low.ravel()[i]:g}, {high.ravel()[i]:g}]{_channel(low, i)} "
                                f"gives a scale outside float32")
    return scale


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _channel(values: np.ndarray, i: int) -> str:
    return f" at channel {i}" if values.ndim else ""
