"""A progress bar over calibration samples (rich): done/total, rate, time left; silent off a terminal."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.text import Text


class _Rate(ProgressColumn):
    def render(self, task) -> Text:
        return Text(f"{task.speed:,.0f} samples/s" if task.speed else "", style="progress.data.speed")


def _console() -> Console:
    return Console(stderr=True)


def interactive() -> bool:
    return sys.stdout.isatty() and sys.stderr.isatty()


@contextmanager
def sample_progress(description: str, total: int | None, quiet: bool = False):
    """Yields advance(n): a bar on stderr when it is a terminal and not `quiet`, else a no-op."""
    if quiet or not interactive():
        yield lambda n: None
        return
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), _Rate(), TimeRemainingColumn()]
    with Progress(*columns, console=_console(), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)
