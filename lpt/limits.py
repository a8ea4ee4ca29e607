"""How much of the machine one lpt command may take: the largest tensor a model may ask for, and threads.

    with limits.memory_budget(limits.parse_size("4GB")):   # what `--max-memory 4GB` does
        model = lpt.load("m.onnx")                         # a tensor of more is refused at load
    threads = limits.bounded_threads(100_000)              # the cores this process may use, with a warning

A model's shapes can ask for any size (ConstantOfShape of [100000, 100000] is 40 GB from 16 bytes of
file); lpt.model_io checks every size shape inference knows against the budget before anything is
allocated. A thread count above the cores gains nothing and, in the hundreds of thousands, exhausts
the machine.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from lpt.errors import LptError

logger = logging.getLogger(__name__)


def machine_memory() -> int | None:
    """Physical memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def default_max_memory() -> int:
    """2 GiB, or half the machine's memory where that is less."""
    memory = machine_memory()
    return min(2 << 30, memory // 2) if memory else 2 << 30


_budget: ContextVar[int | None] = ContextVar("lpt_max_memory", default=None)


def max_memory() -> int:
    """The most bytes one tensor of a model may take (memory_budget's, else default_max_memory)."""
    budget = _budget.get()
    return budget if budget is not None else default_max_memory()


@contextmanager
def memory_budget(max_bytes: int | None) -> Iterator[None]:
    """Make `max_bytes` the budget of max_memory within the block (None: the default)."""
    token = _budget.set(max_bytes)
    try:
        yield
    finally:
        _budget.reset(token)


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, option: str = "--max-memory") -> int:
    """Bytes from "4GB", "512M", "1.5GiB" or "1000000"; units are binary (1 GB = 1 GiB = 2**30 bytes)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if match is None:
        raise LptError(f"{option} {text!r}: not a size; give bytes or a number with KB, MB, GB or TB (e.g. 4GB)")
    size = int(float(match[1]) * _UNITS[match[2].upper()])
    if size < 1 << 20:
        raise LptError(f"{option} {text}: must be at least 1MB")
    return size


def cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def bounded_threads(threads: int, what: str = "threads") -> int:
    """`threads` (0: one per core, left to the runtime), at most cores(): more is capped with a warning."""
    if threads < 0:
        raise LptError(f"{what} {threads}: must be at least 0")
    available = cores()
    if threads > available:
        logger.warning("%s %d is more than the %d cores this machine gives lpt; using %d",
                       what, threads, available, available)
        return available
    return threads
