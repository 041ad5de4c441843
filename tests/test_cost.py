"""What a configuration costs: GPU-hours at a price per GPU-hour, over time and per token, for
fixed, autoscaled and mixed fleets."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from sim.catalog.hardware import get_gpu
from sim.run import build
from sim.scenario import ScenarioError, parse_scenario
from tests.factories import scenario_dict


def run(**overrides: Any) -> Any:
    return build(parse_scenario(scenario_dict(**overrides))).run()


def test_one_replica_pays_its_gpu_for_the_whole_run() -> None:
    result = run()
    cost = result.summary["cost"]
    hours = result.summary["sim"]["simulated_s"] / 3600
    assert cost["gpu_hours"] == pytest.approx(hours)
    assert cost["total_usd"] == pytest.approx(hours * get_gpu("h100-sxm").hourly_cost_usd)
    tokens = result.records["output_tokens"].sum()
    assert cost["usd_per_million_output_tokens"] == pytest.approx(cost["total_usd"] / tokens * 1e6)
    assert (result.timeseries["cost_usd_per_hour"] == 3.24).all()


def test_scenario_prices_and_tensor_parallel_gpus() -> None:
    tp2 = run(
        engine={"tensor_parallel_size": 2, "max_model_len": 8192},
        cost={"gpu_hour_usd": {"h100": 2.0}},  # an alias of h100-sxm
    ).summary["cost"]
    hours = tp2["gpu_hours"]
    assert tp2["total_usd"] == pytest.approx(hours * 2.0)
    assert tp2["gpu_hours_by_gpu"] == {"H100 SXM": pytest.approx(hours)}
    assert tp2["usd_per_hour"] == pytest.approx(2 * 2.0)  # two GPUs at $2


def test_missing_price_is_said_not_guessed() -> None:
    result = run(gpu="l40s", model="llama-3.1-8b")
    cost = result.summary["cost"]
    assert cost["total_usd"] is None and cost["missing_prices"] == ["L40S"]
    assert result.timeseries["cost_usd_per_hour"].isna().all()
    priced = run(gpu="l40s", cost={"gpu_hour_usd": {"l40s": 1.1}}).summary["cost"]
    assert priced["total_usd"] == pytest.approx(priced["gpu_hours"] * 1.1)


def test_autoscaled_cost_follows_the_replicas() -> None:
    workload = {
        "arrival": {"type": "piecewise", "points": [[0, 3], [100, 40], [250, 3]]},
        "prompt_tokens": {"type": "uniform", "low": 500, "high": 1500},
        "output_tokens": {"type": "uniform", "low": 50, "high": 150},
        "duration_s": 700,
    }
    scaled = run(
        seed=4,
        workload=workload,
        fleet={"autoscaling": {"max_replicas": 6, "metric": "ttft_ms", "target": 500}},
    )
    fixed = run(seed=4, workload=workload, fleet={"replicas": 6})
    rate = scaled.timeseries["cost_usd_per_hour"]
    assert rate.iloc[0] == pytest.approx(3.24) and rate.max() >= 4 * 3.24
    assert rate.iloc[-1] == pytest.approx(3.24)
    assert scaled.summary["cost"]["total_usd"] < 0.8 * fixed.summary["cost"]["total_usd"]


def test_mixed_pools_behind_one_router() -> None:
    result = run(
        fleet={
            "router": {"policy": "least_outstanding"},
            "pools": [
                {"replicas": 2, "gpu": "h100-sxm"},
                {"replicas": 2, "gpu": "a100-80gb-sxm"},
            ],
        },
        workload={
            "arrival": {"type": "poisson", "rate": 20},
            "prompt_tokens": {"type": "constant", "value": 512},
            "output_tokens": {"type": "constant", "value": 128},
            "num_requests": 400,
        },
    )
    per_replica = result.summary["fleet"]["per_replica"]
    assert [r["gpu"] for r in per_replica] == ["H100 SXM"] * 2 + ["A100 80GB SXM"] * 2
    counts = Counter(result.records["replica_id"])
    assert set(counts) == {0, 1, 2, 3}
    # The A100s decode more slowly: at equal load their requests take longer.
    tpot = result.records.groupby("replica_id")["tpot_s"].mean()
    assert np.mean([tpot[2], tpot[3]]) > np.mean([tpot[0], tpot[1]])
    hours = result.summary["sim"]["simulated_s"] / 3600
    assert result.summary["cost"]["usd_per_hour"] == pytest.approx(2 * 3.24 + 2 * 1.99)
    assert result.summary["cost"]["gpu_hours"] == pytest.approx(4 * hours)


def test_pools_cannot_be_combined_with_autoscaling() -> None:
    with pytest.raises(ScenarioError, match="pools"):
        parse_scenario(
            scenario_dict(fleet={"pools": [{"replicas": 1}], "autoscaling": {"target": 500}})
        )
