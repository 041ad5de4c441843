"""The loaded replays of ``servesim calibrate`` (calibration/loaded.py) against a simulated
server whose step costs are known: the replays are sized from the capacity they measure, their
steps are rebuilt and fitted with the isolated points, and each is left out in turn.
(tests/live/test_measure_live.py runs them against a real vLLM server.)"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from calibration.fit import predict_seconds
from calibration.loaded import (
    BURST_MAX_BATCHES,
    LOADED_SHARES,
    MIN_LOADED_S,
    fit_loaded,
    replays_from_summary,
    retimed_requests,
    run_loaded,
)
from calibration.observations import Observation
from calibration.replay_fit import ReplayOutcome, completed_rate
from sim.engine.coefficients import CalibratedCoefficients
from sim.engine.latency import BatchShape
from sim.engine.request import Request
from sim.run import build
from sim.scenario import Scenario, parse_scenario
from tests.factories import scenario_dict
from tests.test_steps_rebuild import TRUTH


def scenario(**workload: object) -> Scenario:
    return parse_scenario(
        scenario_dict(
            workload={
                "arrival": {"type": "poisson", "rate": 3},
                "prompt_tokens": {"type": "uniform", "low": 32, "high": 900},
                "output_tokens": {"type": "uniform", "low": 4, "high": 120},
                "prefix": {"type": "shared", "num_groups": 2, "prefix_tokens": 128, "share": 0.5},
                "num_requests": 100,
                **workload,
            },
            seed=5,
        )
    )


class SimulatedServer:
    """A 'server' that is the simulator with ``truth``'s costs (TRUTH's by default); it
    remembers what it ran."""

    def __init__(self, truth: CalibratedCoefficients = TRUTH) -> None:
        self.truth = truth
        self.runs: list[tuple[list[Request], Path]] = []
        self.now = 0.0  # seconds the replays took, one after the other

    def __call__(self, scenario: Scenario, requests: list[Request], out_dir: Path) -> ReplayOutcome:
        self.runs.append((requests, out_dir))
        output = scenario.output.model_copy(update={"record_token_times": True})
        traced = scenario.model_copy(update={"output": output})
        result = build(traced, requests=requests, coefficients=self.truth).run()
        assert result.token_times is not None
        self.now += float(result.records["finish_s"].max())
        result.write(out_dir)  # as the live runner does: records and token times
        return ReplayOutcome(result.records, result.token_times)


def isolated_points(truth: CalibratedCoefficients) -> list[Observation]:
    """The isolated calibration's kinds of points, timed exactly by ``truth``."""
    shapes = [
        BatchShape(
            num_prefill_tokens=n,
            num_prefill_seqs=1,
            prefill_attention_pairs=n * (n + 1) // 2,
            num_sampled=1,
        )
        for n in (32, 128, 512, 1024, 2048)
    ] + [
        BatchShape(num_decode_seqs=b, decode_context_tokens=b * c, num_sampled=b)
        for b in (1, 8, 32)
        for c in (128, 1024)
    ]
    seconds = predict_seconds(truth, [Observation(s, 1.0, "decode") for s in shapes])
    return [
        Observation(s, float(t), "prefill" if s.num_prefill_seqs else "decode")
        for s, t in zip(shapes, seconds, strict=True)
    ]


def test_first_turns_are_retimed_and_the_requests_kept() -> None:
    base = scenario()
    poisson = retimed_requests(base, 4.0, 400, seed=9)
    assert len(poisson) == 400
    arrivals = np.array([r.arrival_s for r in poisson])
    assert arrivals[0] == 0 and np.all(np.diff(arrivals) >= 0)
    assert 400 / arrivals[-1] == pytest.approx(4.0, rel=0.15)
    burst = retimed_requests(base, math.inf, 400, seed=9)
    assert all(r.arrival_s == 0 for r in burst)
    # The same requests (lengths and prefixes), only their arrivals moved.
    assert [dataclasses.replace(r, arrival_s=0.0) for r in poisson] == burst
    # Sessions: later turns still follow their parent; the rate counts every turn.
    sessions = scenario(
        prefix={
            "type": "multi_turn",
            "turns": {"type": "uniform", "low": 2, "high": 4},
            "think_time_s": 1.0,
            "system_prompt_tokens": 64,
        }
    )
    turns = retimed_requests(sessions, 6.0, 300, seed=2)
    firsts = [r for r in turns if r.parent_id < 0]
    assert len(firsts) < len(turns)
    assert all(math.isnan(r.arrival_s) for r in turns if r.parent_id >= 0)
    span = max(r.arrival_s for r in firsts)
    assert len(turns) / span == pytest.approx(6.0, rel=0.25)


def test_loaded_steps_pull_a_wrong_isolated_fit_to_the_server(tmp_path: Path) -> None:
    base = scenario()
    # The isolated points were measured on a server in another mood: 40% fast on decodes.
    isolated_truth = dataclasses.replace(
        TRUTH,
        per_decode_seq_s=0.6 * TRUTH.per_decode_seq_s,
        per_context_token_s=0.6 * TRUTH.per_context_token_s,
    )
    isolated = isolated_points(isolated_truth)
    server = SimulatedServer()
    notes: list[str] = []
    replays = run_loaded(base, isolated_truth, server, tmp_path, budget_s=60, notes=notes)
    assert [r.name for r in replays] == ["burst", "poisson 50%", "poisson 85%"], notes
    assert [out for _, out in server.runs] == [
        tmp_path / "burst",
        tmp_path / "poisson_50pct",
        tmp_path / "poisson_85pct",
    ]
    # The Poisson loads are sized from the capacity the burst measured, not the isolated fit's.
    capacity = completed_rate(replays[0].outcome.records)
    assert replays[1].offered_rps == pytest.approx(0.5 * capacity)
    assert replays[2].offered_rps == pytest.approx(0.85 * capacity)
    assert all(len(r.steps.observations) > 50 for r in replays)

    fit = fit_loaded(base, isolated, isolated_truth, replays)
    assert fit.report.method == "isolated_points_and_loaded_steps"
    by_name = {entry["name"]: entry for entry in fit.replays}
    for entry in by_name.values():
        alone, joint = entry["isolated_fit"], entry["joint_fit"]
        assert joint["step_relative_error_mean"] < alone["step_relative_error_mean"]
        assert abs(joint["e2e_mean_error"]) < abs(alone["e2e_mean_error"])
        # By kind of step: the isolated fit is short on the steps without a prompt (the
        # decodes it prices 40% low), the joint fit much less so.
        alone_ratio, joint_ratio = alone["step_ratio_median"], joint["step_ratio_median"]
        assert alone_ratio["decode"] > 1.05
        assert abs(joint_ratio["decode"] - 1) < abs(alone_ratio["decode"] - 1)
        assert alone_ratio["decode_steps"] + alone_ratio["prompt_steps"] == entry["steps_rebuilt"]
        # The joint fit's TTFT split as vLLM's /metrics split it; this server has none.
        assert entry["server_ttft"] is None
        parts = entry["simulated_ttft"]
        assert parts["outside_engine"] == fit.coefficients.frontend_overhead_s
        assert parts["queue"] >= 0 and parts["prefill"] > 0
        assert parts["outside_engine"] + parts["queue"] + parts["prefill"] == pytest.approx(
            parts["ttft"]
        )
    # Each replay left out in turn, predicted from the isolated points and the others; the
    # weight of the loaded steps is the one whose left-out replays came out best, and here,
    # where the isolated points are wrong, that is the largest.
    assert [h["workload"] for h in fit.report.held_out] == list(by_name)
    assert {h["loaded_share"] for h in fit.report.held_out} == {LOADED_SHARES[-1]}
    assert any(note.startswith("loaded steps weigh 95%") for note in fit.report.notes)
    for held in fit.report.held_out:
        assert 0 <= float(held["step_relative_error_mean"]) < 0.5
        assert math.isfinite(float(held["ttft_mean_error"]))
    # What the fit summarised is enough to read the replays back and refit them, server gone.
    again = replays_from_summary(
        base, fit.replays, max_num_batched_tokens=base.engine.max_num_batched_tokens
    )
    assert [r.requests for r in again] == [r.requests for r in replays]
    assert [r.steps.observations for r in again] == [r.steps.observations for r in replays]
    assert fit_loaded(base, isolated, isolated_truth, again).coefficients == fit.coefficients
    # The fit lands between the two servers, nearer the loaded one on decode cost (the steps
    # and the isolated points weigh the same, and decode dominates the loaded steps).
    assert (
        isolated_truth.per_decode_seq_s
        < fit.coefficients.per_decode_seq_s
        <= TRUTH.per_decode_seq_s * 1.05
    )


def test_the_front_ends_cost_per_streamed_token_is_found_in_the_replays(tmp_path: Path) -> None:
    base = scenario()
    # A front end that streams about a thousand tokens a second: near its limit under a burst
    # of this server, and invisible in the isolated points (the steps are TRUTH's).
    truth = dataclasses.replace(TRUTH, per_streamed_token_s=1e-3)
    server = SimulatedServer(truth)
    replays = run_loaded(base, TRUTH, server, tmp_path, budget_s=60, clock=lambda: server.now)
    assert len(replays) == 3
    fit = fit_loaded(base, isolated_points(TRUTH), TRUTH, replays, search_streaming=True)
    assert fit.coefficients.per_streamed_token_s == pytest.approx(1e-3, rel=0.25)
    assert any(note.startswith("front end: ") for note in fit.report.notes), fit.report.notes
    # Left out in turn, each replay is predicted with the cost found on the other two.
    for held in fit.report.held_out:
        assert float(held["per_streamed_token_s"]) == pytest.approx(1e-3, rel=0.5)
        assert abs(float(held["e2e_mean_error"])) < 0.1, fit.report.held_out
    # Without a front-end cost in the server, the search finds (next to) none.
    plain_server = SimulatedServer()
    replays = run_loaded(
        base, TRUTH, plain_server, tmp_path / "plain", budget_s=60, clock=lambda: plain_server.now
    )
    plain = fit_loaded(base, isolated_points(TRUTH), TRUTH, replays, search_streaming=True)
    assert plain.coefficients.per_streamed_token_s == 0.0


def test_a_budget_too_short_runs_no_replay_and_says_so(tmp_path: Path) -> None:
    server = SimulatedServer()
    notes: list[str] = []
    replays = run_loaded(scenario(), TRUTH, server, tmp_path, MIN_LOADED_S - 1, notes=notes)
    assert replays == [] and server.runs == []
    assert "raise --budget" in notes[0]


def faster(truth: CalibratedCoefficients, factor: float) -> CalibratedCoefficients:
    """An isolated fit ``factor`` times too fast on every step cost."""
    return dataclasses.replace(
        truth,
        step_overhead_s=truth.step_overhead_s / factor,
        per_prefill_token_s=truth.per_prefill_token_s / factor,
        per_decode_seq_s=truth.per_decode_seq_s / factor,
        per_context_token_s=truth.per_context_token_s / factor,
    )


def test_a_burst_that_overran_shortens_the_replays_after_it(tmp_path: Path) -> None:
    # The isolated fit is 3× too fast: the burst, sized for 30% of the budget at the capacity
    # it predicts, takes most of it on this server. The Poisson replays share what is left.
    fast = faster(TRUTH, 3)
    server = SimulatedServer()
    notes: list[str] = []
    replays = run_loaded(
        scenario(), fast, server, tmp_path, budget_s=60, notes=notes, clock=lambda: server.now
    )
    assert [r.name for r in replays] == ["burst", "poisson 50%", "poisson 85%"], notes
    burst_s = float(replays[0].outcome.records["finish_s"].max())
    assert burst_s > 0.6 * 60
    assert "poisson 50%" in notes[0] and "shortened" in notes[0], notes
    assert len(replays[1].requests) < len(replays[2].requests)  # 30 and 40% of what was left
    assert server.now < 1.5 * 60
    # With the server's own coefficients the same budget runs all three unshortened.
    server = SimulatedServer()
    notes = []
    replays = run_loaded(
        scenario(), TRUTH, server, tmp_path, 60, notes=notes, clock=lambda: server.now
    )
    assert len(replays) == 3 and notes == []


def test_a_replay_that_would_overrun_the_budget_is_not_run(tmp_path: Path) -> None:
    # 10× too fast: the burst takes the whole budget and more; nothing fits after it.
    fast = faster(TRUTH, 10)
    server = SimulatedServer()
    notes: list[str] = []
    replays = run_loaded(
        scenario(), fast, server, tmp_path, budget_s=60, notes=notes, clock=lambda: server.now
    )
    assert [r.name for r in replays] == ["burst"]
    assert "poisson 50%: not run" in notes[0], notes


def test_the_burst_holds_a_few_full_batches_at_most(tmp_path: Path) -> None:
    base = scenario()
    small = base.model_copy(update={"engine": base.engine.model_copy(update={"max_num_seqs": 4})})
    server = SimulatedServer()
    replays = run_loaded(small, TRUTH, server, tmp_path, 600, clock=lambda: server.now)
    assert len(replays[0].requests) == BURST_MAX_BATCHES * 4
    # The Poisson replays are sized by time, not by batches.
    assert len(replays[2].requests) > BURST_MAX_BATCHES * 4
