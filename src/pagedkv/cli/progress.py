"""Progress on stderr for long phases; silent with --json or when stderr is not a terminal."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pagedkv.cli.common import stderr_console


def progress_enabled(json_output: bool) -> bool:
    return not json_output and sys.stderr.isatty()


@contextmanager
def phase(description: str, total: int | None, enabled: bool) -> Iterator[Callable[[int], None]]:
    """A bar (or a spinner when ``total`` is None) for one phase; yields ``update(done)``."""
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
        task = bar.add_task(description, total=total)
        yield lambda done: bar.update(task, completed=done)


def require_matplotlib(option: str = "--plot") -> None:
    """Fail before any work when a plot was asked for and cannot be drawn."""
    import importlib.util

    from pagedkv.errors import ConfigError

    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(f"{option} needs matplotlib (pip install 'pagedkv[plot]')")
