"""Requests whose only shareable blocks are a system prompt hold the rest by count
(Sequence.keyed_blocks): a simulator shortcut that must not change a single record."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

import sim.simulation
from sim.build.seeds import scenario_seeds
from sim.build.workload import build_requests
from sim.engine.request import keyed_prefix_requests
from sim.fleet.pool import Fleet
from sim.run import build
from sim.scenario import parse_scenario
from tests.factories import make_request, scenario_dict

SHARED = {
    "arrival": {"type": "poisson", "rate": 40},
    "prompt_tokens": {"type": "lognormal", "mean": 500, "p90": 1000, "max_tokens": 3000},
    "output_tokens": {"type": "lognormal", "mean": 150, "p90": 300, "max_tokens": 800},
    "prefix": {"type": "shared", "num_groups": 3, "prefix_tokens": 256, "share": 0.8},
    "num_requests": 600,
}
TIGHT = {"gpu_memory_utilization": 0.25, "max_model_len": 8192}  # preempts often

SCENARIOS: dict[str, dict[str, Any]] = {
    "fast-forward": {},
    "step by step": {"simulator": {"fast_forward": False}},
    "preempting": {"engine": TIGHT},
    "preempting, priority": {
        "engine": {**TIGHT, "scheduling_policy": "priority"},
        "workload": {
            **SHARED,
            "priority": {"classes": [{"priority": 0, "share": 0.3}, {"priority": 1, "share": 0.7}]},
        },
    },
    "prefill in small chunks": {  # the system prompt takes several steps
        "engine": {"max_num_batched_tokens": 64, "max_num_seqs": 32, "max_model_len": 8192}
    },
    "prefix affinity": {"fleet": {"replicas": 3, "router": {"policy": "prefix_affinity"}}},
    "sessions cut short": {  # 3-turn sessions, 100 requests: the last session is cut
        "workload": {
            **SHARED,
            "prefix": {
                "type": "multi_turn",
                "turns": {"type": "constant", "value": 3},
                "think_time_s": 1.0,  # no system prompt: a turn starts as its session does
            },
            "num_requests": 100,
        }
    },
}


def records(data: dict[str, Any]) -> pd.DataFrame:
    return build(parse_scenario(data)).run().records


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_keyed_prefix_gives_the_records_of_every_block_keyed(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = scenario_dict(**{"workload": SHARED, **SCENARIOS[name]})
    data["engine"] = {"max_model_len": 8192, **data.get("engine", {})}
    shortcut = records(data)
    # Every block keyed: no request is told that only its first segment can be shared.
    monkeypatch.setattr(sim.simulation, "ALL_SHARED_FIRST", None)
    monkeypatch.setattr(sim.simulation, "keyed_prefix_requests", lambda requests: None)
    keyed = records(data)
    pd.testing.assert_frame_equal(shortcut, keyed)
    if name.startswith("preempting"):
        assert keyed["num_preemptions"].sum() > 0


def test_which_requests_can_share_only_their_first_segment() -> None:
    system = make_request(0, prompt_tokens=300, shared_prefix_tokens=256)
    other = make_request(1, prompt_tokens=400, shared_prefix_tokens=256)
    alone = make_request(2, prompt_tokens=100)
    assert keyed_prefix_requests([system, other, alone]) == {0, 1}
    sessions = parse_scenario(
        scenario_dict(
            workload={
                **SHARED,
                "prefix": {
                    "type": "multi_turn",
                    "turns": {"type": "constant", "value": 3},
                    "think_time_s": 1.0,
                },
                "num_requests": 30,
            }
        )
    )
    turns = build_requests(sessions.workload, scenario_seeds(sessions)[0])
    keyed = keyed_prefix_requests(turns)
    # A later turn's prompt holds its parent's answer, so it is never one; nor is a turn whose
    # answer a later prompt holds.
    assert not any(r.parent_id >= 0 for r in turns if r.request_id in keyed)
    last_turns = {r.request_id for r in turns} - {r.parent_id for r in turns}
    assert keyed <= last_turns
    # The fleet gives such a request the full blocks of its first segment as keyed.
    fleet: Fleet | None = build(parse_scenario(scenario_dict(workload=SHARED))).make_fleet(
        __import__("simpy").Environment(), lambda record: None
    )
    assert isinstance(fleet, Fleet)
    assert fleet._keyed_blocks(other, 16) == 16 and fleet._keyed_blocks(alone, 16) == 0
