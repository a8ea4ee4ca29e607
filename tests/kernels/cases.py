"""Shared test data for the kernel tests: zero points and fills that break shortcuts."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

RANGES = {np.uint8: (0, 255), np.int8: (-128, 127)}
ZERO_POINTS = {np.uint8: [0, 128, 255], np.int8: [-128, 0, 127]}  # the ends and the middle of each range
FILLS = ["random", "min", "max", "zero_point"]  # "min"/"max": all-qmin / all-qmax, what saturates int16 pair sums


def zero_points(dtype) -> st.SearchStrategy[int]:
    """One of the notable zero points of `dtype`, or any in its range."""
    qmin, qmax = RANGES[dtype]
    return st.one_of(st.sampled_from(ZERO_POINTS[dtype]), st.integers(qmin, qmax))


def filled(rng: np.random.Generator, shape, dtype, fill: str, zero_point: int = 0) -> np.ndarray:
    """A tensor of `dtype`: uniform random, or constant at qmin, qmax or the zero point."""
    qmin, qmax = RANGES[dtype]
    value = {"min": qmin, "max": qmax, "zero_point": zero_point}.get(fill)
    if value is None:
        return rng.integers(qmin, qmax + 1, size=shape).astype(dtype)
    return np.full(shape, value, dtype=dtype)
