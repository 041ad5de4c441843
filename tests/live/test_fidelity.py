"""The whole loop, short: calibrate on the live server, simulate a held-out workload with the
profile, run it live, and fail if the simulator is further off than a loose bound — so a change
that breaks fidelity cannot land silently. (benchmarks/ measures the real error.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from calibration.fit import fit_steps
from calibration.measure_plan import MeasurementPlan
from calibration.measure_runner import measure
from calibration.profile import fitted_profile
from calibration.validate import Thresholds, compare, format_table
from live.replay import Target
from live.run import run_live
from live.tokens import PromptTokens
from sim.engine.profile import EngineInfo
from sim.run import build
from sim.scenario import ProfileLatencySpec, parse_scenario
from tests.live.conftest import LIVE_ENGINE

REPO = Path(__file__).parents[2]

#: Loose on purpose: CI's two cores are shared by the server, its front end and the client.
#: Their contention shows in the tails, which the deterministic simulator does not have (p90
#: TTFT was 26-67% low across runs), and a 40 s calibration on that box moved TPOT mean by
#: -7% to +44% between runs. CI holds the means within 2x and the hit rate within 3 points: a
#: broken unit, term or schedule shows far beyond that; benchmarks/ measures the real error.
CI_BOUNDS = Thresholds(relative=1.0, hit_rate_points=0.03, statistics=("mean",))


def test_calibrated_simulation_tracks_the_live_server(
    vllm_server: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    data = yaml.safe_load((REPO / "scenarios/live_cpu_tiny.yaml").read_text())
    data["engine"] = LIVE_ENGINE.model_dump()
    data["workload"]["num_requests"] = 80
    scenario = parse_scenario(data)
    vocab = int(json.loads((tiny_model_dir / "config.json").read_text())["vocab_size"])
    tokens = PromptTokens(vocab)

    plan = MeasurementPlan.for_budget(
        40.0, max_model_len=2048, max_num_seqs=32, max_num_batched_tokens=2048
    )
    measurement = measure(
        vllm_server.url,
        vllm_server.model_name,
        tokens,
        plan,
        block_size=LIVE_ENGINE.block_size,
        budget_s=40.0,
    )
    coefficients, report = fit_steps(measurement.observations)
    profile = fitted_profile(scenario, coefficients, report, engine=EngineInfo(name="vllm"))
    path = profile.save(tmp_path / "profile.json")

    held_out = scenario.model_copy(
        update={"latency": ProfileLatencySpec(type="profile", path=str(path))}
    )
    simulated = build(held_out).run()
    live = run_live(
        held_out,
        Target(vllm_server.url, vllm_server.model_name),
        tokens,
        out_dir=tmp_path / "live",
    )
    result = compare(live.summary, simulated.summary, CI_BOUNDS)
    print(format_table(result))
    assert (live.records["status"] == "ok").all()
    assert result.passed, result.failures
