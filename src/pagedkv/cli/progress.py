"""Progress on stderr for long phases; silent with --json or when stderr is not a terminal."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pagedkv.cli.common import stderr_console

__all__ = [
    "progress_enabled",
    "PhaseBar",
    "phase",
    "require_matplotlib",
]


def progress_enabled(json_output: bool) -> bool:
    return not json_output and sys.stderr.isatty()


class PhaseBar:
    """``bar(done)`` advances the bar; ``bar.stage(text)`` turns it into a spinner for a
    follow-up phase whose length is unknown."""

    def __init__(self, progress: Any, task: Any) -> None:
        self._progress, self._task = progress, task

    def __call__(self, done: int) -> None:
        self._progress.update(self._task, completed=done)

    def stage(self, text: str) -> None:
        self._progress.update(self._task, description=text, total=None)


@contextmanager
def phase(description: str, total: int | None, enabled: bool) -> Iterator[PhaseBar]:
    """A bar (or a spinner when ``total`` is None) for one phase."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TimeElapsedColumn,
    )

    columns = (SpinnerColumn(),) if total is None else (BarColumn(), MofNCompleteColumn())
    with Progress(
        "[progress.description]{task.description}",
        *columns,
        TimeElapsedColumn(),
        console=stderr_console(),
        transient=True,
        disable=not enabled,
    ) as bar:
        yield PhaseBar(bar, bar.add_task(description, total=total))


def require_matplotlib(option: str = "--plot") -> None:
    """Fail before any work when a plot was asked for and cannot be drawn."""
    import importlib.util

    from pagedkv.errors import ConfigError

    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(f"{option} needs matplotlib (pip install 'pagedkv[plot]')")
