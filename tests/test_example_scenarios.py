"""Every scenario shipped in scenarios/ validates and runs (scaled down to a few requests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.run import run
from sim.scenario import load_scenario, parse_scenario

REPO = Path(__file__).parents[1]
SCENARIOS = sorted((REPO / "scenarios").glob("*.yaml"))


def test_there_are_example_scenarios() -> None:
    assert len(SCENARIOS) >= 4


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_example_scenario_runs(
    path: Path, shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Trace paths in the examples are relative to the repository root (../shared/data/...).
    monkeypatch.chdir(REPO)
    data = load_scenario(path).model_dump(mode="json", exclude_none=True)
    data["workload"]["num_requests"] = 60
    result = run(parse_scenario(data))
    assert len(result.records) == 60
    assert result.summary["requests"]["ok"] > 0
