"""The `levels` of a FakeQuantize and the integer range they map onto."""

from __future__ import annotations

import operator

from lpt.errors import QuantizationError

MAX_LEVELS = 65536  # 16-bit integers: the widest type lpt quantizes to


def check_levels(levels: object) -> int:
    """`levels` as an int, if it is an integer in [2, 65536]; QuantizationError otherwise."""
    try:
        value = operator.index(levels)  # accepts numpy integers and 0-d integer arrays, not floats
    except TypeError:
        raise QuantizationError(f"levels must be an integer, got {levels!r}") from None
    if not 2 <= value <= MAX_LEVELS:
        raise QuantizationError(f"levels must be in [2, {MAX_LEVELS}], got {value}")
    return value


def level_range(levels: int, signed: bool) -> tuple[int, int]:
    """(qmin, qmax): `levels` consecutive integers from 0, or centred so 256 → [-128, 127], 255 → [-127, 127]."""
    levels = check_levels(levels)
    qmin = -(levels // 2) if signed else 0
    return qmin, qmin + levels - 1
