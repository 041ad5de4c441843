"""Shared test fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: Real public traces and profiles (see shared/data/SOURCES.md), beside the repository.
SHARED_DATA = Path(
    os.environ.get("SERVESIM_SHARED_DATA", Path(__file__).parents[2] / "shared" / "data")
)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared/data folder; tests that read real traces fail loudly if it is missing."""
    assert SHARED_DATA.is_dir(), f"shared data not found at {SHARED_DATA}; set SERVESIM_SHARED_DATA"
    return SHARED_DATA
