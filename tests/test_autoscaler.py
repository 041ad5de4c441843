"""The HPA algorithm on a simulated fleet: the documented rules one by one, then a step load
whose replicas rise and fall with no request lost."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
import simpy

from sim.engine.kv_cache import KVCacheManager
from sim.engine.latency import ConstantStepModel
from sim.engine.scheduler import ContinuousBatchScheduler, SchedulerConfig
from sim.fleet.autoscaler import (
    Autoscaler,
    AutoscalerConfig,
    ScalingPolicy,
    ScalingRules,
    startup_seconds,
)
from sim.fleet.pool import Fleet
from sim.fleet.router import Router
from sim.run import build
from sim.scenario import ScenarioError, parse_scenario
from tests.factories import scenario_dict


class Scripted(Autoscaler):
    """An autoscaler whose metric is whatever the test says it is."""

    value: float | None = None

    def metric_value(self, scale_up: bool) -> float | None:
        return self.value


def scaler(replicas: int, **config: Any) -> Scripted:
    env = simpy.Environment()

    def engine(i: int) -> Any:
        kv = KVCacheManager(64, 16, enable_prefix_caching=False)
        return ContinuousBatchScheduler(SchedulerConfig(8, 256), kv), ConstantStepModel(0.01)

    fleet = Fleet(
        env,
        engine,
        Router("round_robin", np.random.default_rng(0)),
        num_replicas=replicas,
        max_model_len=512,
        on_finish=lambda record: None,
    )
    defaults: dict[str, Any] = {
        "min_replicas": 1,
        "max_replicas": 50,
        "metric": "waiting_per_replica",
        "target": 10.0,
        "startup_s": 0.0,
    }
    return Scripted(env, fleet, AutoscalerConfig(**{**defaults, **config}))


def sync_at(auto: Scripted, time_s: float, value: float) -> int:
    auto.env.run(until=time_s) if time_s > auto.env.now else None
    auto.value = value
    auto.sync()
    return sum(r.accepting for r in auto.fleet.replicas)


def test_within_tolerance_nothing_changes() -> None:
    auto = scaler(4)
    assert sync_at(auto, 15, 10.9) == 4  # ratio 1.09 ≤ 1.1
    assert sync_at(auto, 30, 9.1) == 4
    assert sync_at(auto, 45, 11.5) == 5  # ceil(4 × 1.15)


def test_scale_up_is_rate_limited_by_the_most_permissive_policy() -> None:
    # Default: up by max(4 pods, 100 %) per 15 s. From 1 replica at 20× the target: 1 → 5.
    auto = scaler(1)
    assert sync_at(auto, 15, 200.0) == 5
    # 15 s later the period starts from 5: 100 % allows 10.
    assert sync_at(auto, 30, 200.0) == 10
    least = scaler(
        1,
        scale_up=ScalingRules(
            0.0, (ScalingPolicy("pods", 4, 15), ScalingPolicy("percent", 100, 15)), "min"
        ),
    )
    assert sync_at(least, 15, 200.0) == 2  # the least permissive: 100 % of 1


def test_scale_down_waits_out_the_stabilization_window() -> None:
    auto = scaler(4)  # default scale-down window 300 s
    assert sync_at(auto, 15, 10.0) == 4
    for t in range(30, 300, 15):
        assert sync_at(auto, t, 1.0) == 4  # the recommendation of 4 at t=15 is in the window
    assert sync_at(auto, 330, 1.0) == 1  # ceil(4 × 0.1); the clamp keeps min_replicas
    quick = scaler(4, scale_down=ScalingRules(0.0, (ScalingPolicy("pods", 1, 60),)))
    assert sync_at(quick, 15, 1.0) == 3  # one pod per 60 s
    assert sync_at(quick, 30, 1.0) == 3
    assert sync_at(quick, 80, 1.0) == 2
    frozen = scaler(4, scale_down=ScalingRules(0.0, (), "disabled"))
    assert sync_at(frozen, 15, 1.0) == 4


def test_bounds_clamp_the_recommendation() -> None:
    auto = scaler(3, min_replicas=2, max_replicas=4)
    assert sync_at(auto, 15, 1000.0) == 4
    auto = scaler(3, min_replicas=2, max_replicas=4, scale_down=ScalingRules(0, ()))
    assert sync_at(auto, 15, 0.0) == 2


def test_no_metric_no_action() -> None:
    auto = scaler(3)
    auto.value = None
    auto.sync()
    assert not auto.events


def test_startup_time_is_container_plus_weight_load() -> None:
    # Llama-3.1-8B in bf16: 16 GB at 2 GB/s plus a 30 s container start.
    assert startup_seconds(30.0, 16e9, 2.0) == pytest.approx(38.0)


def step_load(**autoscaling: Any) -> dict[str, Any]:
    return scenario_dict(
        seed=4,
        fleet={
            "replicas": 1,
            "router": {"policy": "least_outstanding"},
            "autoscaling": {
                "min_replicas": 1,
                "max_replicas": 6,
                "metric": "ttft_ms",
                "target": 500,
                **autoscaling,
            },
        },
        workload={
            "arrival": {"type": "piecewise", "points": [[0, 3], [100, 40], [250, 3]]},
            "prompt_tokens": {"type": "uniform", "low": 500, "high": 1500},
            "output_tokens": {"type": "uniform", "low": 50, "high": 150},
            "duration_s": 700,
        },
    )


@pytest.fixture(scope="module")
def stepped() -> Any:
    return build(parse_scenario(step_load())).run()


def test_step_load_scales_up_then_down_and_loses_nothing(stepped: Any) -> None:
    # Acceptance: low → high → low. Replicas rise after the step, fall after the default 300 s
    # scale-down window, TTFT spikes while new replicas load weights, every request finishes.
    ts: pd.DataFrame = stepped.timeseries
    replicas = ts["num_replicas"] + ts["num_replicas_starting"]
    assert replicas[ts["time_s"] < 100].max() == 1
    assert replicas[(ts["time_s"] > 150) & (ts["time_s"] < 250)].max() >= 4
    assert replicas.iloc[-1] == 1
    assert ts["num_replicas_starting"].max() >= 1  # cold starts are visible
    records = stepped.records
    assert (records["status"] == "ok").all()
    arrivals = records["arrival_s"]
    assert len(records) == stepped.summary["requests"]["total"]
    ttft_before = records.loc[arrivals < 100, "ttft_s"].quantile(0.9)
    ttft_cold = records.loc[(arrivals > 100) & (arrivals < 160), "ttft_s"].quantile(0.9)
    ttft_scaled = records.loc[(arrivals > 200) & (arrivals < 250), "ttft_s"].quantile(0.9)
    assert ttft_cold > 10 * ttft_before  # the spike while replicas start
    assert ttft_scaled < 0.5  # back under the 500 ms target once they are up
    events = stepped.summary["fleet"]["autoscaling"]["events"]
    assert events[0]["desired"] > events[0]["current"] and events[-1]["desired"] == 1


def test_drained_replicas_take_no_new_requests(stepped: Any) -> None:
    records = stepped.records
    for replica in stepped.summary["fleet"]["per_replica"]:
        if replica["drained_s"] is None:
            continue
        mine = records[records["replica_id"] == replica["replica_id"]]
        assert (mine["arrival_s"] <= replica["drained_s"]).all()
        assert replica["stopped_s"] >= mine["finish_s"].max()
        # Nothing started on it before it was ready: its first request came after start-up.
        assert mine["arrival_s"].min() >= replica["started_s"]


def test_autoscaling_knobs_are_checked() -> None:
    with pytest.raises(ScenarioError, match=r"fleet\.autoscaling\.target"):
        parse_scenario(scenario_dict(fleet={"autoscaling": {"metric": "kv_usage"}}))
    with pytest.raises(ScenarioError, match="min_replicas"):
        parse_scenario(
            scenario_dict(
                fleet={"autoscaling": {"target": 1, "min_replicas": 3, "max_replicas": 2}}
            )
        )
    with pytest.raises(ScenarioError, match=r"fleet\.autoscaling\.metric"):
        parse_scenario(scenario_dict(fleet={"autoscaling": {"target": 1, "metric": "cpu"}}))


def test_an_autoscaled_run_of_no_request_reports_its_fleet() -> None:
    # Found by benchmarks/fuzz.py: a replay of no request returned before the fleet was ever
    # sampled, and the autoscaling report took the max over no sample (a traceback).
    result = build(parse_scenario(step_load()), requests=[]).run()
    assert result.summary["requests"]["total"] == 0
    assert result.summary["fleet"]["autoscaling"]["max_replicas_reached"] >= 1
    assert len(result.timeseries) == 1
