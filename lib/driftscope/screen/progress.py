"""The screen's progress bar (rich): captures done of those to run, their rate in inputs per minute, the time
spent and the time left (ETA), one bar for the whole screen; the runtime running and the input it finished."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class RateColumn(ProgressColumn):
    """Captures per minute (rich's own speed column counts bytes)."""

    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed  # over rich's last 30 s: none when captures are slower
        if speed is None and task.completed and task.elapsed:
            speed = task.completed / task.elapsed
        return Text("-- /min" if speed is None else f"{speed * 60:.1f} /min")


@contextmanager
def screen_progress(total: int, label: str = "screen") -> Iterator:
    """A callable ``advance(runtime_label, item)`` driving the bar; the bar goes to stderr."""
    console = Console(file=sys.stderr)
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[last]}"),
        console=console,
        transient=False,
    )
    with progress:
        task = progress.add_task(label, total=total, last="")

        def advance(runtime: str, item) -> None:
            progress.update(task, advance=1, last=f"{runtime}: {item.label}")

        yield advance
