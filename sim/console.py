"""What every ``servesim`` command shares: the stderr console, a clean exit on bad input, and
number formatting. Bad input ends with a message and exit code 2, never a traceback.
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

from sim.scenario import Scenario, ScenarioError, default_scenario, load_scenario

stderr = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` to stderr and exit (the message is text, not rich markup)."""
    stderr.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
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
