"""Whole-simulation invariants over hypothesis-generated small scenarios.

Every generated scenario is one replica of Llama-3.1-8B on a made-up GPU whose memory is chosen
so that only a few dozen KV blocks fit, which forces admission stalls, preemptions and
rejections. Whatever the workload, engine knobs and batching policy:

* requests are conserved: one record per request, unique ids, each with a final status;
* completed requests have ordered timestamps, and rejected ones say why (and only when they
  really cannot run: too long for ``max_model_len`` or for the whole KV cache);
* KV blocks are conserved: the cache's own invariants hold and every block is free at the end;
* prefix-cache accounting is sane: hits ≤ queries, whole blocks, never the whole prompt;
* under a constant step time, TTFT is at least the prefill time of the uncached prompt;
* runs are deterministic in the seed.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import numpy as np
import pandas.testing as pdt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.catalog.models import get_model
from sim.engine.memory import MemoryPlan, plan_memory
from sim.run import SimResult, Simulation, build
from sim.scenario import CustomGPUSpec, parse_scenario

MODEL = "llama-3.1-8b"
BLOCK_SIZE = 16
GPU_MEMORY_UTILIZATION = 0.9
RUN_TIMEOUT_S = 10  # a tiny scenario runs in milliseconds; longer means the engine is stuck


def tiny_gpu(num_blocks: int, max_num_batched_tokens: int) -> dict[str, Any]:
    """A custom GPU whose memory leaves room for exactly ``num_blocks`` KV blocks.

    KV bytes are affine in the GPU's memory (a fraction of what CUDA reports, itself the memory
    less the driver's reserve, minus weights, activations and vLLM's reserve), so two
    :func:`plan_memory` calls on large GPUs give the line to invert. Half a block of slack keeps
    float rounding from losing a block.
    """

    def plan(memory_gb: float) -> MemoryPlan:
        gpu = CustomGPUSpec(
            name="tiny", memory_gb=memory_gb, memory_bandwidth_tb_s=1, bf16_tflops=100
        ).build()
        return plan_memory(
            get_model(MODEL),
            gpu,
            dtype="bf16",
            kv_dtype="bf16",
            tensor_parallel_size=1,
            gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
            max_num_batched_tokens=max_num_batched_tokens,
            block_size=BLOCK_SIZE,
        )

    low, high = plan(100.0), plan(200.0)
    kv_bytes_per_gb = (high.kv_bytes - low.kv_bytes) / 100.0
    target_kv_bytes = (num_blocks + 0.5) * BLOCK_SIZE * low.kv_bytes_per_token
    memory_gb = 100.0 + (target_kv_bytes - low.kv_bytes) / kv_bytes_per_gb
    assert plan(memory_gb).num_blocks == num_blocks
    return {
        "name": "tiny",
        "memory_gb": memory_gb,
        "memory_bandwidth_tb_s": 1,
        "bf16_tflops": 100,
    }


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Fail instead of hanging if the engine never finishes (the sampler process never ends)."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"simulation did not finish within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run(data: dict[str, Any]) -> tuple[Simulation, SimResult]:
    """Build and run a scenario dict, with a time limit."""
    sim = build(parse_scenario(data))
    with time_limit(RUN_TIMEOUT_S):
        result = sim.run()
    return sim, result


# --- strategies ------------------------------------------------------------------------------


def lengths(max_value: int) -> st.SearchStrategy[dict[str, Any]]:
    """Small constant, uniform or lognormal token-count distributions."""
    constant = st.builds(lambda v: {"type": "constant", "value": v}, st.integers(1, max_value))
    uniform = st.tuples(st.integers(1, max_value), st.integers(0, max_value)).map(
        lambda t: {"type": "uniform", "low": t[0], "high": min(max_value, t[0] + t[1])}
    )
    lognormal = st.tuples(
        st.floats(0.0, math.log(max_value)), st.floats(0.1, 1.5), st.integers(1, 3)
    ).map(
        lambda t: {
            "type": "lognormal",
            "mu": t[0],
            "sigma": t[1],
            "min_tokens": t[2],
            "max_tokens": max_value,
        }
    )
    return st.one_of(constant, uniform, lognormal)


prefixes = st.one_of(
    st.just({"type": "none"}),
    st.builds(
        lambda groups, tokens, share: {
            "type": "shared",
            "num_groups": groups,
            "prefix_tokens": tokens,
            "share": share,
        },
        st.integers(1, 4),
        st.integers(1, 200),
        st.floats(0.0, 1.0),
    ),
    st.builds(
        lambda high, think, system: {
            "type": "multi_turn",
            "turns": {"type": "uniform", "low": 1, "high": high},
            "think_time_s": think,
            "system_prompt_tokens": system,
        },
        st.integers(1, 4),
        st.floats(0.0, 5.0),
        st.sampled_from([0, 0, 32, 50]),
    ),
)

latencies = st.one_of(
    st.builds(lambda d: {"type": "constant", "step_s": d}, st.sampled_from([0.001, 0.01, 0.05])),
    st.builds(lambda m: {"type": "exponential", "mean_s": m}, st.sampled_from([0.002, 0.02])),
    st.just({"type": "roofline"}),
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    """A small scenario dict (≤ 60 requests) on a GPU with a tiny KV cache, and its blocks."""
    max_num_seqs = draw(st.integers(1, 16))
    chunked = draw(st.sampled_from([True, True, True, False]))  # mostly on
    num_blocks = draw(st.integers(4, 64))
    # vLLM refuses to start when max_model_len exceeds the KV cache.
    max_model_len = min(draw(st.integers(64, 1024)), num_blocks * BLOCK_SIZE)
    if chunked:
        max_num_batched_tokens = draw(st.integers(max(16, max_num_seqs), 512))
    else:
        # Chunked prefill off needs a budget that holds a whole max_model_len prompt.
        max_num_batched_tokens = max(max_model_len, max_num_seqs)
    batching = draw(st.sampled_from(["continuous", "continuous", "static", "dynamic"]))
    data = {
        "model": MODEL,
        "gpu": tiny_gpu(num_blocks, max_num_batched_tokens),
        "seed": draw(st.integers(0, 2**20)),
        "engine": {
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens,
            "block_size": BLOCK_SIZE,
            "enable_prefix_caching": draw(st.booleans()),
            "enable_chunked_prefill": chunked,
            "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
            "max_model_len": max_model_len,
            "scheduling_policy": draw(st.sampled_from(["fcfs", "priority"])),
            "batching": batching,
            "batch_window_s": draw(st.sampled_from([0.0, 0.01, 0.2])),
        },
        "workload": {
            "arrival": {"type": "poisson", "rate": draw(st.floats(0.5, 200.0))},
            "prompt_tokens": draw(lengths(200)),
            "output_tokens": draw(lengths(100)),
            "prefix": draw(prefixes),
            "num_requests": draw(st.integers(1, 60)),
        },
        "latency": draw(latencies),
        "output": {"sample_interval_s": 0.05},
    }
    return data, num_blocks


# --- the invariants --------------------------------------------------------------------------


def check_invariants(
    data: dict[str, Any], num_blocks: int, sim: Simulation, result: SimResult
) -> None:
    """Every invariant that must hold after any run of ``data`` sized for ``num_blocks``."""
    engine = data["engine"]
    kv = sim.scheduler.kv
    records = result.records
    num_requests = data["workload"]["num_requests"]

    # Requests conserved: one record each, unique ids, every one with a final status.
    assert kv.num_blocks == num_blocks, "tiny_gpu sizing disagrees with plan_memory"
    assert len(sim.records) == num_requests
    assert all(r.status is not None for r in sim.records)
    assert len(records) == num_requests
    assert records["request_id"].is_unique
    assert set(records["status"]) <= {"ok", "rejected"}
    assert result.summary["requests"]["total"] == num_requests

    # Rejections carry a reason, and happen exactly when a request can never run.
    total_tokens = records["prompt_tokens"] + records["output_tokens"]
    blocks_needed = -(-total_tokens // BLOCK_SIZE)
    impossible = (total_tokens > engine["max_model_len"]) | (blocks_needed > kv.num_blocks)
    rejected = records["status"] == "rejected"
    assert (rejected == impossible).all()
    assert (records.loc[rejected, "error"].str.len() > 0).all()
    assert records.loc[rejected, "first_token_s"].isna().all()

    # Completed requests: timestamps in order, latencies consistent.
    ok = records[records["status"] == "ok"]
    assert (ok["arrival_s"] <= ok["scheduled_s"]).all()
    assert (ok["scheduled_s"] <= ok["first_token_s"]).all()
    assert (ok["first_token_s"] <= ok["finish_s"]).all()
    assert (ok["ttft_s"] >= 0).all()
    assert (ok["queue_s"] >= 0).all()
    multi = ok[ok["output_tokens"] > 1]
    assert (multi["tpot_s"] > 0).all()
    assert ok.loc[ok["output_tokens"] == 1, "tpot_s"].isna().all()

    # Admission is first come, first served (every generated request has the same priority):
    # first-scheduling times never go backwards in arrival order.
    in_arrival_order = ok.sort_values(["arrival_s", "request_id"], kind="stable")
    assert in_arrival_order["scheduled_s"].is_monotonic_increasing

    # Static and dynamic batches: at most max_num_seqs members, admitted together, and the
    # next batch starts only once every member of the previous one has finished.
    if engine["batching"] != "continuous":
        batches = ok.groupby("scheduled_s")
        assert (batches.size() <= engine["max_num_seqs"]).all()
        last_finish = batches["finish_s"].max().to_numpy()
        starts = np.array(sorted(batches.groups))
        assert (starts[1:] >= last_finish[:-1]).all()

    # KV blocks conserved, and all released once every request is done.
    kv.check_invariants()
    assert kv.num_free_blocks == kv.num_blocks
    assert kv.usage == 0.0

    # Prefix cache: hits never exceed queries; hits are whole blocks and leave ≥ 1 token.
    prefix = result.summary["prefix_cache"]
    assert 0 <= prefix["hits_tokens"] <= prefix["queries_tokens"]
    assert 0.0 <= prefix["hit_rate"] <= 1.0
    assert (ok["cached_tokens"] <= ok["prompt_tokens"] - 1).all()
    assert (records["cached_tokens"] % BLOCK_SIZE == 0).all()
    if not engine["enable_prefix_caching"] or engine["batching"] != "continuous":
        assert (records["cached_tokens"] == 0).all()
        assert prefix["hits_tokens"] == 0

    # Preemption only under continuous batching; the summary agrees with the records.
    assert result.summary["preemptions"] == int(records["num_preemptions"].sum())
    if engine["batching"] != "continuous":
        assert result.summary["preemptions"] == 0

    # The time series never shows more running requests than max_num_seqs.
    series = result.timeseries
    if len(series):
        assert (series["num_requests_running"] <= engine["max_num_seqs"]).all()
        assert series["kv_cache_usage"].between(0.0, 1.0).all()

    # TTFT ≥ prefill time: the uncached prompt needs ceil(n / budget) steps of D each.
    if data["latency"]["type"] == "constant":
        step_s = data["latency"]["step_s"]
        uncached = ok["prompt_tokens"] - ok["cached_tokens"]
        min_steps = -(-uncached // engine["max_num_batched_tokens"])
        prefill_s = min_steps * step_s
        assert (ok["first_token_s"] - ok["scheduled_s"] >= prefill_s * (1 - 1e-9)).all()
        # And each later token takes at least one more step.
        decode_s = (ok["output_tokens"] - 1) * step_s
        assert (ok["finish_s"] - ok["first_token_s"] >= decode_s * (1 - 1e-9)).all()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_invariants_hold_for_generated_scenarios(case: tuple[dict[str, Any], int]) -> None:
    data, num_blocks = case
    sim, result = run(data)
    check_invariants(data, num_blocks, sim, result)

    # Same seed → identical records; another seed → other arrival times.
    _, again = run(data)
    pdt.assert_frame_equal(result.records, again.records)
    pdt.assert_frame_equal(result.timeseries, again.timeseries)
    other = build(parse_scenario({**data, "seed": data["seed"] + 1}))
    assert [r.arrival_s for r in other.requests] != list(result.records["arrival_s"])


# --- explicit cases --------------------------------------------------------------------------


def tiny_cache_scenario(
    num_blocks: int = 24, *, batching: str = "continuous", **engine: Any
) -> dict[str, Any]:
    """Many concurrent requests that each fit alone but not together in ``num_blocks``."""
    engine_section = {
        "max_num_seqs": 8,
        "max_num_batched_tokens": 256,
        "block_size": BLOCK_SIZE,
        "max_model_len": min(1024, num_blocks * BLOCK_SIZE),
        "enable_prefix_caching": True,
        "batching": batching,
        **engine,
    }
    return {
        "model": MODEL,
        "gpu": tiny_gpu(num_blocks, engine_section["max_num_batched_tokens"]),
        "seed": 3,
        "engine": engine_section,
        "workload": {
            "arrival": {"type": "poisson", "rate": 50},
            "prompt_tokens": {"type": "uniform", "low": 40, "high": 120},
            "output_tokens": {"type": "uniform", "low": 60, "high": 200},
            "num_requests": 60,
        },
        "latency": {"type": "constant", "step_s": 0.01},
        "output": {"sample_interval_s": 0.05},
    }


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_tiny_kv_cache_forces_preemption_yet_every_request_finishes(
    policy: str, prefix_caching: bool
) -> None:
    data = tiny_cache_scenario(scheduling_policy=policy, enable_prefix_caching=prefix_caching)
    sim, result = run(data)
    records = result.records
    assert sim.scheduler.kv.num_blocks == 24
    assert (records["status"] == "ok").all()
    assert (records["num_preemptions"] > 0).any()
    assert result.summary["preemptions"] == records["num_preemptions"].sum() > 0
    check_invariants(data, 24, sim, result)
    # Preempted requests lost their place but not their identity: all tokens were produced.
    assert sum(sim.scheduler.itl_counts) == int((records["output_tokens"] - 1).sum())


def test_a_roomy_kv_cache_never_preempts() -> None:
    # The same workload with a cache that holds every request at once: no preemption, so the
    # preemptions above come from the small cache, not from the workload.
    data = tiny_cache_scenario(num_blocks=8 * 20)
    sim, result = run(data)
    assert (result.records["status"] == "ok").all()
    assert result.summary["preemptions"] == 0
    check_invariants(data, 8 * 20, sim, result)


def test_requests_that_can_never_run_are_rejected_with_a_reason() -> None:
    data = tiny_cache_scenario(num_blocks=20, max_model_len=300)
    data["workload"]["prompt_tokens"] = {"type": "uniform", "low": 50, "high": 300}
    data["workload"]["output_tokens"] = {"type": "constant", "value": 60}
    sim, result = run(data)
    records = result.records
    too_long = records["prompt_tokens"] + records["output_tokens"] > 300
    assert too_long.any() and (~too_long).any()
    assert (records.loc[too_long, "status"] == "rejected").all()
    assert records.loc[too_long, "error"].str.contains("max_model_len").all()
    assert (records.loc[~too_long, "status"] == "ok").all()
    check_invariants(data, 20, sim, result)


def test_max_model_len_beyond_the_kv_cache_is_refused_like_vllm() -> None:
    data = tiny_cache_scenario(num_blocks=10, max_model_len=300)  # 160 tokens of KV
    with pytest.raises(ValueError, match=r"engine\.max_model_len: 300 tokens exceed"):
        build(parse_scenario(data))


def test_shared_prefixes_hit_the_cache() -> None:
    # One system prompt of 256 tokens shared by every request: after the first request, each
    # should reuse its 16 blocks (capped so the last prompt token is recomputed).
    data = tiny_cache_scenario(num_blocks=200, enable_prefix_caching=True)
    data["workload"]["prefix"] = {"type": "shared", "num_groups": 1, "prefix_tokens": 256}
    data["workload"]["arrival"] = {"type": "poisson", "rate": 2}
    sim, result = run(data)
    records = result.records
    assert (records["status"] == "ok").all()
    assert records.loc[0, "cached_tokens"] == 0
    assert (records.loc[1:, "cached_tokens"] >= 256).all()
    prefix = result.summary["prefix_cache"]
    assert prefix["hits_tokens"] == int(records["cached_tokens"].sum())
    assert prefix["queries_tokens"] >= int(records["prompt_tokens"].sum())
    check_invariants(data, 200, sim, result)


def test_same_seed_same_records_other_seed_other_arrivals() -> None:
    data = tiny_cache_scenario(batching="continuous")
    _, first = run(data)
    _, second = run(data)
    pdt.assert_frame_equal(first.records, second.records)
    _, other = run({**data, "seed": 4})
    assert not first.records["arrival_s"].equals(other.records["arrival_s"])
