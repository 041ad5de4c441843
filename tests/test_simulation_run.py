"""The pieces of one run (sim/simulation.py's _Run) on their own: release of later turns, the
first stop reason wins, the deadline, the sampling interval's stretch, and cancellation."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sim.engine.request import Record, RequestStatus
from sim.report.record_sink import KeptRecords
from sim.run import build
from sim.scenario import parse_scenario
from sim.simulation import MAX_SAMPLES, Simulation, _Run
from tests.factories import scenario_dict


def simulation(**workload: Any) -> Simulation:
    base = {
        "arrival": {"type": "poisson", "rate": 5},
        "prompt_tokens": {"type": "constant", "value": 128},
        "output_tokens": {"type": "constant", "value": 16},
        "num_requests": 20,
    }
    return build(parse_scenario(scenario_dict(workload={**base, **workload})))


def kept(state: _Run) -> list[Record]:
    """The records a run kept."""
    assert isinstance(state.finished, KeptRecords)
    return state.finished.records


def test_a_run_makes_one_record_per_request_and_roots_in_arrival_order() -> None:
    sim = simulation()
    state = _Run(sim, progress=None)
    arrivals = [r.arrival_s for r in state.roots]
    assert arrivals == sorted(arrivals)
    assert state.last_root_s == arrivals[-1]
    assert not state.in_flight  # a record is made when its request is sent
    state.execute()
    assert isinstance(state.finished, KeptRecords)
    ids = sorted(r.request_id for r in state.finished.records)
    assert ids == [r.request_id for r in sim.requests]
    assert not state.in_flight


def test_the_first_stop_reason_is_the_one_reported_and_the_rest_are_cancelled() -> None:
    state = _Run(simulation(), progress=None)
    state.stop("first")
    state.stop("second")
    assert state.stopped.triggered and state.stop_reason == "first"
    state.execute()  # stopped before anything ran: every request is cancelled with the reason
    records = kept(state)
    assert len(records) == 20 and not state.in_flight
    assert {r.status for r in records} == {RequestStatus.CANCELLED}
    assert all("first" in (r.error or "") for r in records)


def test_the_deadline_stops_a_run_at_its_time() -> None:
    state = _Run(simulation(num_requests=200), progress=None)
    state.env.process(state.deadline(2.0))
    state.execute()
    assert state.env.now == pytest.approx(2.0)
    assert "simulated time reached 2 s" in state.stop_reason
    assert len(kept(state)) == 200 and not state.in_flight
    statuses = {r.status for r in kept(state)}
    assert RequestStatus.CANCELLED in statuses and RequestStatus.OK in statuses


def test_the_sampling_interval_stretches_to_at_most_max_samples() -> None:
    state = _Run(simulation(), progress=None)
    assert state.sample_interval_s() == state.simulation.sample_interval_s
    long_run = _Run(simulation(), progress=None)
    long_run.last_root_s = MAX_SAMPLES * 10.0
    with pytest.warns(UserWarning, match="output.sample_interval_s"):
        assert long_run.sample_interval_s() == pytest.approx(10.0)


def test_a_later_turn_is_released_a_think_time_after_its_parent() -> None:
    sim = simulation(
        prefix={
            "type": "multi_turn",
            "turns": {"type": "constant", "value": 3},
            "think_time_s": 7.0,
        },
        num_requests=6,
    )
    result = sim.run()
    frame = result.records.set_index("request_id")
    children = [r for r in sim.requests if r.parent_id >= 0]
    assert children
    for child in children:
        parent_finish = frame.loc[child.parent_id, "finish_s"]
        released = parent_finish + child.think_time_s
        assert frame.loc[child.request_id, "arrival_s"] == pytest.approx(released)


def test_progress_is_reported_and_ends_at_the_total() -> None:
    calls: list[tuple[int, int]] = []
    sim = simulation()
    sim.run(progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (20, 20)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_a_request_is_never_scheduled_before_its_recorded_arrival(tmp_path: Any) -> None:
    # 197.548...·(100/197.548...) is one ulp above 100, and SimPy's clock reaches the wait's
    # end as ``now + (t - now)``, one ulp below it: the record must not say it arrived later.
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"prompt_tokens": 1, "output_tokens": 1, "arrival_s": 0.0}\n'
        '{"prompt_tokens": 1, "output_tokens": 1, "arrival_s": 43.54827904846354}\n'
        '{"prompt_tokens": 1, "output_tokens": 1, "arrival_s": 197.54827904846354}\n'
    )
    sim = simulation(
        arrival=None,
        prompt_tokens=None,
        output_tokens=None,
        trace={"path": str(trace), "time_scale": 100 / 197.54827904846354},
        num_requests=3,
    )
    records = sim.run().records
    assert (records["arrival_s"] <= records["scheduled_s"]).all()
    assert records["arrival_s"].iloc[-1] == pytest.approx(100.0)


def test_an_e2e_slo_is_judged_beside_ttft_and_tpot() -> None:
    from sim.run import build
    from sim.scenario import parse_scenario
    from tests.factories import scenario_dict

    data = scenario_dict(slo={"ttft_s": 10.0, "tpot_s": 1.0})
    loose = build(parse_scenario(data)).run().summary["slo"]
    assert loose["met"] and loose["e2e_target_s"] is None
    e2e = loose["e2e_at_percentile_s"]
    data["slo"]["e2e_s"] = e2e / 2
    tight = build(parse_scenario(data)).run().summary
    assert not tight["slo"]["met"] and tight["slo"]["e2e_target_s"] == e2e / 2
    assert tight["goodput"]["slo_attainment"] < 1.0


def test_a_mixture_of_experts_simulates_from_the_catalogue_and_from_dimensions() -> None:
    """A MoE scenario runs end to end; given by its dimensions it runs the same as the
    catalogue entry it copies."""
    from sim.catalog.models import get_model

    catalogue = build(parse_scenario(scenario_dict(model="qwen3-30b-a3b"))).run()
    assert catalogue.summary["requests"]["ok"] == catalogue.summary["requests"]["total"]
    latent = build(parse_scenario(scenario_dict(model="deepseek-v2-lite"))).run()
    assert latent.summary["requests"]["ok"] == latent.summary["requests"]["total"]
    fields = dataclasses.asdict(get_model("qwen3-30b-a3b"))
    for unsupported in ("attention_bias", "attention_output_bias"):  # not in a custom model
        fields.pop(unsupported)
    custom = build(parse_scenario(scenario_dict(model=fields))).run()
    assert custom.summary["ttft_s"] == catalogue.summary["ttft_s"]


@pytest.mark.parametrize("recording", [False, True])
def test_records_hold_token_times_only_when_the_run_records_them(recording: bool) -> None:
    # A big run has a record per request: without output.record_token_times none of them
    # carries a list (not even an empty one); with it, every completed one has a time a token.
    data = scenario_dict(output={"record_token_times": recording})
    simulation = build(parse_scenario(data))
    result = simulation.run()
    ok = [r for r in simulation.records if r.status == RequestStatus.OK]
    assert ok
    if recording:
        assert all(len(r.token_times_s or ()) == r.output_tokens for r in ok)
        assert result.token_times is not None
    else:
        assert all(r.token_times_s is None for r in simulation.records)
        assert result.token_times is None
