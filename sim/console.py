"""What every ``servesim`` command shares: the stderr console, a clean exit on bad input, the
progress bar, and number formatting. Bad input ends with a message and exit code 2, never a
traceback.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from sim.scenario import Scenario, ScenarioError, clipped, default_scenario, load_scenario

stderr = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` to stderr and exit (the message is text, not rich markup; one
    that repeats a huge value is cut in the middle, see :func:`sim.scenario.clipped`)."""
    stderr.print(f"[bold red]error:[/] {escape(clipped(message))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=code)


@contextmanager
def warnings_on_stderr() -> Iterator[None]:
    """Show the warnings raised inside (a trace sorted by time, weights that compute slower
    than asked) as ``warning: message`` lines, whatever Python's warning filters say."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for warning in caught:
                stderr.print(
                    f"[yellow]warning:[/] {escape(str(warning.message))}",
                    highlight=False,
                    soft_wrap=True,
                )


class ProgressUpdate:
    """The callback :func:`progress` yields: ``update(done, total, detail)``.

    It moves the bar to ``done`` of ``total`` (None keeps the total it has) and, with a
    ``detail``, shows ``"<description> <detail>"`` as the bar's text. It fits both
    ``Callable[[int, int], None]`` and ``Callable[[int, int, str], None]`` progress hooks.
    """

    def __init__(self, bar: Progress, task: TaskID, description: str) -> None:
        self._bar = bar
        self._task = task
        self._description = description

    def __call__(self, done: int, total: int | None = None, detail: str = "") -> None:
        description = f"{self._description} {detail}" if detail else self._description
        self._bar.update(self._task, completed=done, total=total, description=description)


@contextmanager
def progress(
    description: str, total: int | None = None, *, disable: bool = False
) -> Iterator[ProgressUpdate]:
    """A transient progress bar on stderr for the block: ``description``, the bar, ``done/total``
    and the time elapsed. ``total`` None is an indeterminate bar until an update gives one;
    ``disable`` draws nothing (e.g. when stdout carries JSON). Yields the update callback."""
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
        disable=disable,
    ) as bar:
        yield ProgressUpdate(bar, bar.add_task(description, total=total), description)


def load_or_exit(path: Path | None) -> Scenario:
    """The scenario at ``path`` (the embedded default for None), or exit listing its problems."""
    try:
        return default_scenario() if path is None else load_scenario(path)
    except ScenarioError as exc:
        stderr.print(str(exc), highlight=False, soft_wrap=True, markup=False)
        raise typer.Exit(code=2) from None


def milliseconds(value: float | None, fmt: str = ",.1f") -> str:
    """Seconds as milliseconds for a table; an em dash when there is no value."""
    return "—" if value is None or math.isnan(value) else format(value * 1e3, fmt)
