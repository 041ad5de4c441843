"""Fast-forward (sim/replica.py) changes how fast the simulator runs, never what it reports.

The fast mode advances predictable runs of decode steps as one event and skips the prefix-cache
index for requests no other request can share blocks with; the step-by-step mode does neither.
On the reference scenarios of the speed benchmark (small versions of R1–R4), on the example
scenarios, under heavy preemption, and on generated scenarios, both modes must give the same
records, summaries and time series.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pandas.testing as pdt
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.catalog.hardware import get_gpu
from sim.catalog.models import get_model
from sim.engine.coefficients import CalibratedCoefficients
from sim.engine.latency import (
    BatchShape,
    CalibratedModel,
    ConstantStepModel,
    RooflineModel,
    decode_step_times,
)
from sim.reference import reference_scenario
from sim.report.summary import distribution, weighted_percentiles
from sim.run import SimResult, build
from sim.scenario import parse_scenario
from tests.test_invariants import run as run_with_time_limit
from tests.test_invariants import scenarios, tiny_cache_scenario

ROOT = Path(__file__).parents[1]

#: Small versions of the benchmark's reference scenarios: (name, scale).
REFERENCE_CASES = [("R1", 0.02), ("R2", 0.0015), ("R3", 0.01), ("R4", 0.03)]


def run_both(data: dict[str, Any]) -> tuple[SimResult, SimResult]:
    """The scenario in fast mode and in step-by-step mode."""
    results = []
    for fast in (True, False):
        variant = copy.deepcopy(data)
        variant["simulator"] = {"fast_forward": fast}
        results.append(build(parse_scenario(variant)).run())
    return results[0], results[1]


def assert_same(fast: SimResult, step: SimResult) -> None:
    """Same records (timestamps to floating-point tolerance), summary and time series."""
    pdt.assert_frame_equal(fast.records, step.records, check_exact=False, rtol=1e-12, atol=1e-12)
    pdt.assert_frame_equal(
        fast.timeseries, step.timeseries, check_exact=False, rtol=1e-12, atol=1e-12
    )
    fast_summary = {k: v for k, v in fast.summary.items() if k != "sim"}
    step_summary = {k: v for k, v in step.summary.items() if k != "sim"}
    assert _rounded(fast_summary) == _rounded(step_summary)
    assert fast.summary["sim"]["events"] == step.summary["sim"]["events"]
    assert fast.summary["sim"]["simulated_s"] == pytest.approx(step.summary["sim"]["simulated_s"])


def _rounded(value: Any) -> Any:
    """Floats to 12 significant digits, recursively (NaN stays comparable)."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else float(f"{value:.12g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


@pytest.mark.parametrize(("name", "scale"), REFERENCE_CASES)
def test_reference_scenarios_give_the_same_records_in_both_modes(
    name: str, scale: float, shared_data: Path
) -> None:
    fast, step = run_both(reference_scenario(name, scale))
    assert len(fast.records) > 100
    assert_same(fast, step)
    # The fast mode really fast-forwards; the step mode never does.
    assert step.summary["sim"]["fast_forwarded_steps"] == 0
    assert fast.summary["sim"]["fast_forwarded_steps"] > 0.4 * fast.summary["sim"]["events"]


@pytest.mark.parametrize(
    "path",
    [
        "scenarios/fleet_autoscaling.yaml",
        "scenarios/disaggregated_long_prompts.yaml",
        "scenarios/agentic_multi_turn.yaml",
        "scenarios/rag_long_prompts.yaml",
        "scenarios/mooncake_prefix_replay.yaml",
    ],
)
def test_example_scenarios_give_the_same_records_in_both_modes(
    path: str, shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # example scenarios name traces relative to the repository
    data = yaml.safe_load((ROOT / path).read_text())
    workload = data["workload"]
    if "duration_s" in workload:
        workload["duration_s"] = min(workload["duration_s"], 120)
    workload["num_requests"] = min(workload.get("num_requests") or 400, 400)
    if "duration_s" in workload and "trace" not in workload:
        del workload["num_requests"]
    assert_same(*run_both(data))


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_preemption_gives_the_same_records_in_both_modes(policy: str, prefix_caching: bool) -> None:
    data = tiny_cache_scenario(scheduling_policy=policy, enable_prefix_caching=prefix_caching)
    fast, step = run_both(data)
    assert step.summary["preemptions"] > 0
    assert_same(fast, step)


@pytest.mark.parametrize(
    "fleet",
    [
        {"replicas": 3, "router": {"policy": "least_kv"}},
        {"replicas": 3, "router": {"policy": "prefix_affinity"}},
    ],
)
def test_routers_that_read_the_kv_cache_see_the_same_state(fleet: dict[str, Any]) -> None:
    data = reference_scenario("R1", 0.01)
    data["fleet"] = fleet
    data["workload"]["arrival"]["rate"] = 25
    data["workload"]["prefix"] = {"type": "shared", "num_groups": 3, "prefix_tokens": 500}
    assert_same(*run_both(data))


def test_a_full_batch_with_a_waiting_queue_and_a_calibrated_profile(shared_data: Path) -> None:
    data = reference_scenario("R1", 0.01)
    data["engine"]["max_num_seqs"] = 8  # requests queue behind a full batch
    data["latency"] = {
        "type": "profile",
        "path": str(ROOT / "profiles/h100-sxm_llama-3.1-8b_tp1.json"),
    }
    fast, step = run_both(data)
    assert step.records["queue_s"].max() > 1.0
    assert_same(fast, step)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_generated_scenarios_give_the_same_records_in_both_modes(
    case: tuple[dict[str, Any], int],
) -> None:
    data, _ = case
    results = []
    for fast in (True, False):
        variant = copy.deepcopy(data)
        variant["simulator"] = {"fast_forward": fast}
        results.append(run_with_time_limit(variant)[1])
    assert_same(*results)


# -- the pieces fast-forward relies on -----------------------------------------------------------
@pytest.mark.parametrize(
    ("model", "gpu", "options"),
    [
        ("llama-3.1-8b", "h100-sxm", {}),
        ("llama-3.1-70b", "a100-80gb-sxm", {"tensor_parallel_size": 4}),
        ("llama-3.1-8b", "l40s", {"dtype": "fp8", "pipeline_parallel_size": 2}),
        ("llama-3.1-8b", "a100-80gb-sxm", {"dtype": "int8", "quantization": "bitsandbytes"}),
        # Mixtures of experts: the expert GEMMs' blend, expert parallelism, latent attention.
        ("mixtral-8x7b", "h100-sxm", {"tensor_parallel_size": 2, "expert_parallel": True}),
        ("deepseek-v2-lite", "h100-sxm", {"dtype": "fp8"}),
    ],
)
def test_fast_decode_step_times_are_the_scalar_ones_bit_for_bit(
    model: str, gpu: str, options: dict[str, Any]
) -> None:
    roofline = RooflineModel(get_model(model), get_gpu(gpu), **options)
    calibrated = CalibratedModel(CalibratedCoefficients(5e-4, 1e-5, 3e-5, 2e-8, 1e-11))
    rng = np.random.default_rng(0)
    for latency_model in (roofline, calibrated):
        for num_seqs in (1, 7, 64, 256):
            first = int(num_seqs * 20 + rng.integers(0, 3_000_000))
            fast = latency_model.decode_step_times(num_seqs, first, 50)
            scalar = [
                latency_model.step_time(
                    BatchShape(
                        num_decode_seqs=num_seqs,
                        decode_context_tokens=first + i * num_seqs,
                        num_sampled=num_seqs,
                    )
                )
                for i in range(50)
            ]
            assert fast == scalar
            assert decode_step_times(ConstantStepModel(0.01), num_seqs, first, 3) == [0.01] * 3


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0.001, 0.0125, 0.02, 0.5, 1.0]), st.integers(0, 6)),
        min_size=1,
        max_size=30,
    ),
    st.lists(st.floats(0, 100), min_size=1, max_size=6),
)
def test_weighted_percentiles_are_those_of_the_expanded_samples(
    runs: list[tuple[float, int]], percentiles: list[float]
) -> None:
    values = np.array([v for v, _ in runs])
    counts = np.array([c for _, c in runs])
    expanded = np.repeat(values, counts)
    if expanded.size == 0:
        assert distribution(values, counts)["p50"] is None
        return
    keep = counts > 0
    got = weighted_percentiles(values[keep], counts[keep], percentiles)
    assert got.tolist() == np.percentile(expanded, percentiles).tolist()
    summary = distribution(values, counts)
    assert summary["mean"] == pytest.approx(float(expanded.mean()), rel=1e-12)


def test_inter_token_latencies_are_run_length_encoded() -> None:
    # One request alone on a constant-step engine: every ITL is the step time, one run.
    data = reference_scenario("R1", 0.0)
    data["workload"]["num_requests"] = 1
    data["latency"] = {"type": "constant", "step_s": 0.01}
    simulation = build(parse_scenario(data))
    result = simulation.run()
    scheduler = simulation.scheduler
    output_tokens = int(result.records["output_tokens"].iloc[0])
    assert list(scheduler.itl_values) == [pytest.approx(0.01)] * len(scheduler.itl_values)
    assert sum(scheduler.itl_counts) == output_tokens - 1
    assert len(scheduler.itl_values) < output_tokens  # equal neighbours merged
    assert isinstance(result.records, pd.DataFrame)
