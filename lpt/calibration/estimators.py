"""Per-tensor statistics with fixed-size state, and the range estimators built on them.

    minmax       [min x, max x] over every sample
    mean_minmax  [mean of per-sample min, mean of per-sample max]
    percentile   [P_(100−p), P_p] of the histogram
    mse          the clipping range whose quantization (as the preset will quantize) has the
                 least mean squared error over the histogram
    kl           TensorRT's entropy calibration: the |x| threshold whose quantized histogram is
                 closest (KL divergence) to the clipped one

A collector's state does not grow with the number of samples: two numbers, three, or a
histogram of `bins` bins per sign whose bin width doubles (merging bin pairs exactly) when a
batch exceeds its range.

`a.merge(b)` folds the state of `b` (the same statistic over other samples) into `a`, so that
shards of the data collected apart (lpt.distributed) give what one pass over all of them gives:
min/max exactly, the mean's sums exactly (kept as a Fraction), histograms exactly when their bin
widths differ by a power of two (shared bin edges: the shards start from one seeded width).
"""

from __future__ import annotations

import logging
import math
from fractions import Fraction

import numpy as np

from lpt.calibration.config import ActivationScheme, Estimator

logger = logging.getLogger(__name__)


class MinMaxCollector:
    """Running min and max of the finite values."""

    def __init__(self):
        self.min, self.max = math.inf, -math.inf
        self.nonfinite = 0

    def update(self, x: np.ndarray) -> None:
        x = self._finite(x)
        if x.size:
            self.min = min(self.min, float(x.min()))
            self.max = max(self.max, float(x.max()))

    def _finite(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        finite = np.isfinite(x)
        if not finite.all():
            self.nonfinite += int(x.size - finite.sum())
            return x[finite]
        return x

    @property
    def empty(self) -> bool:
        return self.min > self.max

    @property
    def state_nbytes(self) -> int:
        return 16

    def range(self) -> tuple[float, float]:
        return self.min, self.max

    def merge(self, other: MinMaxCollector) -> MinMaxCollector:
        """Fold in `other`'s min and max (collected on other samples): exact."""
        self.min, self.max = min(self.min, other.min), max(self.max, other.max)
        self.nonfinite += other.nonfinite
        return self

    def seeded(self) -> MinMaxCollector:
        """An empty collector of the same kind (a histogram keeps its bin width: the shared bin edges)."""
        return type(self)()


class MeanMinMaxCollector(MinMaxCollector):
    """Per-sample min and max (over all but the batch axis), summed; the range is their mean."""

    def __init__(self):
        super().__init__()
        # Exact sums of the per-batch sums: the mean does not depend on the order batches arrive in
        # (lpt.distributed merges shards), and a Fraction costs one addition per batch.
        self.sum_min = self.sum_max = Fraction(0)
        self.samples = 0

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float32)
        rows = x.reshape(len(x), -1) if x.ndim > 1 else x.reshape(-1, 1)
        finite = np.isfinite(rows)
        if not finite.all():
            self.nonfinite += int(rows.size - finite.sum())
            lows = np.where(finite, rows, np.inf).min(axis=1)
            highs = np.where(finite, rows, -np.inf).max(axis=1)
            keep = finite.any(axis=1)
            lows, highs = lows[keep], highs[keep]
        else:
            lows, highs = rows.min(axis=1), rows.max(axis=1)
        if lows.size:
            self.sum_min += Fraction(float(lows.astype(np.float64).sum()))
            self.sum_max += Fraction(float(highs.astype(np.float64).sum()))
            self.samples += lows.size
            self.min = min(self.min, float(lows.min()))
            self.max = max(self.max, float(highs.max()))

    @property
    def state_nbytes(self) -> int:
        return 40

    def range(self) -> tuple[float, float]:
        return float(self.sum_min / self.samples), float(self.sum_max / self.samples)

    def merge(self, other: MeanMinMaxCollector) -> MeanMinMaxCollector:
        """Fold in `other`'s sums and counts: exact (the sums are Fractions)."""
        super().merge(other)
        self.sum_min += other.sum_min
        self.sum_max += other.sum_max
        self.samples += other.samples
        return self


class HistogramCollector(MinMaxCollector):
    """Counts of x in 2·`bins` bins of width w, [k·w, (k+1)·w) for k = −bins … bins−1 (x = bins·w
    goes in the top bin).

    The first batch sets w = max|x| / bins; a batch beyond ±bins·w doubles w as often as needed,
    each doubling merging neighbouring bin pairs, so earlier counts are kept exactly. A value past
    the end bins (x·(1/w) rounds to ±bins or beyond in f32) is clipped into them and counted in
    `clipped`, so that a doubling puts it where it belongs at the new width: then every value's
    bin depends on the final width alone, not on when it came, and shards merge exactly.
    """

    def __init__(self, bins: int = 2048):
        super().__init__()
        if bins < 16 or bins % 2:
            raise ValueError("bins must be an even number ≥ 16")
        self.bins = bins
        self.width = 0.0  # 0: not started (only zeros seen so far)
        self.counts = np.zeros(2 * bins, np.int64)  # index k + bins
        self.clipped = [0, 0]  # values clipped into the bottom and top bins at the current width

    @property
    def state_nbytes(self) -> int:
        return self.counts.nbytes + 32

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float32).ravel()
        if not x.size:
            return
        low, high = float(x.min()), float(x.max())
        if not (math.isfinite(low) and math.isfinite(high)):  # NaN and ±Inf show up in min or max
            x = self._finite(x)
            if not x.size:
                return
            low, high = float(x.min()), float(x.max())
        self.min, self.max = min(self.min, low), max(self.max, high)
        amax = max(-self.min, self.max)
        if self.width == 0.0 and amax > 0:
            self.width = amax / self.bins
        elif amax > self.width * self.bins > 0:
            self._widen(max(0, math.ceil(math.log2(amax / (self.width * self.bins))) - 1))
            while self.width * self.bins < amax:  # the last doubling or two one at a time: the fewest
                self._widen(1)
        if self.width == 0.0:  # only zeros so far
            self.counts[self.bins] += x.size
            return
        index = x * np.float32(1.0 / self.width)
        np.floor(index, out=index)
        index += np.float32(self.bins + 1)  # exact: small integers in f32
        np.clip(index, 0, 2 * self.bins + 1, out=index)  # two guard bins: what the end bins clip
        counts = np.bincount(index.astype(np.intp), minlength=2 * self.bins + 2)
        self.counts += counts[1:-1]
        self.counts[0] += counts[0]
        self.counts[-1] += counts[-1]  # x = bins·w goes in the top bin
        self.clipped = [self.clipped[0] + int(counts[0]), self.clipped[1] + int(counts[-1])]

    def _widen(self, doublings: int) -> None:
        for _ in range(doublings):
            merged = self.counts.reshape(-1, 2).sum(axis=1)  # old k = 2j−bins, 2j−bins+1 → new j − bins/2
            self.counts[:] = 0
            self.counts[self.bins // 2: self.bins // 2 + self.bins] = merged
            # A clipped value had x·(1/w) just past ±bins (|x| ≤ bins·w, f32 rounding): at 2w it is just
            # past ±bins/2, i.e. in bin bins/2 at the top and −bins/2 − 1 at the bottom; the pair merge
            # put it one bin inward.
            low, high = self.clipped
            inner_low, inner_high = self.bins // 2, self.bins + self.bins // 2 - 1
            self.counts[inner_low] -= low
            self.counts[inner_low - 1] += low
            self.counts[inner_high] -= high
            self.counts[inner_high + 1] += high
            self.clipped = [0, 0]
            self.width *= 2

    def seeded(self) -> HistogramCollector:
        """An empty histogram on this one's bin edges: shards seeded alike merge exactly."""
        seed = HistogramCollector(self.bins)
        seed.width = self.width
        return seed

    def merge(self, other: HistogramCollector) -> HistogramCollector:
        """Fold in `other`'s counts: both brought to the wider bin width by doublings (as update does),
        then added. Exact when the widths are a power of two apart (shards seeded with one width, or
        a side that saw only zeros); otherwise `other`'s bins are counted where their centres fall."""
        if other.bins != self.bins:
            raise ValueError(f"histograms of {self.bins} and {other.bins} bins do not merge")
        self.nonfinite += other.nonfinite
        if other.min > other.max:  # empty
            return self
        self.min, self.max = min(self.min, other.min), max(self.max, other.max)
        if self.width == 0.0 or other.width == 0.0:  # a side of only zeros: all in bin k = 0, at any width
            if self.width == 0.0:
                self.width, self.clipped = other.width, list(other.clipped)
            self.counts = self.counts + other.counts
            return self
        wide, narrowest = (other, self) if self.width <= other.width else (self, other)
        narrow = narrowest.seeded()  # a copy of the narrower side, to widen to the other's width
        narrow.counts, narrow.clipped = narrowest.counts.copy(), list(narrowest.clipped)
        doublings = round(math.log2(wide.width / narrow.width))
        if math.ldexp(narrow.width, doublings) != wide.width:
            logger.warning("histograms with bin widths %g and %g (not a power of two apart) merged within a bin",
                           narrow.width, wide.width)
            self.counts, self.width, self.clipped = _rebinned(narrow, wide), wide.width, [0, 0]
            return self
        narrow._widen(doublings)
        self.counts = wide.counts + narrow.counts
        self.clipped = [wide.clipped[0] + narrow.clipped[0], wide.clipped[1] + narrow.clipped[1]]
        self.width = wide.width
        return self

    def signed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lower edges, upper edges, counts) of the non-empty bins, in increasing x."""
        w = self.width if self.width > 0 else 1.0
        lower = (np.arange(2 * self.bins) - self.bins) * w
        keep = self.counts > 0
        return lower[keep], lower[keep] + w, self.counts[keep]

    def absolute(self) -> np.ndarray:
        """Counts of |x| in bins [i·w, (i+1)·w), i = 0 … bins−1 (the negative bins folded over, approximately:
        a negative bin [−(i+1)·w, −i·w) is counted as |x| in [i·w, (i+1)·w))."""
        return self.counts[self.bins:] + self.counts[: self.bins][::-1]


def _rebinned(narrow: HistogramCollector, wide: HistogramCollector) -> np.ndarray:
    """`wide`'s counts plus `narrow`'s, each narrow bin counted in the wide bin holding its centre."""
    k = np.arange(2 * narrow.bins) - narrow.bins
    centres = (k + 0.5) * narrow.width
    index = np.clip(np.floor(centres / wide.width) + wide.bins, 0, 2 * wide.bins - 1).astype(np.intp)
    return wide.counts + np.bincount(index, weights=narrow.counts, minlength=2 * wide.bins).astype(np.int64)

def collector(estimator: Estimator, bins: int = 2048):
    """A new collector for `estimator`'s statistics."""
    if estimator == Estimator.MINMAX:
        return MinMaxCollector()
    if estimator == Estimator.MEAN_MINMAX:
        return MeanMinMaxCollector()
    return HistogramCollector(bins)


def estimate(estimator: Estimator, stats, scheme: ActivationScheme, percentile: float = 99.99) -> tuple[float, float]:
    """The [low, high] range `estimator` chooses from `stats` (a collector of the matching kind)."""
    if estimator in (Estimator.MINMAX, Estimator.MEAN_MINMAX):
        return stats.range()
    if stats.width == 0.0:
        return stats.min, stats.max  # constant zeros: insertion gives them a tiny safe range
    if estimator == Estimator.PERCENTILE:
        return percentile_range(stats, percentile)
    if estimator == Estimator.MSE:
        return mse_range(stats, scheme)
    if estimator == Estimator.KL:
        return kl_range(stats, scheme)
    raise ValueError(f"unknown estimator {estimator}")


def percentile_range(hist: HistogramCollector, percentile: float) -> tuple[float, float]:
    """[P_(100−p), P_p] as np.percentile defines them (the order statistic at rank q·(n−1)), read off
    the histogram with the samples of a bin spread evenly over it: within one bin of the exact value."""
    lower, upper, counts = hist.signed()
    cum = np.cumsum(counts, dtype=np.float64)
    total = cum[-1]

    def at(q: float) -> float:
        rank = q * (total - 1) + 0.5  # the middle of sample number q·(n−1), counting from 0
        i = min(int(np.searchsorted(cum, rank, side="left")), len(cum) - 1)
        before = cum[i - 1] if i else 0.0
        frac = (rank - before) / counts[i]
        return float(lower[i] + np.clip(frac, 0.0, 1.0) * (upper[i] - lower[i]))

    low, high = at(1.0 - percentile / 100.0), at(percentile / 100.0)
    return max(low, hist.min), min(high, hist.max)


# -- mse


def _search(error, steps: int = 16) -> float:
    """The fraction f in (0, 1] with the least error(f) (vectorized over f): a coarse grid, then a fine
    grid around its best point (2·steps evaluations instead of steps² for the same resolution)."""
    coarse = np.linspace(1.0 / steps, 1.0, steps)
    i = int(np.argmin(error(coarse)))
    fine = np.linspace(coarse[max(i - 1, 0)] if i else 1e-3, coarse[min(i + 1, steps - 1)], steps)
    candidates = np.concatenate([fine, coarse[i:i + 1]])
    return float(candidates[np.argmin(error(candidates))])


def _sample_points(hist: HistogramCollector, max_bins: int = 512, per_bin: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Points spread evenly inside each non-empty bin, each bin's count shared among them; neighbouring
    bins merged first so that at most `max_bins` span the data (the search's cost is points × candidates)."""
    nonzero = np.flatnonzero(hist.counts)
    first, last = nonzero[0], nonzero[-1] + 1
    group = max(1, -(-(last - first) // max_bins))
    counts = hist.counts[first:last]
    counts = np.pad(counts, (0, -len(counts) % group)).reshape(-1, group).sum(axis=1)
    width = group * (hist.width if hist.width > 0 else 1.0)
    lower = (first - hist.bins) * (hist.width if hist.width > 0 else 1.0) + np.arange(len(counts)) * width
    keep = counts > 0
    lower, counts = lower[keep], counts[keep]
    offsets = (np.arange(per_bin) + 0.5) / per_bin * width
    points = lower[:, None] + offsets[None, :]
    weights = np.repeat(counts[:, None] / per_bin, per_bin, axis=1)
    return points.ravel(), weights.ravel()


def quantization_mse(points: np.ndarray, weights: np.ndarray, lows: np.ndarray, highs: np.ndarray,
                     scheme: ActivationScheme) -> np.ndarray:
    """Weighted mean squared quantization error of `points` for each candidate range [lows[k], highs[k]]."""
    from lpt.calibration.insertion import activation_params

    scale, zero_point, qmin, qmax = activation_params(lows, highs, scheme)
    errors = np.empty(len(scale))
    for start in range(0, len(scale), 64):  # bounded temporary: 64 candidates × points
        s = scale[start:start + 64, None].astype(np.float64)
        z = zero_point[start:start + 64, None]
        q = np.clip(np.rint(points[None, :] / s) + z, qmin, qmax)
        errors[start:start + 64] = ((points[None, :] - (q - z) * s) ** 2 * weights[None, :]).sum(axis=1)
    return errors / weights.sum()


def mse_range(hist: HistogramCollector, scheme: ActivationScheme) -> tuple[float, float]:
    """The [low, high] (shrunk from [min, max]) that the preset's quantizer rounds with the least MSE.

    One-sided and symmetric ranges shrink by one fraction; an asymmetric range with both signs
    shrinks both ends together first, then the high end alone, then the low end alone.
    """
    points, weights = _sample_points(hist)
    lo, hi = min(hist.min, 0.0), max(hist.max, 0.0)

    def mse(lows, highs):
        return quantization_mse(points, weights, lows, highs, scheme)

    if scheme.symmetric and lo < 0 < hi:
        a = max(-lo, hi)
        f = _search(lambda f: mse(-f * a, f * a))
        return -f * a, f * a
    if lo == 0.0 or hi == 0.0:  # one-sided: the other end stays at 0
        f = _search(lambda f: mse(f * lo, f * hi))
        return f * lo, f * hi
    f = _search(lambda f: mse(f * lo, f * hi))
    f_hi = _search(lambda g: mse(np.full_like(g, f * lo), g * hi))
    f_lo = _search(lambda g: mse(g * lo, np.full_like(g, f_hi * hi)))
    return f_lo * lo, f_hi * hi


# -- kl


def kl_threshold(abs_hist: np.ndarray, width: float, quant_bins: int, max_candidates: int = 256) -> float:
    """TensorRT's entropy calibration on a histogram of |x| (bin i = [i·w, (i+1)·w)).

    For each candidate i (≥ quant_bins bins): P = the first i bins with everything beyond added to
    the last; Q = those bins merged into `quant_bins` groups and spread back evenly over each
    group's non-empty bins. The threshold is i·w of the i with the least KL(P‖Q).
    """
    hist = abs_hist.astype(np.float64)
    n = len(hist)
    if n <= quant_bins:
        return n * width
    stride = max(1, (n - quant_bins) // max_candidates)
    candidates = list(range(quant_bins, n + 1, stride))
    if candidates[-1] != n:
        candidates.append(n)
    tail = np.concatenate([np.cumsum(hist[::-1])[::-1], [0.0]])  # tail[i] = sum(hist[i:])
    best, best_kl = n, math.inf
    for i in candidates:
        p = hist[:i].copy()
        p[i - 1] += tail[i]
        starts = (np.arange(quant_bins) * i) // quant_bins
        sums = np.add.reduceat(hist[:i], starts)
        nonzero = (hist[:i] > 0).astype(np.float64)
        counts = np.add.reduceat(nonzero, starts)
        group = np.repeat(np.arange(quant_bins), np.diff(np.append(starts, i)))
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(nonzero > 0, sums[group] / counts[group], 0.0)
        kl = _kl(p, q)
        if kl < best_kl:
            best, best_kl = i, kl
    return best * width


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    """KL(P‖Q) of two unnormalized histograms; bins where P > 0 but Q = 0 get Q smoothed to a tiny mass."""
    p = p / p.sum()
    q = q / q.sum() if q.sum() > 0 else q
    mask = p > 0
    q = np.where(mask & (q <= 0), 1e-10, q)
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


def kl_range(hist: HistogramCollector, scheme: ActivationScheme) -> tuple[float, float]:
    """[−t, t] ∩ [min, max] for TensorRT's entropy threshold t; 256 target bins for a non-negative tensor."""
    non_negative = hist.min >= 0
    quant_bins = scheme.levels if non_negative else scheme.levels // 2
    t = kl_threshold(hist.absolute(), hist.width, quant_bins)
    return max(hist.min, -t), min(hist.max, t)


def mean_error(hist: HistogramCollector, fq) -> float:
    """E[FQ(x) − x] over the histogram: what clipping (and rounding) shifts the tensor's mean by."""
    if hist.width == 0.0:
        return 0.0
    points, weights = _sample_points(hist)
    error = fq.apply(points.astype(np.float32)).astype(np.float64) - points
    return float(np.sum(error * weights) / np.sum(weights))
