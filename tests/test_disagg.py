"""Prefill/decode disaggregation: the KV hand-off costs what the link says, is held at both
ends while in flight, and (the acceptance) decode latency tails shrink at equal GPU count."""

from __future__ import annotations

from typing import Any

import pytest

from sim.run import build
from sim.scenario import ScenarioError, parse_scenario
from tests.factories import scenario_dict

LONG_PROMPTS = {
    "arrival": {"type": "poisson", "rate": 6},
    "prompt_tokens": {"type": "uniform", "low": 3000, "high": 7000},
    "output_tokens": {"type": "uniform", "low": 100, "high": 300},
    "num_requests": 600,
}


def colocated(replicas: int = 4, **workload: Any) -> dict[str, Any]:
    return scenario_dict(
        seed=1,
        engine={"max_model_len": 8192},
        fleet={"replicas": replicas, "router": {"policy": "least_outstanding"}},
        workload={**LONG_PROMPTS, **workload},
    )


def disaggregated(prefill: Any = 2, decode: Any = 2, **link: Any) -> dict[str, Any]:
    pools = {
        "prefill": prefill if isinstance(prefill, dict) else {"replicas": prefill},
        "decode": decode if isinstance(decode, dict) else {"replicas": decode},
    }
    data = colocated()
    data["fleet"] = {
        "router": {"policy": "least_outstanding"},
        "disaggregation": {**pools, **link},
    }
    return data


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any]:
    return build(parse_scenario(colocated())).run(), build(parse_scenario(disaggregated())).run()


def test_disaggregation_lowers_the_tpot_tail_at_equal_gpu_count(pair: tuple[Any, Any]) -> None:
    # Acceptance: long prompts at high load, 4 GPUs either way. Co-located decodes share steps
    # with 3k–7k-token prefill chunks; dedicated decode replicas never do.
    together, apart = pair
    assert (together.records["status"] == "ok").all() and (apart.records["status"] == "ok").all()
    assert apart.summary["tpot_s"]["p99"] < 0.9 * together.summary["tpot_s"]["p99"]
    info = apart.summary["fleet"]["disaggregation"]
    assert info["prefill_replicas"] == 2 and info["decode_replicas"] == 2
    assert info["kv_transfers"] == 600


def test_ttft_includes_the_kv_transfer(pair: tuple[Any, Any]) -> None:
    _, apart = pair
    records = apart.records
    # Llama-3.1-8B bf16 KV: 2 × 8 KV heads × 128 × 2 bytes × 32 layers = 131,072 bytes/token.
    transfer = 0.0005 + records["prompt_tokens"] * 131_072 / 25e9
    assert (records["ttft_s"] >= transfer - 1e-12).all()
    info = apart.summary["fleet"]["disaggregation"]
    assert info["kv_transfer_s_mean"] == pytest.approx(transfer.mean())
    # Decode replicas (ids 2, 3) finish every request.
    assert set(records["replica_id"]) == {2, 3}


def test_kv_is_held_at_both_ends_while_in_flight() -> None:
    # One request over a slow link, sampled every millisecond: after the prefill replica has
    # computed the prompt, both pools hold its KV until the transfer ends; then only decode.
    data = disaggregated(1, 1, link_bandwidth_gb_s=1.0)
    data["workload"] = {
        "arrival": {"type": "constant", "rate": 1},
        "prompt_tokens": {"type": "constant", "value": 4000},
        "output_tokens": {"type": "constant", "value": 50},
        "num_requests": 1,
    }
    data["output"] = {"sample_interval_s": 0.001}
    simulation = build(parse_scenario(data))
    result = simulation.run()
    fleet = simulation.fleet
    prefill_kv = fleet.prefill.series.frame()["kv_cache_usage"].to_numpy()
    decode_kv = fleet.decode.series.frame()["kv_cache_usage"].to_numpy()
    both = (prefill_kv > 0) & (decode_kv > 0)
    transfer = 0.0005 + 4000 * 131_072 / 1e9  # 0.52 s
    assert both.sum() * 0.001 == pytest.approx(transfer, abs=0.01)
    assert decode_kv[-2] > 0 and prefill_kv[-2] == 0  # decoding alone at the end
    first_token = result.records["first_token_s"].iloc[0]
    assert result.records["ttft_s"].iloc[0] > transfer
    # Nothing leaks: every block is free once the request is done.
    assert all(r.kv.usage == 0 for r in fleet.replicas)
    assert first_token > 0


def test_pools_can_differ_in_gpu_and_tp() -> None:
    data = disaggregated(
        {"replicas": 1, "gpu": "h100-sxm", "tensor_parallel_size": 2},
        {"replicas": 2, "gpu": "a100-80gb-sxm"},
    )
    data["workload"]["num_requests"] = 100
    result = build(parse_scenario(data)).run()
    assert (result.records["status"] == "ok").all()
    pools = [r["pool"] for r in result.summary["fleet"]["per_replica"]]
    assert pools == ["prefill", "decode", "decode"]
    # TP2 prefill: each GPU sends half the KV heads, so half the bytes per link.
    info = result.summary["fleet"]["disaggregation"]
    expected = 0.0005 + result.records["prompt_tokens"].mean() * 65_536 / 25e9
    assert info["kv_transfer_s_mean"] == pytest.approx(expected)


def test_single_token_requests_finish_on_the_prefill_replica() -> None:
    data = disaggregated(1, 1)
    data["workload"] = {**LONG_PROMPTS, "output_tokens": {"type": "constant", "value": 1}}
    data["workload"]["num_requests"] = 20
    records = build(parse_scenario(data)).run().records
    assert (records["status"] == "ok").all() and set(records["replica_id"]) == {0}


@pytest.mark.parametrize("output_tokens", [1, 40])
def test_token_times_hold_every_token_the_client_sees(output_tokens: int) -> None:
    # Found by benchmarks/fuzz.py: the first token (made on the prefill replica, delivered with
    # the KV) was missing from token_times, and a one-token request had none at all.
    data = disaggregated(1, 1)
    data["workload"] = {
        **LONG_PROMPTS,
        "output_tokens": {"type": "constant", "value": output_tokens},
    }
    data["workload"]["num_requests"] = 20
    data["output"] = {"record_token_times": True}
    result = build(parse_scenario(data)).run()
    records = result.records.set_index("request_id")
    assert (records["status"] == "ok").all()
    assert result.token_times is not None
    for request_id, times in result.token_times.groupby("request_id")["time_s"]:
        assert len(times) == output_tokens
        assert times.is_monotonic_increasing
        assert times.iloc[0] == records.loc[request_id, "first_token_s"]
        assert times.iloc[-1] == records.loc[request_id, "finish_s"]
    assert result.token_times["request_id"].nunique() == 20


def test_a_request_the_decode_pool_rejects_frees_its_prefill_kv() -> None:
    # Found by benchmarks/fuzz.py: the prefill replica computes prompt + 1 token, which fits
    # max_model_len; the decode replica then rejects prompt + output, and the prefill copy of
    # the KV, released only by a transfer, stayed held for the rest of the run.
    data = disaggregated(1, 1)
    data["engine"] = {"max_model_len": 2048}
    data["workload"] = {
        "arrival": {"type": "poisson", "rate": 4},
        "prompt_tokens": {"type": "uniform", "low": 500, "high": 1500},
        "output_tokens": {"type": "uniform", "low": 100, "high": 1000},
        "num_requests": 60,
    }
    simulation = build(parse_scenario(data))
    records = simulation.run().records
    too_long = records["prompt_tokens"] + records["output_tokens"] > 2048
    assert too_long.any() and (~too_long).any()
    assert (records.loc[too_long, "status"] == "rejected").all()
    assert (records.loc[~too_long, "status"] == "ok").all()
    assert simulation.fleet is not None
    for replica in simulation.fleet.replicas:
        replica.kv.check_invariants()
        assert replica.kv.num_free_blocks == replica.kv.num_blocks, replica.replica_id


def test_bad_disaggregation_knobs() -> None:
    both = disaggregated()
    both["fleet"]["autoscaling"] = {"target": 500}
    with pytest.raises(ScenarioError, match="autoscaling a disaggregated fleet"):
        parse_scenario(both)
    static = disaggregated()
    static["engine"] = {"batching": "static", "max_model_len": 8192}
    with pytest.raises(ValueError, match=r"fleet\.disaggregation: needs engine\.batching"):
        build(parse_scenario(static))
    with pytest.raises(ScenarioError, match=r"fleet\.disaggregation\.decode\.replicas"):
        parse_scenario(disaggregated(2, {"replicas": 0}))


def test_a_decode_preempted_while_its_kv_is_on_the_way_sends_the_first_token_itself() -> None:
    # Found by benchmarks/fuzz.py (case 6498 of seed 0): a slow link and a small decode cache
    # preempt requests whose KV is still crossing; their first token came after their finish.
    data = {
        "model": "llama-3.1-8b",
        "gpu": "h100-sxm",
        "engine": {"max_model_len": 4096, "gpu_memory_utilization": 0.25},
        "fleet": {
            "disaggregation": {
                "prefill": {"replicas": 1},
                "decode": {"replicas": 1},
                "link_bandwidth_gb_s": 0.001,
            }
        },
        "workload": {
            "arrival": {"type": "poisson", "rate": 8},
            "prompt_tokens": {"type": "constant", "value": 1500},
            "output_tokens": {"type": "constant", "value": 300},
            "num_requests": 40,
        },
    }
    simulation = build(parse_scenario(data))
    records = simulation.run().records
    assert (records["num_preemptions"] > 0).any()
    ok = records[records["status"] == "ok"]
    assert (ok["arrival_s"] <= ok["first_token_s"]).all()
    assert (ok["first_token_s"] <= ok["finish_s"]).all()
