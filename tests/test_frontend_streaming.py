"""The front end streams tokens through one host thread per replica (Replica.delivered_s).

``per_streamed_token_s`` is host time per streamed token, off the engine's critical path: at
light load every token reaches its client that much per token of its step later; when tokens
come faster than the front end streams them, the lag grows while the engine runs on at the
same pace. 0 changes nothing.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from sim.run import SimResult, build, scenario_requests
from sim.scenario import parse_scenario
from tests.factories import scenario_dict
from tests.test_fast_forward import assert_same, run_both


def with_streaming(data: dict[str, Any], per_token_s: float) -> dict[str, Any]:
    variant = copy.deepcopy(data)
    variant["latency"] = {"type": "roofline", "per_streamed_token_s": per_token_s}
    return variant


def simulate(data: dict[str, Any]) -> SimResult:
    return build(parse_scenario(data)).run()


def constant_lengths(rate: float, prompt: int, output: int, count: int) -> dict[str, Any]:
    """A Poisson workload of ``count`` requests of constant lengths."""
    return scenario_dict(
        workload={
            "arrival": {"type": "poisson", "rate": rate},
            "prompt_tokens": {"type": "constant", "value": prompt},
            "output_tokens": {"type": "constant", "value": output},
            "num_requests": count,
        }
    )


def light() -> dict[str, Any]:
    """One request at a time: nothing queues in the engine or the front end."""
    return constant_lengths(0.2, 256, 32, 20)


def heavy() -> dict[str, Any]:
    """Many requests decoding at once: thousands of tokens a second on one replica."""
    return constant_lengths(40, 128, 128, 400)


def test_zero_cost_is_the_model_without_a_front_end_thread() -> None:
    base = simulate(light())
    zero = simulate(with_streaming(light(), 0.0))
    assert base.records.equals(zero.records)


def test_at_light_load_each_token_arrives_its_cost_after_its_step() -> None:
    cost = 0.002  # below one decode step of the 8B model on an H100 (~7 ms)
    base = simulate(light()).records
    slow = simulate(with_streaming(light(), cost)).records
    isolated = base["scheduled_s"] >= base["arrival_s"].shift(1) + base["e2e_s"].shift(1) + 0.1
    assert isolated.sum() > 10
    # A lone request's step emits one token: it leaves ``cost`` later, and so does its last.
    np.testing.assert_allclose(slow["ttft_s"][isolated], base["ttft_s"][isolated] + cost)
    np.testing.assert_allclose(slow["e2e_s"][isolated], base["e2e_s"][isolated] + cost)
    np.testing.assert_allclose(slow["tpot_s"][isolated], base["tpot_s"][isolated])


def test_a_front_end_slower_than_the_engine_falls_behind_while_the_engine_does_not() -> None:
    base = simulate(heavy())
    tokens_per_s = base.summary["throughput"]["output_tokens_per_s"]
    cost = 2.0 / tokens_per_s  # the front end streams half the tokens the engine makes
    slow = simulate(with_streaming(heavy(), cost))
    # The engine's own work is the same: the same steps, the same busy time.
    assert slow.summary["sim"]["events"] == base.summary["sim"]["events"]
    assert slow.records["scheduled_s"].equals(base.records["scheduled_s"])
    lag = slow.records["e2e_s"] - base.records["e2e_s"]
    assert (lag > 0).all()
    # The backlog grows through the run: late requests wait on the front end far longer.
    ordered = lag.to_numpy()
    assert ordered[-50:].mean() > 5 * ordered[:50].mean()
    # The last token leaves when the front end has streamed all of them.
    total = int(slow.records["output_tokens"].sum())
    assert slow.records["finish_s"].max() >= total * cost * 0.99


def test_fast_forward_streams_the_same_tokens_as_step_by_step() -> None:
    for data in (with_streaming(heavy(), 2e-4), with_streaming(light(), 0.002)):
        fast, step = run_both(data)
        assert fast.summary["sim"]["fast_forwarded_steps"] > 0
        assert_same(fast, step)


def test_a_later_turn_follows_the_answer_the_client_saw() -> None:
    data = with_streaming(
        scenario_dict(
            workload={
                "arrival": {"type": "poisson", "rate": 4},
                "prompt_tokens": {"type": "constant", "value": 128},
                "output_tokens": {"type": "constant", "value": 64},
                "num_requests": 120,
                "prefix": {
                    "type": "multi_turn",
                    "turns": {"type": "constant", "value": 3},
                    "think_time_s": 0.5,
                },
            }
        ),
        0.003,
    )
    scenario = parse_scenario(data)
    requests = scenario_requests(scenario)
    parent_of = {r.request_id: r.parent_id for r in requests}
    think_of = {r.request_id: r.think_time_s for r in requests}
    records = build(scenario).run().records.set_index("request_id")
    children = [i for i, parent in parent_of.items() if parent >= 0]
    assert len(children) > 50
    parents = [parent_of[i] for i in children]
    gap = (
        records.loc[children, "arrival_s"].to_numpy() - records.loc[parents, "finish_s"].to_numpy()
    )
    # The think time runs from when the client has the whole answer, not from the engine's
    # last step (which is up to a step's tokens times the cost earlier).
    np.testing.assert_allclose(gap, [think_of[i] for i in children], atol=1e-9)


def test_a_negative_cost_is_refused_with_the_field_named() -> None:
    from sim.scenario import ScenarioError

    with pytest.raises(ScenarioError, match="per_streamed_token_s"):
        parse_scenario(with_streaming(light(), -1e-4))
