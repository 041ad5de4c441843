"""Closed-loop load (``workload.max_concurrency``, ``think_time_s``) and ``rate: inf``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from sim.run import build
from sim.scenario import ScenarioError, parse_scenario
from tests.factories import scenario_dict

LENGTHS = {
    "prompt_tokens": {"type": "uniform", "low": 64, "high": 512},
    "output_tokens": {"type": "uniform", "low": 8, "high": 64},
}


def run(**workload: Any) -> pd.DataFrame:
    data = scenario_dict(workload={**LENGTHS, "num_requests": 60, **workload})
    return build(parse_scenario(data)).run().records


def max_in_flight(records: pd.DataFrame) -> int:
    """The most requests between their send (arrival_s) and their answer at any instant."""
    events = sorted(
        [(t, 1) for t in records["arrival_s"]] + [(t, -1) for t in records["finish_s"]],
        key=lambda e: (e[0], e[1]),  # an answer frees its slot before the next send at that time
    )
    return int(np.max(np.cumsum([d for _, d in events])))


def test_infinite_rate_sends_every_request_at_once() -> None:
    records = run(arrival={"type": "poisson", "rate": "inf"})
    assert (records["arrival_s"] == 0).all()
    assert (records["status"] == "ok").all()


@pytest.mark.parametrize("users", [1, 3, 8])
def test_closed_loop_never_has_more_than_its_users_in_flight(users: int) -> None:
    records = run(arrival={"type": "poisson", "rate": "inf"}, max_concurrency=users)
    assert (records["status"] == "ok").all()
    assert max_in_flight(records) == users


def test_one_user_sends_the_next_request_a_think_time_after_the_answer() -> None:
    records = run(
        arrival={"type": "constant", "rate": float("inf")}, max_concurrency=1, think_time_s=0.5
    ).sort_values("arrival_s")
    gaps = records["arrival_s"].to_numpy()[1:] - records["finish_s"].to_numpy()[:-1]
    assert gaps == pytest.approx(np.full(len(gaps), 0.5))


def test_a_cap_on_an_open_loop_rate_delays_requests_and_never_sends_early() -> None:
    # A rate at which the open loop queues inside the server, well clear of the noise.
    arrival = {"type": "poisson", "rate": 100}
    open_loop = run(arrival=arrival).set_index("request_id")
    capped = run(arrival=arrival, max_concurrency=2).set_index("request_id")
    assert max_in_flight(capped) <= 2
    assert (capped["arrival_s"] >= open_loop["arrival_s"] - 1e-12).all()
    assert (capped["arrival_s"] > open_loop["arrival_s"] + 1e-9).any()
    # The client's queue, not the server's: a capped request waits less inside the server.
    assert capped["ttft_s"].mean() < open_loop["ttft_s"].mean()


def test_a_cap_above_the_load_changes_nothing() -> None:
    arrival = {"type": "poisson", "rate": 2}
    open_loop = run(arrival=arrival)
    capped = run(arrival=arrival, max_concurrency=1000)
    pd.testing.assert_frame_equal(open_loop, capped)


def test_closed_loop_sessions_hold_their_slots_too() -> None:
    prefix = {"type": "multi_turn", "turns": {"type": "constant", "value": 3}, "think_time_s": 0.2}
    records = run(arrival={"type": "poisson", "rate": "inf"}, max_concurrency=4, prefix=prefix)
    assert (records["status"] == "ok").all()
    assert max_in_flight(records) <= 4


def test_closed_loop_is_deterministic() -> None:
    workload = {"arrival": {"type": "gamma", "rate": 30, "cv": 2}, "max_concurrency": 3}
    pd.testing.assert_frame_equal(run(**workload), run(**workload))


@pytest.mark.parametrize(
    ("workload", "field", "hint"),
    [
        ({"think_time_s": 1.0}, "think_time_s", "max_concurrency"),
        ({"max_concurrency": 0}, "max_concurrency", ">= 1"),
        (
            {"arrival": {"type": "poisson", "rate": "inf"}, "num_requests": None, "duration_s": 60},
            "arrival",
            "num_requests",
        ),
        ({"arrival": {"type": "poisson", "rate": "nan"}}, "rate", "must be > 0"),
    ],
)
def test_bad_closed_loop_settings_name_the_field(
    workload: dict[str, Any], field: str, hint: str
) -> None:
    arrival = {"type": "poisson", "rate": 5}
    data = scenario_dict(workload={**LENGTHS, "arrival": arrival, "num_requests": 10, **workload})
    data["workload"] = {k: v for k, v in data["workload"].items() if v is not None}
    with pytest.raises(ScenarioError) as error:
        parse_scenario(data)
    message = "; ".join(error.value.problems)
    assert field in message and hint in message
