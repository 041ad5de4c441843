"""The capacity search: cheapest configuration meeting the SLOs, the Pareto front, breaking load."""

from __future__ import annotations

from typing import Any

import pytest

from sim.planning.planner import (
    Candidate,
    apply,
    breaking_load,
    cheapest,
    evaluate,
    grid,
    pareto_front,
    search,
)
from sim.scenario import parse_scenario
from tests.factories import scenario_dict


def traffic(rate: float = 12.0) -> dict[str, Any]:
    return scenario_dict(
        seed=2,
        workload={
            "arrival": {"type": "poisson", "rate": rate},
            "prompt_tokens": {"type": "constant", "value": 1024},
            "output_tokens": {"type": "constant", "value": 200},
            "num_requests": 300,
        },
        slo={"ttft_s": 0.3, "tpot_s": 0.03, "percentile": 90},
    )


@pytest.fixture(scope="module")
def evaluations() -> list[Any]:
    candidates = grid(["h100-sxm", "a100-80gb-sxm", "l40s"], [1], ["bf16"], [1, 2, 3])
    return search(traffic(), candidates, workers=2)


def test_search_reports_every_candidate_with_a_reason(evaluations: list[Any]) -> None:
    assert len(evaluations) == 9
    l40s = [e for e in evaluations if e.candidate.gpu == "l40s"]
    assert all(not e.feasible and "no price" in e.reason for e in l40s)
    assert any(e.meets_slo for e in evaluations)
    assert any(e.feasible and not e.meets_slo for e in evaluations)


def test_cheapest_meets_the_slo_and_nothing_cheaper_does(evaluations: list[Any]) -> None:
    best = cheapest(evaluations)
    assert best is not None and best.meets_slo
    cheaper = [
        e for e in evaluations if e.usd_per_hour is not None and e.usd_per_hour < best.usd_per_hour
    ]
    assert cheaper and not any(e.meets_slo for e in cheaper)


def test_pareto_front_is_not_dominated(evaluations: list[Any]) -> None:
    front = pareto_front(evaluations)
    assert front
    costs = [e.usd_per_hour for e in front]
    ttfts = [e.ttft_at_percentile_s for e in front]
    assert costs == sorted(costs) and ttfts == sorted(ttfts, reverse=True)
    for member in front:
        for other in evaluations:
            if other.feasible and other is not member:
                assert not (
                    other.usd_per_hour < member.usd_per_hour
                    and other.ttft_at_percentile_s < member.ttft_at_percentile_s
                )


def test_processes_and_one_process_agree() -> None:
    candidates = grid(["h100-sxm"], [1, 2], ["bf16", "fp8"], [1])
    assert search(traffic(), candidates, workers=2) == search(traffic(), candidates, workers=1)


def test_search_keeps_the_candidates_order_and_reports_progress() -> None:
    candidates = grid(["h100-sxm", "l40s"], [1], ["bf16"], [2, 1])
    seen: list[tuple[int, int]] = []
    results = search(
        traffic(), iter(candidates), workers=2, progress=lambda d, t: seen.append((d, t))
    )
    assert [e.candidate for e in results] == candidates
    assert seen == [(done, len(candidates)) for done in range(1, len(candidates) + 1)]


def test_a_model_that_does_not_fit_is_infeasible_with_its_reason() -> None:
    data = traffic()
    data["model"] = "llama-3.1-70b"
    result = evaluate(data, Candidate("a100-80gb-sxm", 1, "bf16", 1))
    assert not result.feasible and "does not fit" in result.reason


def test_breaking_load_grows_with_the_fleet() -> None:
    data = traffic(rate=4.0)
    one = breaking_load(data, Candidate("h100-sxm", 1, "bf16", 1), steps=5)
    three = breaking_load(data, Candidate("h100-sxm", 1, "bf16", 3), steps=5)
    assert one is not None and three is not None
    assert three > 2 * one


def test_breaking_load_refuses_an_infinite_rate() -> None:
    data = traffic()
    data["workload"]["arrival"]["rate"] = float("inf")
    with pytest.raises(ValueError, match=r"workload\.arrival\.rate: an infinite rate"):
        breaking_load(data, Candidate("h100-sxm", 1, "bf16", 1), steps=2)


def test_disaggregated_splits_are_candidates_too() -> None:
    candidates = grid(["h100-sxm"], [1], ["bf16"], [1, 3], disaggregated=True)
    labels = [c.label for c in candidates]
    assert labels == [
        "1× h100-sxm TP1 bf16",
        "3× h100-sxm TP1 bf16",
        "1P:2D h100-sxm TP1 bf16",
        "2P:1D h100-sxm TP1 bf16",
    ]
    result = evaluate(traffic(), candidates[2])
    assert result.feasible
    # Three GPUs either way: the split costs what three co-located replicas cost.
    assert result.usd_per_hour == pytest.approx(evaluate(traffic(), candidates[1]).usd_per_hour)


def test_an_e2e_target_can_fail_a_candidate_that_meets_ttft_and_tpot() -> None:
    data = traffic(rate=4.0)
    candidate = Candidate("h100-sxm", 1, "bf16", 2)
    relaxed = evaluate(data, candidate)
    assert relaxed.meets_slo and relaxed.e2e_at_percentile_s is not None
    data["slo"]["e2e_s"] = relaxed.e2e_at_percentile_s / 2
    strict = evaluate(data, candidate)
    assert not strict.meets_slo
    assert strict.ttft_at_percentile_s == relaxed.ttft_at_percentile_s


def test_the_plan_keeps_the_scenarios_autoscaler_on_co_located_candidates() -> None:
    data = traffic(rate=4.0)
    data["fleet"] = {"replicas": 2, "autoscaling": {"min_replicas": 2, "target": 500}}
    kept = apply(data, Candidate("h100-sxm", 1, "bf16", 3))
    assert kept["fleet"]["autoscaling"]["max_replicas"] == 3
    assert kept["fleet"]["autoscaling"]["min_replicas"] == 2 and kept["fleet"]["replicas"] == 2
    small = apply(data, Candidate("h100-sxm", 1, "bf16", 1))
    assert small["fleet"]["autoscaling"]["min_replicas"] == 1 and small["fleet"]["replicas"] == 1
    split = apply(data, Candidate("h100-sxm", 1, "bf16", 2, prefill=1))
    assert "autoscaling" not in split["fleet"]
    evaluation = evaluate(data, Candidate("h100-sxm", 1, "bf16", 3))
    assert evaluation.feasible and evaluation.autoscaled
    # Billed for what the HPA ran: no more than three replicas all the time.
    fixed = evaluate(traffic(rate=4.0), Candidate("h100-sxm", 1, "bf16", 3))
    assert evaluation.usd_per_hour is not None and fixed.usd_per_hour is not None
    assert evaluation.usd_per_hour <= fixed.usd_per_hour + 1e-9


def test_a_quantized_checkpoint_is_weighed_at_other_dtypes_as_its_base_model() -> None:
    # Candidates at the checkpoint's own dtype keep it; others run the model it quantizes
    # (the checkpoint cannot be served at another dtype, the model can).
    data = scenario_dict(model="Qwen/Qwen3-8B-FP8")
    own = apply(data, Candidate("h100-sxm", 1, "fp8", 1))
    assert own["model"] == "Qwen/Qwen3-8B-FP8" and parse_scenario(own).dtype == "fp8"
    other = apply(data, Candidate("h100-sxm", 1, "bf16", 1))
    assert other["model"] == "qwen3-8b" and parse_scenario(other).dtype == "bf16"
    # vLLM's spellings: auto is the checkpoint's own weights, bfloat16 the base model's bf16.
    auto = apply(data, Candidate("h100-sxm", 1, "auto", 1))
    assert (auto["model"], auto["dtype"]) == ("Qwen/Qwen3-8B-FP8", "fp8")
    spelled = apply(data, Candidate("h100-sxm", 1, "bfloat16", 1))
    assert (spelled["model"], spelled["dtype"]) == ("qwen3-8b", "bf16")
    gptq = scenario_dict(model="Qwen/Qwen2.5-7B-Instruct-GPTQ-Int8", quantization="weight_only")
    assert "quantization" not in apply(gptq, Candidate("h100-sxm", 1, "fp8", 1))
