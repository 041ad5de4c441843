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
#: The widget keys of the scenario page's knobs, cleared when a whole scenario is loaded.
KNOBS = "scenario_knob_keys"
#: A message for the next run of the page (a load reruns the page before it can show one).
FLASH = "scenario_flash"


def scenario_data() -> dict[str, Any]:
    """The scenario dict the pages edit (the embedded default at first)."""
    if SCENARIO not in st.session_state:
        st.session_state[SCENARIO] = default_data()
    data: dict[str, Any] = st.session_state[SCENARIO]
    return data


def set_scenario_data(data: dict[str, Any]) -> None:
    st.session_state[SCENARIO] = data


def knob_key(key: str) -> str:
    """``key``, remembered as the key of a widget that shows one of the scenario's values."""
    knobs: set[str] = st.session_state.setdefault(KNOBS, set())
    knobs.add(key)
    return key


def load_scenario(data: dict[str, Any], message: str) -> None:
    """Replace the whole scenario (a preset, pasted or uploaded YAML) and rerun the page.

    A knob widget keeps its own value across reruns and would write it back over the loaded
    scenario, so every knob's state is dropped: the next run draws each from the new scenario.
    """
    for key in st.session_state.get(KNOBS, set()):
        st.session_state.pop(key, None)
    set_scenario_data(data)
    st.session_state[FLASH] = message
    st.rerun()


def pop_flash() -> str | None:
    """The message a load left for this run, once."""
    message: str | None = st.session_state.pop(FLASH, None)
    return message


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
