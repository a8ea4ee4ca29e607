"""Each range estimator against a plain NumPy formula on known data; collectors' state stays fixed-size."""

import numpy as np
import pytest

from lpt.calibration.config import ActivationScheme, Estimator
from lpt.calibration.estimators import (
    HistogramCollector,
    collector,
    estimate,
    kl_threshold,
)
from lpt.calibration.insertion import activation_params

SYMMETRIC, ASYMMETRIC = ActivationScheme(symmetric=True), ActivationScheme(symmetric=False)


def batches(data, size=50):
    return [data[i:i + size] for i in range(0, len(data), size)]


def collect(estimator, data, bins=2048):
    c = collector(estimator, bins)
    for b in batches(data):
        c.update(b)
    return c


def gaussian_with_outliers(n=400, seed=0):
    """[n, 64] samples: N(0.5, 1) plus a few far outliers, so that clipping pays off."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.5, 1.0, (n, 64)).astype(np.float32)
    x.reshape(-1)[rng.choice(x.size, 20, replace=False)] = rng.uniform(8, 12, 20) * rng.choice([-1, 1], 20)
    return x


def test_minmax_is_min_and_max_of_everything():
    x = gaussian_with_outliers()
    assert estimate(Estimator.MINMAX, collect(Estimator.MINMAX, x), SYMMETRIC) == (x.min(), x.max())


def test_mean_minmax_averages_per_sample_min_and_max():
    x = gaussian_with_outliers()
    lo, hi = estimate(Estimator.MEAN_MINMAX, collect(Estimator.MEAN_MINMAX, x), SYMMETRIC)
    np.testing.assert_allclose([lo, hi], [x.min(axis=1).mean(), x.max(axis=1).mean()], rtol=1e-6)


@pytest.mark.parametrize("p", [99.0, 99.9, 99.99])
def test_percentile_is_within_one_bin_of_numpy(p):
    """Within a bin width of the two samples np.percentile interpolates between."""
    x = gaussian_with_outliers()
    h = collect(Estimator.PERCENTILE, x)
    lo, hi = estimate(Estimator.PERCENTILE, h, SYMMETRIC, percentile=p)
    for value, q in ((lo, 100 - p), (hi, p)):
        below, above = np.percentile(x, q, method="lower"), np.percentile(x, q, method="higher")
        assert below - h.width <= value <= above + h.width


def true_mse(x, low, high, scheme):
    scale, zp, qmin, qmax = activation_params([low], [high], scheme)
    s = np.float64(scale[0])
    q = np.clip(np.rint(x.astype(np.float64) / s) + zp[0], qmin, qmax)
    return float(np.mean((x - (q - zp[0]) * s) ** 2))


@pytest.mark.parametrize("scheme", [SYMMETRIC, ASYMMETRIC], ids=["symmetric", "asymmetric"])
@pytest.mark.parametrize("relu", [False, True], ids=["signed", "relu"])
def test_mse_range_is_as_good_as_a_brute_force_search_on_the_raw_data(scheme, relu):
    x = gaussian_with_outliers()
    if relu:
        x = np.maximum(x, 0)
    lo, hi = estimate(Estimator.MSE, collect(Estimator.MSE, x), scheme)
    full = true_mse(x, x.min(), x.max(), scheme)
    # the brute force: a fine grid of clipping ranges, scored on the data itself
    fractions = np.linspace(0.01, 1.0, 200)
    if scheme.symmetric or relu:
        a = max(-x.min(), x.max())
        best = min(true_mse(x, -f * a if x.min() < 0 else 0.0, f * a, scheme) for f in fractions)
    else:
        coarse = fractions[::8]
        best = min(true_mse(x, f * x.min(), g * x.max(), scheme) for f in coarse for g in coarse)
    found = true_mse(x, lo, hi, scheme)
    assert found <= best * 1.03
    assert found <= full * 1.001  # never worse than not clipping


def trt_entropy_threshold(hist, width, nq):
    """TensorRT's entropy calibration, written as a plain loop over every candidate."""
    best, best_kl = None, np.inf
    for i in range(nq, len(hist) + 1):
        p = hist[:i].astype(np.float64).copy()
        p[-1] += hist[i:].sum()
        q = np.zeros(i)
        edges = [(j * i) // nq for j in range(nq + 1)]
        for a, b in zip(edges[:-1], edges[1:]):
            chunk = hist[a:b]
            nonzero = chunk > 0
            if nonzero.any():
                q[a:b][nonzero] = chunk.sum() / nonzero.sum()
        p, q = p / p.sum(), q / q.sum()
        mask = p > 0
        kl = np.sum(p[mask] * np.log(p[mask] / np.where(q[mask] > 0, q[mask], 1e-10)))
        if kl < best_kl:
            best, best_kl = i, kl
    return best * width


def test_kl_threshold_matches_tensorrt_entropy_calibration():
    rng = np.random.default_rng(0)
    data = np.abs(np.concatenate([rng.laplace(0, 1, 20000), rng.uniform(5, 8, 30)]))
    hist, edges = np.histogram(data, bins=512, range=(0, data.max()))
    width = edges[1]
    assert kl_threshold(hist, width, 128, max_candidates=512) == trt_entropy_threshold(hist, width, 128)


def test_kl_range_is_the_entropy_threshold_of_the_collected_histogram():
    x = np.random.default_rng(3).laplace(0.2, 1.0, (200, 100)).astype(np.float32)
    h = collect(Estimator.KL, x, bins=256)
    t = trt_entropy_threshold(h.absolute(), h.width, 128)
    lo, hi = estimate(Estimator.KL, h, SYMMETRIC)
    assert (lo, hi) == (max(-t, x.min()), min(t, x.max()))
    assert hi < x.max()  # a Laplace tail is clipped


def test_histogram_widening_keeps_counts_exact():
    """Batches of growing range: the final counts equal one np.histogram over all the data."""
    rng = np.random.default_rng(1)
    parts = [(rng.uniform(-1, 1, 1000) * 2.0**k).astype(np.float32) for k in range(6)]
    parts[0][0] = -1.0  # widths 1/64 … 1/2: powers of two, so x/w is exact and no value sits on an edge by rounding
    h = HistogramCollector(bins=64)
    for p in parts:
        h.update(p)
    everything = np.concatenate(parts)
    edges = np.arange(-64, 65) * h.width
    expected, _ = np.histogram(everything, bins=edges)
    np.testing.assert_array_equal(h.counts, expected)
    assert h.total == everything.size


@pytest.mark.parametrize("estimator", list(Estimator))
def test_collector_state_does_not_grow_with_the_number_of_samples(estimator):
    rng = np.random.default_rng(2)
    few, many = collector(estimator), collector(estimator)
    few.update(rng.normal(size=(10, 32)))
    for _ in range(200):
        many.update(rng.normal(size=(50, 32)) * rng.uniform(0.5, 4))
    assert few.state_nbytes == many.state_nbytes


def test_nonfinite_activations_are_left_out_of_statistics():
    c = collector(Estimator.MSE)
    c.update(np.array([[0.5, np.nan], [np.inf, -1.0]], np.float32))
    assert (c.min, c.max, c.total, c.nonfinite) == (-1.0, 0.5, 2, 2)


@pytest.mark.parametrize("per_element", [True, False], ids=["conv-input", "matmul-input"])
def test_bias_correction_input_means_are_fixed_size_and_exact(per_element):
    from lpt.calibration.bias_correction import InputMean

    rng = np.random.default_rng(4)
    data = rng.normal(size=(300, 4, 5)).astype(np.float32)
    few, many = InputMean(per_element), InputMean(per_element)
    few.update(data[:10])
    for b in batches(data, 32):
        many.update(b)
    assert few.state_nbytes == many.state_nbytes
    expected = data.mean(axis=0) if per_element else data.reshape(-1, 5).mean(axis=0)
    np.testing.assert_allclose(many.mean, expected, rtol=1e-5, atol=1e-6)
