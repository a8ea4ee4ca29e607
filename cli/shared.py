"""What every command shares: printing names from files safely, and checking numeric options.

Names in a model or a data file (nodes, tensors, inputs, keys) may hold escape sequences or
newlines; everything printed from a file goes through lpt.errors.shown (Table's cells and title,
say), so a file cannot write to the terminal.
"""

from __future__ import annotations

import click
import rich.table
from rich.console import Console

from lpt import limits
from lpt.errors import LptError, shown

console = Console(markup=False, highlight=False)  # node names may hold [brackets]


class Table(rich.table.Table):
    """A rich Table whose title and cells are escaped (lpt.errors.shown)."""

    def __init__(self, *columns, title=None, **kwargs):
        super().__init__(*columns, title=None if title is None else shown(title), **kwargs)

    def add_row(self, *cells, **kwargs) -> None:
        super().add_row(*(shown(c) if isinstance(c, str) else c for c in cells), **kwargs)


def say(text: str) -> None:
    """Print a line that may hold names from a file."""
    console.print(shown(text))


def at_least(option: str, value: int, minimum: int) -> int:
    """`value`, or a one-line error naming `option` when it is below `minimum`."""
    if value < minimum:
        raise LptError(f"{option} {value}: must be at least {minimum}")
    return value


def bounded_threads(option: str, value: int, minimum: int) -> int:
    """A thread count of at least `minimum` and at most the cores this process may run on: more is
    clamped, with a warning (a hundred thousand threads exhaust the machine and crash onnxruntime)."""
    at_least(option, value, minimum)
    cores = limits.cores()
    if value > cores:
        click.echo(f"warning: {option} {value} is more than the {cores} cores this machine gives lpt; using {cores}",
                   err=True)
        return cores
    return value
