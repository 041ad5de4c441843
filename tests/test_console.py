"""The progress bar every command shares: what it draws on stderr, and nothing when disabled."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
from rich.console import Console

import sim.console
from sim.console import progress


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """What the commands' stderr console receives, drawn as on a terminal 100 columns wide."""
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=100, color_system=None)
    monkeypatch.setattr(sim.console, "stderr", console)
    return buffer


def test_a_bar_shows_its_description_and_count(drawn: io.StringIO) -> None:
    with progress("simulating", 4) as update:
        hook: Callable[[int, int], None] = update
        hook(1, 4)
        hook(4, 4)
    text = drawn.getvalue()
    assert "simulating" in text and "4/4" in text


def test_an_open_total_is_set_by_the_first_update_and_details_follow_the_description(
    drawn: io.StringIO,
) -> None:
    with progress("measuring") as update:
        hook: Callable[[int, int, str], None] = update
        hook(0, 5, "warm-up")
        hook(3, 5, "decode batch 8")
    text = drawn.getvalue()
    assert "measuring decode batch 8" in text and "3/5" in text
    assert "0/?" in text  # before the first update the total is unknown


def test_a_disabled_bar_draws_nothing(drawn: io.StringIO) -> None:
    with progress("simulating", 2, disable=True) as update:
        update(2, 2)
    assert drawn.getvalue() == ""


def test_the_bar_is_transient_and_the_block_result_passes_through(drawn: io.StringIO) -> None:
    with progress("candidates", 1) as update:
        update(1, 1)
        result = 42
    assert result == 42
    assert drawn.getvalue().endswith("\x1b[2K")  # the bar erases itself when the block ends
