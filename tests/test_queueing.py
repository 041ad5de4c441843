"""The event engine against queueing theory: M/D/1 and M/M/1 waiting times, Little's law.

With ``max_num_seqs = 1`` and one output token, every request is exactly one engine step (its
prefill emits its only token), so a replica is a single FCFS server whose service time is the
step time: constant (M/D/1) or exponential (M/M/1). Pollaczek–Khinchine gives the mean wait
``W_q = λ E[S²] / (2 (1 − ρ))``: ``ρD / (2(1 − ρ))`` for M/D/1 and ``ρ / (μ − λ)`` for M/M/1.

The tolerances come from the spread over 16 seeds at 50k requests (relative standard deviation
of the mean wait ≈ 1.5 % for M/D/1 and ≈ 2.5 % for M/M/1 at ρ = 0.6): 3 % at 400k requests and
10 % at 50k are several standard deviations, while the two models differ by a factor of two.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from sim.run import SimResult, build
from sim.scenario import parse_scenario

STEP_S = 0.01  # service time D (M/D/1) or mean service time 1/μ (M/M/1)
RATE = 60.0  # λ: ρ = λ·D = 0.6
RHO = RATE * STEP_S
SEED = 1


def single_server(
    latency: dict[str, Any],
    *,
    num_requests: int,
    rate: float = RATE,
    seed: int = SEED,
    sample_interval_s: float = 1.0,
) -> SimResult:
    """One replica that serves one single-step request at a time, under Poisson arrivals."""
    scenario = parse_scenario(
        {
            "model": "llama-3.1-8b",
            "gpu": "h100-sxm",
            "engine": {
                "max_num_seqs": 1,
                "max_num_batched_tokens": 64,
                "max_model_len": 128,
                "enable_prefix_caching": False,
            },
            "workload": {
                "arrival": {"type": "poisson", "rate": rate},
                "prompt_tokens": {"type": "constant", "value": 64},
                "output_tokens": {"type": "constant", "value": 1},
                "num_requests": num_requests,
            },
            "latency": latency,
            "seed": seed,
            "output": {"sample_interval_s": sample_interval_s},
        }
    )
    return build(scenario).run()


def md1_wait_s(rho: float, service_s: float) -> float:
    """Pollaczek–Khinchine mean wait in queue for M/D/1."""
    return rho * service_s / (2.0 * (1.0 - rho))


def mm1_wait_s(arrival_rate: float, service_rate: float) -> float:
    """Mean wait in queue for M/M/1: ρ / (μ − λ)."""
    return (arrival_rate / service_rate) / (service_rate - arrival_rate)


def relative_error(measured: float, expected: float) -> float:
    return abs(measured / expected - 1.0)


def constant_steps() -> dict[str, Any]:
    return {"type": "constant", "step_s": STEP_S}


def exponential_steps() -> dict[str, Any]:
    return {"type": "exponential", "mean_s": STEP_S}


def assert_one_step_per_request(records: pd.DataFrame) -> None:
    """The single-server premise: all ok, first token == finish, servers never overlap."""
    assert (records["status"] == "ok").all()
    assert (records["first_token_s"] == records["finish_s"]).all()
    in_order = records.sort_values("scheduled_s")
    # Each request starts only after the previous one finished (one server, FCFS).
    assert (in_order["scheduled_s"].to_numpy()[1:] >= in_order["finish_s"].to_numpy()[:-1]).all()
    assert (in_order["request_id"].diff().dropna() > 0).all()


@pytest.fixture(scope="module")
def md1_run() -> SimResult:
    """M/D/1 at ρ = 0.6, 50k requests, sampled every 50 ms (shared by several tests)."""
    return single_server(constant_steps(), num_requests=50_000, sample_interval_s=0.05)


@pytest.fixture(scope="module")
def mm1_run() -> SimResult:
    """M/M/1 at ρ = 0.6, 50k requests, sampled every 50 ms (shared by several tests)."""
    return single_server(exponential_steps(), num_requests=50_000, sample_interval_s=0.05)


# --- M/D/1 -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_md1_mean_wait_matches_pollaczek_khinchine_within_3_percent() -> None:
    result = single_server(constant_steps(), num_requests=400_000)
    records = result.records
    wait = md1_wait_s(RHO, STEP_S)
    # measured/theory ≈ 0.99 for this seed
    assert relative_error(records["queue_s"].mean(), wait) < 0.03
    assert relative_error(records["e2e_s"].mean(), wait + STEP_S) < 0.03
    # The same number is far from the M/M/1 formula at the same ρ (twice as long a wait), so the
    # 3 % tolerance separates service-time distributions.
    assert relative_error(records["queue_s"].mean(), mm1_wait_s(RATE, 1 / STEP_S)) > 0.3


def test_md1_mean_wait_matches_pollaczek_khinchine_within_10_percent(md1_run: SimResult) -> None:
    records = md1_run.records
    assert_one_step_per_request(records)
    # Service time is exactly one constant step.
    assert (records["e2e_s"] - records["queue_s"]).to_numpy() == pytest.approx(STEP_S, rel=1e-9)
    wait = md1_wait_s(RHO, STEP_S)
    assert relative_error(records["queue_s"].mean(), wait) < 0.10
    assert relative_error(records["e2e_s"].mean(), wait + STEP_S) < 0.10
    assert relative_error(records["queue_s"].mean(), mm1_wait_s(RATE, 1 / STEP_S)) > 0.3


def test_md1_fraction_served_at_once_is_one_minus_rho(md1_run: SimResult) -> None:
    # PASTA: an arrival finds the server idle with probability 1 − ρ, and then waits exactly 0.
    records = md1_run.records
    served_at_once = float((records["queue_s"] == 0.0).mean())
    assert served_at_once == pytest.approx(1.0 - RHO, abs=0.02)
    assert (records["queue_s"] >= 0.0).all()


@pytest.mark.parametrize("rho", [0.3, 0.8])
def test_md1_mean_wait_follows_the_load(rho: float) -> None:
    # The waits at ρ = 0.3 and 0.8 differ by a factor of about 9; each must track its formula.
    records = single_server(constant_steps(), num_requests=50_000, rate=rho / STEP_S).records
    tolerance = 0.10 if rho < 0.5 else 0.15  # heavier load: more correlated waits
    assert relative_error(records["queue_s"].mean(), md1_wait_s(rho, STEP_S)) < tolerance


# --- M/M/1 -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_mm1_mean_wait_matches_theory_within_3_percent() -> None:
    records = single_server(exponential_steps(), num_requests=400_000).records
    wait = mm1_wait_s(RATE, 1 / STEP_S)
    assert relative_error(records["queue_s"].mean(), wait) < 0.03
    assert relative_error(records["e2e_s"].mean(), wait + STEP_S) < 0.03
    assert relative_error(records["queue_s"].mean(), md1_wait_s(RHO, STEP_S)) > 0.3


def test_mm1_mean_wait_matches_theory_within_10_percent(mm1_run: SimResult) -> None:
    records = mm1_run.records
    assert_one_step_per_request(records)
    service = records["e2e_s"] - records["queue_s"]
    # Service times are exponential: mean 1/μ and coefficient of variation 1.
    assert relative_error(service.mean(), STEP_S) < 0.02
    assert relative_error(service.std() / service.mean(), 1.0) < 0.03
    wait = mm1_wait_s(RATE, 1 / STEP_S)
    assert relative_error(records["queue_s"].mean(), wait) < 0.10
    assert relative_error(records["e2e_s"].mean(), wait + STEP_S) < 0.10
    assert relative_error(records["queue_s"].mean(), md1_wait_s(RHO, STEP_S)) > 0.3


def test_mm1_fraction_served_at_once_is_one_minus_rho(mm1_run: SimResult) -> None:
    records = mm1_run.records
    served_at_once = float((records["queue_s"] == 0.0).mean())
    assert served_at_once == pytest.approx(1.0 - RHO, abs=0.02)


# --- Little's law ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("run_name", "wait"),
    [("md1_run", md1_wait_s(RHO, STEP_S)), ("mm1_run", mm1_wait_s(RATE, 1 / STEP_S))],
)
def test_littles_law_from_the_time_series(
    run_name: str, wait: float, request: pytest.FixtureRequest
) -> None:
    # Sampled every 50 ms (~16k samples): time-average queue length L_q = λ·W_q, and the
    # time-average number in service is ρ.
    result: SimResult = request.getfixturevalue(run_name)
    series = result.timeseries
    assert len(series) > 10_000
    assert relative_error(series["num_requests_waiting"].mean(), RATE * wait) < 0.10
    assert relative_error(series["num_requests_running"].mean(), RHO) < 0.05
    # And Little's law within the run itself: L_q from samples vs λ̂·W_q from the records.
    records = result.records
    span_s = records["finish_s"].max() - records["arrival_s"].min()
    measured_rate = len(records) / span_s
    little = measured_rate * records["queue_s"].mean()
    assert relative_error(series["num_requests_waiting"].mean(), little) < 0.05
