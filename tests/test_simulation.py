"""End-to-end simulations of one replica: prefix caching, rejection, outputs, real traces."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from sim.engine.request import RECORD_COLUMNS
from sim.run import build, run
from sim.scenario import parse_scenario
from tests.factories import scenario_dict

SYSTEM_PROMPT = 2048
USER = 200


def system_prompt_scenario(caching: bool, num_requests: int = 100) -> dict[str, Any]:
    return scenario_dict(
        engine={"enable_prefix_caching": caching, "max_model_len": 8192},
        workload={
            "arrival": {"type": "poisson", "rate": 2},
            "prompt_tokens": {"type": "constant", "value": USER},
            "output_tokens": {"type": "constant", "value": 20},
            "prefix": {"type": "shared", "num_groups": 1, "prefix_tokens": SYSTEM_PROMPT},
            "num_requests": num_requests,
        },
    )


def test_shared_system_prompt_hit_rate_matches_block_arithmetic() -> None:
    n = 100
    result = run(parse_scenario(system_prompt_scenario(True, n)))
    prompt = SYSTEM_PROMPT + USER
    # The first request misses; every later one hits the 128 full blocks of the system prompt.
    by_hand = (n - 1) * SYSTEM_PROMPT / (n * prompt)
    hit_rate = result.summary["prefix_cache"]["hit_rate"]
    assert hit_rate == pytest.approx(by_hand, abs=0.02)
    assert result.summary["prefix_cache"]["queries_tokens"] == n * prompt
    cached = result.records["cached_tokens"]
    assert cached.iloc[0] == 0 and (cached.iloc[1:] == SYSTEM_PROMPT).all()


def test_prefix_caching_lowers_ttft() -> None:
    cached = run(parse_scenario(system_prompt_scenario(True)))
    uncached = run(parse_scenario(system_prompt_scenario(False)))
    assert uncached.summary["prefix_cache"]["hit_rate"] == 0.0
    assert cached.summary["ttft_s"]["mean"] < 0.5 * uncached.summary["ttft_s"]["mean"]
    assert cached.summary["ttft_s"]["p90"] < uncached.summary["ttft_s"]["p90"]


def test_multi_turn_sessions_hit_their_own_history() -> None:
    data = scenario_dict(
        workload={
            "arrival": {"type": "poisson", "rate": 1},
            "prompt_tokens": {"type": "constant", "value": 100},
            "output_tokens": {"type": "constant", "value": 50},
            "prefix": {
                "type": "multi_turn",
                "turns": {"type": "constant", "value": 4},
                "think_time_s": 5,
            },
            "num_requests": 80,
        }
    )
    result = run(parse_scenario(data))
    records = result.records
    assert (records["status"] == "ok").all()
    # Later turns reuse the full blocks of the earlier conversation.
    assert result.summary["prefix_cache"]["hit_rate"] > 0.4
    assert (records["cached_tokens"] > 0).sum() > 40


def test_too_long_requests_are_rejected_with_a_status() -> None:
    data = scenario_dict(
        engine={"max_model_len": 1000},
        workload={
            "arrival": {"type": "poisson", "rate": 5},
            "prompt_tokens": {"type": "uniform", "low": 100, "high": 1500},
            "output_tokens": {"type": "constant", "value": 10},
            "num_requests": 200,
        },
    )
    result = run(parse_scenario(data))
    records = result.records
    rejected = records[records["status"] == "rejected"]
    too_long = records["prompt_tokens"] + records["output_tokens"] > 1000
    assert (rejected.index == records[too_long].index).all() and len(rejected) > 0
    assert rejected["error"].str.contains("max_model_len=1000").all()
    assert rejected["ttft_s"].isna().all()
    assert result.summary["requests"]["rejected"] == len(rejected)
    assert result.summary["requests"]["ok"] == 200 - len(rejected)
    assert result.summary["goodput"]["slo_attainment"] <= 1 - len(rejected) / 200


def test_summary_has_every_documented_key() -> None:
    result = run(parse_scenario(scenario_dict()))
    summary = result.summary
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s"):
        assert set(summary[key]) == {"mean", "p50", "p90", "p95", "p99"}
        assert summary[key]["p50"] <= summary[key]["p99"]
    assert set(summary["throughput"]) == {
        "requests_per_s",
        "output_tokens_per_s",
        "total_tokens_per_s",
        "output_tokens_per_s_per_gpu",
        "output_tokens_per_s_per_user",
    }
    assert set(summary["goodput"]) == {"requests_per_s", "slo_attainment"}
    assert set(summary["prefix_cache"]) == {
        "hit_rate",
        "queries_tokens",
        "hits_tokens",
        "preempted_queries_tokens",
        "preempted_hits_tokens",
    }
    assert {"preemptions", "kv_capacity_tokens", "requests", "sim"} <= set(summary)
    assert set(summary["sim"]) == {
        "wall_s",
        "simulated_s",
        "events",
        "percentiles",
        "fast_forwarded_steps",
    }
    assert summary["requests"]["total"] == 50
    assert list(result.records.columns) == list(RECORD_COLUMNS)
    json.dumps(summary)  # serialisable as is


def test_tpot_and_itl_agree_for_uninterrupted_decodes() -> None:
    result = run(parse_scenario(scenario_dict()))
    records = result.records
    # TPOT is the mean ITL of a request; averaged over requests they are the same magnitude.
    assert result.summary["tpot_s"]["mean"] == pytest.approx(
        result.summary["itl_s"]["mean"], rel=0.1
    )
    assert (records["e2e_s"] >= records["ttft_s"]).all()


def test_time_series_samples_the_engine() -> None:
    data = scenario_dict(output={"sample_interval_s": 0.5})
    result = run(parse_scenario(data))
    series = result.timeseries
    assert len(series) >= 10
    assert series["time_s"].iloc[0] == 0.0
    # Full intervals, then the final partial one ending with the last request.
    assert series["time_s"].diff().iloc[1:-1].round(9).eq(0.5).all()
    assert 0 < series["time_s"].diff().iloc[-1] <= 0.5
    assert series["time_s"].iloc[-1] == result.summary["sim"]["simulated_s"]
    assert series["num_finished"].iloc[-1] == 50
    assert series["kv_cache_usage"].between(0, 1).all()
    assert series["busy_fraction"].between(0, 1).all()
    assert series["num_finished"].is_monotonic_increasing
    assert series["output_tokens_per_s"].max() > 0
    # Interval rates add up to the totals.
    dt = series["time_s"].diff().fillna(0)
    produced = (series["output_tokens_per_s"] * dt).sum()
    assert produced == pytest.approx(result.records["output_tokens"].sum())


def test_outputs_are_written(tmp_path: Path) -> None:
    data = scenario_dict(output={"record_token_times": True})
    result = run(parse_scenario(data))
    paths = result.write(tmp_path / "out", "parquet")
    names = sorted(p.name for p in paths)
    assert names == ["records.parquet", "summary.json", "timeseries.parquet", "token_times.parquet"]
    records = pd.read_parquet(tmp_path / "out" / "records.parquet")
    pd.testing.assert_frame_equal(records, result.records)
    tokens = pd.read_parquet(tmp_path / "out" / "token_times.parquet")
    assert len(tokens) == int(result.records["output_tokens"].sum())
    first = tokens[tokens["token_index"] == 0].set_index("request_id")["time_s"]
    assert (first == result.records.set_index("request_id")["first_token_s"]).all()
    result.write(tmp_path / "csv", "csv")
    assert (tmp_path / "csv" / "records.csv").exists()


def test_same_seed_same_records_and_a_new_seed_changes_them() -> None:
    a = run(parse_scenario(scenario_dict(seed=3))).records
    b = run(parse_scenario(scenario_dict(seed=3))).records
    c = run(parse_scenario(scenario_dict(seed=4))).records
    pd.testing.assert_frame_equal(a, b)
    assert not a["arrival_s"].equals(c["arrival_s"])


def ideal_mooncake_hit_rate(path: Path, num_requests: int, block_size: int = 16) -> float:
    """Hit rate with an unbounded cache, by hand from the hash_ids (512-token prefix blocks)."""
    seen: set[tuple[int, ...]] = set()
    queries = hits = 0
    with path.open() as handle:
        for _, line in zip(range(num_requests), handle, strict=False):
            row = json.loads(line)
            ids, length = row["hash_ids"], row["input_length"]
            matched = 0
            while matched < len(ids) and tuple(ids[: matched + 1]) in seen:
                matched += 1
            queries += length
            hits += min(matched * 512, (length - 1) // block_size * block_size)
            seen.update(tuple(ids[: j + 1]) for j in range(len(ids)))
    return hits / queries


@pytest.mark.parametrize(
    ("relative", "scale"),
    [
        ("azure_llm_2023/AzureLLMInferenceTrace_conv.csv", 1.0),
        ("mooncake/conversation_trace.jsonl", 1.0),
        ("vllm_real_runs/llmservingsim_workload_sharegpt-llama-3.1-8b-300-sps10.jsonl", 1.0),
    ],
)
def test_real_traces_drive_the_simulator(shared_data: Path, relative: str, scale: float) -> None:
    data = scenario_dict(
        engine={"max_model_len": 32768},
        workload={
            "trace": {"path": str(shared_data / relative), "time_scale": scale},
            "num_requests": 300,
        },
    )
    simulation = build(parse_scenario(data))
    result = simulation.run()
    assert len(result.records) == 300
    assert result.records["status"].isin(["ok", "rejected"]).all()
    assert result.summary["requests"]["ok"] > 250
    if "mooncake" in relative:
        # Mooncake's hash_ids share blocks across requests: the cache must see most of the
        # reuse an unbounded cache would (eviction under this overload loses some).
        ideal = ideal_mooncake_hit_rate(shared_data / relative, 300)
        assert 0.4 * ideal < result.summary["prefix_cache"]["hit_rate"] <= ideal + 1e-9
    assert not math.isnan(result.summary["throughput"]["requests_per_s"])


def test_length_only_trace_takes_arrivals_from_the_scenario(shared_data: Path) -> None:
    data = scenario_dict(
        workload={
            "trace": {
                "path": str(
                    shared_data
                    / "vidur/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
                )
            },
            "arrival": {"type": "poisson", "rate": 4},
            "num_requests": 100,
        }
    )
    result = run(parse_scenario(data))
    assert len(result.records) == 100
    assert result.records["arrival_s"].is_monotonic_increasing


def multi_turn_scenario(**prefix: Any) -> dict[str, Any]:
    spec = {"type": "multi_turn", "turns": {"type": "constant", "value": 3}, "think_time_s": 2}
    spec.update(prefix)
    return scenario_dict(
        workload={
            "arrival": {"type": "poisson", "rate": 0.5},
            "prompt_tokens": {"type": "uniform", "low": 20, "high": 200},
            "output_tokens": {"type": "uniform", "low": 5, "high": 80},
            "prefix": spec,
            "num_requests": 60,
        }
    )


def test_later_turns_arrive_a_think_time_after_the_previous_answer() -> None:
    simulation = build(parse_scenario(multi_turn_scenario()))
    requests = {r.request_id: r for r in simulation.requests}
    records = simulation.run().records.set_index("request_id")
    children = [r for r in requests.values() if r.parent_id >= 0]
    assert len(children) > 20
    for child in children:
        parent = records.loc[child.parent_id]
        expected = parent["finish_s"] + child.think_time_s
        assert records.loc[child.request_id, "arrival_s"] == pytest.approx(expected, abs=1e-9)


def test_a_later_turn_hits_the_whole_earlier_conversation() -> None:
    simulation = build(parse_scenario(multi_turn_scenario()))
    requests = {r.request_id: r for r in simulation.requests}
    records = simulation.run().records.set_index("request_id")
    for request in requests.values():
        cached = records.loc[request.request_id, "cached_tokens"]
        if request.parent_id < 0:
            # First turns share nothing (no system prompt), not even across sessions.
            assert cached == 0
            continue
        parent = requests[request.parent_id]
        # The parent computed the KV of all but its last generated token.
        computed = parent.prompt_tokens + parent.output_tokens - 1
        assert cached == min(computed // 16, (request.prompt_tokens - 1) // 16) * 16


def test_sessions_have_distinct_content() -> None:
    simulation = build(parse_scenario(multi_turn_scenario()))
    first_sources = [r.segments[0][0] for r in simulation.requests if r.parent_id < 0]
    assert len(set(first_sources)) == len(first_sources)


def test_a_simulation_runs_once() -> None:
    simulation = build(parse_scenario(scenario_dict()))
    simulation.run()
    with pytest.raises(RuntimeError, match="runs once"):
        simulation.run()


def test_rejected_requests_count_against_the_slo() -> None:
    data = scenario_dict(
        engine={"max_model_len": 1000},
        workload={
            "arrival": {"type": "poisson", "rate": 2},
            "prompt_tokens": {"type": "uniform", "low": 100, "high": 1900},
            "output_tokens": {"type": "constant", "value": 10},
            "num_requests": 200,
        },
        slo={"ttft_s": 10, "tpot_s": 1, "percentile": 90},
    )
    summary = run(parse_scenario(data)).summary
    assert 0.3 < summary["requests"]["rejected"] / 200 < 0.7
    # Every completed request is fast, but a p90 SLO cannot hold with ~half rejected.
    assert summary["ttft_s"]["p99"] < 10
    assert summary["slo"]["met"] is False
    assert summary["slo"]["ttft_at_percentile_s"] is None  # the p90 request never completed


def test_workloads_with_different_seeds_share_no_content() -> None:
    data = system_prompt_scenario(True, num_requests=5)
    same = [build(parse_scenario(data)).requests for _ in range(2)]
    other = build(parse_scenario({**data, "seed": 99})).requests
    # A long-lived server must not hit blocks an unrelated earlier run cached.
    sources = {source for r in other for source, _ in r.segments}
    assert not sources & {source for r in same[0] for source, _ in r.segments}
    assert [r.segments for r in same[0]] == [r.segments for r in same[1]]
