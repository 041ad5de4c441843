"""What receiving a request costs a busy engine (CalibratedCoefficients.per_arrival_s): the
replica charges it to the step after the arrival, never to a request that found the engine idle,
and the step fit recovers it from loaded steps that saw arrivals."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import simpy

from calibration.fit import fit_steps
from calibration.loaded import fit_loaded, run_loaded
from calibration.observations import Observation
from sim.engine.coefficients import CalibratedCoefficients
from sim.engine.kv_cache import KVCacheManager
from sim.engine.latency import BatchShape, CalibratedModel
from sim.engine.replica import Replica
from sim.engine.request import Record
from sim.engine.scheduler import ContinuousBatchScheduler, ReplicaOptions, SchedulerConfig
from tests.factories import make_request
from tests.test_fit import TRUTH, synthetic
from tests.test_loaded_calibration import SimulatedServer, isolated_points
from tests.test_loaded_calibration import scenario as loaded_scenario
from tests.test_steps_rebuild import TRUTH as STEPS_TRUTH

STEP_S = 0.01


def serve(arrival_cost_s: float, fast_forward: bool) -> dict[int, Record]:
    """Request 0 at t=0 (an idle engine), request 1 at 0.035 s (during request 0's fourth
    step); every step takes STEP_S."""
    env = simpy.Environment()
    coefficients = CalibratedCoefficients(
        step_overhead_s=STEP_S,
        per_prefill_token_s=0.0,
        per_decode_seq_s=0.0,
        per_context_token_s=0.0,
        per_prefill_pair_s=0.0,
        per_arrival_s=arrival_cost_s,
    )
    scheduler = ContinuousBatchScheduler(
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048),
        KVCacheManager(100, 16, True),
        ReplicaOptions(fast_forward=fast_forward),
    )
    done: dict[int, Record] = {}
    replica = Replica(
        env,
        0,
        scheduler,
        CalibratedModel(coefficients),
        max_model_len=1024,
        on_finish=lambda record: done.__setitem__(record.request_id, record),
    )

    def arrive(request_id: int, at_s: float) -> Any:
        yield env.timeout(at_s)
        request = make_request(request_id, prompt_tokens=32, output_tokens=10, arrival_s=at_s)
        record = Record(request_id, at_s, request.prompt_tokens, request.output_tokens)
        replica.submit(request, record)

    env.process(arrive(0, 0.0))
    env.process(arrive(1, 0.035))
    env.run()
    return done


@pytest.mark.parametrize("fast_forward", [True, False])
def test_an_arrival_lengthens_the_busy_engines_next_step_only(fast_forward: bool) -> None:
    free = serve(0.0, fast_forward)
    costly = serve(0.003, fast_forward)
    # Request 0 found the engine idle: its first token is not delayed.
    assert costly[0].first_token_s == pytest.approx(free[0].first_token_s)
    # Request 1 arrived while request 0 decoded: the step after its arrival (its prefill,
    # beside request 0's decode) takes 3 ms more, and everything after it moves by as much.
    assert costly[1].first_token_s == pytest.approx(free[1].first_token_s + 0.003)
    assert costly[0].finish_s == pytest.approx(free[0].finish_s + 0.003)
    assert costly[1].finish_s == pytest.approx(free[1].finish_s + 0.003)


def test_no_arrival_cost_changes_nothing() -> None:
    assert serve(0.0, True) == serve(0.0, False)


def test_the_step_fit_recovers_the_cost_of_an_arrival_from_steps_that_saw_some() -> None:
    truth = dataclasses.replace(TRUTH, per_arrival_s=0.002)
    model = CalibratedModel(truth)
    observations = synthetic(truth)
    for seqs, arrivals in ((4, 1), (16, 2), (64, 1), (8, 3)):
        batch = BatchShape(num_decode_seqs=seqs, decode_context_tokens=seqs * 700, num_sampled=seqs)
        seconds = model.step_time(batch) + arrivals * truth.per_arrival_s
        observations.append(Observation(batch, seconds, "decode", arrivals=float(arrivals)))
    fitted, report = fit_steps(observations)
    assert fitted.per_arrival_s == pytest.approx(0.002, rel=1e-6)
    assert report.relative_error_max < 1e-8
    # Without such steps it stays 0, and the report does not dwell on it.
    alone, alone_report = fit_steps(synthetic(TRUTH))
    assert alone.per_arrival_s == 0.0
    assert not any("per_arrival_s" in note for note in alone_report.notes)


def test_loaded_replays_of_a_server_that_pays_for_arrivals_find_the_cost(tmp_path: Path) -> None:
    truth = dataclasses.replace(STEPS_TRUTH, per_arrival_s=0.004)
    base = loaded_scenario()
    server = SimulatedServer(truth)
    replays = run_loaded(base, truth, server, tmp_path, budget_s=60, notes=[])
    assert all(
        sum(obs.arrivals for obs in r.steps.observations) > 0 for r in replays[1:]
    )  # the Poisson replays' steps saw requests arrive
    fit = fit_loaded(base, isolated_points(truth), truth, replays)
    assert fit.coefficients.per_arrival_s == pytest.approx(0.004, rel=0.35)
