"""Engine steps rebuilt from streamed token times (calibration/steps.py), on runs of a
simulated 'server' whose step costs are known: the rebuilt steps are the simulator's own, and
the step fit on them finds the server's coefficients."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from calibration.fit import fit_steps, predict_seconds
from calibration.steps import (
    DEFAULT_GAP_S,
    frontend_from_idle_arrivals,
    rebuild_steps,
    step_gap_s,
)
from servesim.cli import app
from sim.engine.coefficients import CalibratedCoefficients
from sim.run import build
from sim.scenario import parse_scenario
from tests.factories import scenario_dict
from tests.test_fit import TRUTH as FIT_TRUTH

# test_fit's server, with shared context as dear as any: the rebuilt steps cannot tell which
# context tokens several requests shared.
TRUTH = dataclasses.replace(FIT_TRUTH, per_shared_context_token_s=None)


def loaded_run(
    rate: float, num_requests: int = 150, truth: CalibratedCoefficients = TRUTH
) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    data = scenario_dict(
        workload={
            "arrival": {"type": "poisson", "rate": rate},
            "prompt_tokens": {"type": "uniform", "low": 32, "high": 900},
            "output_tokens": {"type": "uniform", "low": 4, "high": 120},
            "prefix": {"type": "shared", "num_groups": 2, "prefix_tokens": 128, "share": 0.5},
            "num_requests": num_requests,
        },
        output={"record_token_times": True},
        seed=3,
    )
    scenario = parse_scenario(data)
    result = build(scenario, coefficients=truth).run()
    assert result.token_times is not None
    return result.records, result.token_times, scenario.engine.max_num_batched_tokens


def test_steps_under_load_give_back_the_servers_coefficients() -> None:
    records, token_times, budget = loaded_run(rate=12)
    steps = rebuild_steps(records, token_times, max_num_batched_tokens=budget)
    kinds = {obs.kind for obs in steps.observations}
    assert {"decode", "mixed"} <= kinds and len(steps.observations) > 300
    # Every rebuilt step is a step the simulator ran: TRUTH predicts its duration exactly.
    predicted = predict_seconds(TRUTH, steps.observations)
    measured = np.array([obs.seconds for obs in steps.observations])
    assert np.allclose(predicted, measured, rtol=1e-6)
    fitted, report = fit_steps(steps.observations, floor=False)
    assert report.relative_error_mean < 1e-3
    for name in ("step_overhead_s", "per_prefill_token_s", "per_decode_seq_s"):
        assert getattr(fitted, name) == pytest.approx(getattr(TRUTH, name), rel=0.02), name


def test_steps_are_rebuilt_from_tokens_that_waited_in_a_busy_front_end() -> None:
    # The front end streams 2,500 tokens a second: at 12 req/s it falls behind now and then,
    # and a step's tokens leave after it has sent the earlier steps'.
    cost = 4e-4
    truth = dataclasses.replace(TRUTH, per_streamed_token_s=cost)
    records, token_times, budget = loaded_run(rate=12, truth=truth)
    naive = rebuild_steps(records, token_times, max_num_batched_tokens=budget)
    predicted = predict_seconds(TRUTH, naive.observations)
    measured = np.array([obs.seconds for obs in naive.observations])
    assert not np.allclose(predicted, measured, rtol=1e-3)  # the front end's time is in them
    steps = rebuild_steps(
        records, token_times, max_num_batched_tokens=budget, streamed_token_s=cost
    )
    # Steps whose tokens found the front end idle are the engine's own, to the last digit;
    # those that found it busy are left out.
    assert len(steps.observations) > 100
    assert steps.skipped["front end busy"] > 10
    predicted = predict_seconds(TRUTH, steps.observations)
    measured = np.array([obs.seconds for obs in steps.observations])
    assert np.allclose(predicted, measured, rtol=1e-6)


def test_the_front_end_is_read_from_requests_that_found_the_engine_idle() -> None:
    records, token_times, _ = loaded_run(rate=1.5, num_requests=80)
    frontend, used = frontend_from_idle_arrivals(records, token_times, TRUTH)
    assert used >= 10
    assert frontend == pytest.approx(TRUTH.frontend_overhead_s, rel=0.01)


def test_gaps_that_are_not_one_step_are_left_out() -> None:
    records = pd.DataFrame(
        {"request_id": [1, 2], "prompt_tokens": [100, 5000], "cached_tokens": [0, 0]}
    )
    tokens = pd.DataFrame(
        {
            "request_id": [1, 1, 1, 2, 1, 1],
            "token_index": [0, 1, 2, 0, 3, 4],
            "time_s": [0.0, 0.01, 0.02, 0.03, 0.03, 0.05],
        }
    )
    steps = rebuild_steps(records, tokens, max_num_batched_tokens=2048)
    # The first burst follows nothing and request 2's prompt took more than one chunk; the
    # rest are decodes of request 1: 10 ms, 10 ms, then 20 ms after the skipped burst.
    assert [obs.seconds for obs in steps.observations] == pytest.approx([0.01, 0.01, 0.02])
    assert steps.skipped == {
        "no request carried over: the engine may have idled before it": 1,
        "a prompt longer than one chunk": 1,
    }
    merged = tokens.assign(time_s=[0.0, 0.01, 0.01, 0.03, 0.03, 0.05])
    steps = rebuild_steps(records, merged, max_num_batched_tokens=8192)
    assert "several tokens of one request in one burst (steps merged)" in steps.skipped


def test_calibrate_steps_writes_a_profile_of_the_server(tmp_path: Path) -> None:
    data = scenario_dict(
        workload={
            "arrival": {"type": "poisson", "rate": 6},
            "prompt_tokens": {"type": "uniform", "low": 32, "high": 900},
            "output_tokens": {"type": "uniform", "low": 4, "high": 120},
            "num_requests": 150,
        },
        output={"record_token_times": True},
        seed=4,
    )
    scenario_path = tmp_path / "s.yaml"
    scenario_path.write_text(yaml.safe_dump(data))
    build(parse_scenario(data), coefficients=TRUTH).run().write(tmp_path / "run")
    out = tmp_path / "p.json"
    args = [str(scenario_path), "--records", str(tmp_path / "run"), "--steps", "--out", str(out)]
    result = CliRunner().invoke(app, ["calibrate", *args])
    assert result.exit_code == 0, result.output
    profile = json.loads(out.read_text())
    assert profile["fit"]["method"] == "token_time_steps"
    assert profile["data_summary"]["num_steps"] > 100
    fitted = profile["coefficients"]
    for name in ("step_overhead_s", "per_prefill_token_s", "per_decode_seq_s"):
        assert fitted[name] == pytest.approx(getattr(TRUTH, name), rel=0.05), name
    assert fitted["frontend_overhead_s"] == pytest.approx(TRUTH.frontend_overhead_s, rel=0.05)
    # Without token times there is nothing to rebuild: a clear error naming the fix.
    (tmp_path / "run" / "token_times.parquet").unlink()
    result = CliRunner().invoke(app, ["calibrate", *args])
    assert result.exit_code == 2 and "record_token_times" in result.output


def test_the_gap_that_ends_a_step_is_read_from_the_runs_own_gaps() -> None:
    rng = np.random.default_rng(0)
    # 300 steps 30-80 ms apart, each streaming 20 tokens spread over up to ~3 ms (a busy API
    # server), as a CPU run's token times look.
    starts = np.cumsum(rng.uniform(0.03, 0.08, 300))
    spread = rng.lognormal(np.log(1e-4), 1.0, (300, 20)).cumsum(axis=1)
    times = (starts[:, None] + np.minimum(spread, 0.003)).ravel()
    gap = step_gap_s(times)
    assert 0.003 < gap < 0.03
    # A simulation's tokens of one step share one instant: no first mode, the default.
    assert step_gap_s(np.repeat(starts, 5)) == DEFAULT_GAP_S
