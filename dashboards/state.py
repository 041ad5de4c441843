"""Session state shared by the pages: the scenario being edited, and the cached run."""

from __future__ import annotations

import copy
from typing import Any

import streamlit as st

from dashboards.core import content_key, default_data, parse_data, simulate
from sim.planning.sweep import replications
from sim.run import SimResult
from sim.scenario import Scenario

SCENARIO = "scenario_data"
SAVED = "saved_scenarios"


def scenario_data() -> dict[str, Any]:
    """The scenario dict the pages edit (the embedded default at first)."""
    if SCENARIO not in st.session_state:
        st.session_state[SCENARIO] = default_data()
    data: dict[str, Any] = st.session_state[SCENARIO]
    return data


def set_scenario_data(data: dict[str, Any]) -> None:
    st.session_state[SCENARIO] = data


@st.cache_data(show_spinner=False, max_entries=32)
def _run(key: str, scenario_json: str) -> SimResult:
    """One simulation per distinct scenario (``key`` is its content hash)."""
    return simulate(Scenario.model_validate_json(scenario_json))


def run(scenario: Scenario) -> SimResult:
    """The scenario's results, simulated once per content."""
    return _run(content_key(scenario), scenario.model_dump_json())


@st.cache_data(show_spinner=False, max_entries=16)
def _replicate(key: str, scenario_json: str, num_seeds: int) -> dict[str, Any]:
    """Mean ± 95 % interval over ``num_seeds`` seeds (``key`` is the scenario's content hash)."""
    data = Scenario.model_validate_json(scenario_json).model_dump(mode="json")
    return replications(data, num_seeds)


def replicate(scenario: Scenario, num_seeds: int) -> dict[str, Any]:
    """The scenario's metrics over ``num_seeds`` seeds from its own, computed once per content."""
    return _replicate(content_key(scenario), scenario.model_dump_json(), num_seeds)


def saved_scenarios() -> dict[str, dict[str, Any]]:
    """Scenarios saved for comparison this session, by name."""
    saved: dict[str, dict[str, Any]] = st.session_state.setdefault(SAVED, {})
    return saved


def save_scenario(name: str, data: dict[str, Any]) -> None:
    saved_scenarios()[name] = copy.deepcopy(data)


def current_scenario() -> tuple[Scenario | None, list[str]]:
    parsed = parse_data(scenario_data())
    return parsed.scenario, parsed.errors
