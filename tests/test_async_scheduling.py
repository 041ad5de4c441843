"""vLLM's async scheduling (a request that arrives during step N first runs in step N+2), when
it is on by default, and cascade attention's shared prefix (read once for the batch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sim.build.engines import resolve_async_scheduling
from sim.engine.scheduler import cascade_shared_tokens
from sim.run import build
from sim.scenario import parse_scenario
from tests.factories import make_request, make_scheduler, make_sequence, scenario_dict

STEP_S = 0.01


def trace_file(tmp_path: Path, rows: list[tuple[float, int, int]]) -> str:
    path = tmp_path / "arrivals.jsonl"
    lines = [
        json.dumps({"arrival_s": a, "prompt_tokens": p, "output_tokens": o}) for a, p, o in rows
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def constant_steps(trace: str, async_scheduling: bool, fast_forward: bool = True) -> Any:
    data = scenario_dict(
        latency={"type": "constant", "step_s": STEP_S},
        engine={"max_model_len": 8192, "async_scheduling": async_scheduling},
        workload={"trace": {"path": trace}},
        simulator={"fast_forward": fast_forward},
    )
    return build(parse_scenario(data)).run().records.set_index("request_id")


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_request_arriving_mid_step_waits_one_step_more_when_scheduling_is_async(
    tmp_path: Path, fast_forward: bool
) -> None:
    # Request 0 arrives at an idle engine and decodes for 20 steps; request 1 arrives during
    # step 2 (10–20 ms). Synchronous: it runs in step 3 (20–30 ms); async: in step 4.
    trace = trace_file(tmp_path, [(0.0, 16, 20), (0.015, 16, 4)])
    sync = constant_steps(trace, async_scheduling=False, fast_forward=fast_forward)
    async_ = constant_steps(trace, async_scheduling=True, fast_forward=fast_forward)
    assert sync.loc[0, "ttft_s"] == pytest.approx(STEP_S)  # an idle engine starts at once
    assert async_.loc[0, "ttft_s"] == pytest.approx(STEP_S)
    assert sync.loc[1, "ttft_s"] == pytest.approx(0.030 - 0.015)
    assert async_.loc[1, "ttft_s"] == pytest.approx(0.040 - 0.015)
    # Later steps are back to back either way: decode is not slowed down.
    assert async_.loc[1, "e2e_s"] - async_.loc[1, "ttft_s"] == pytest.approx(3 * STEP_S)


def test_async_fast_forward_and_step_by_step_give_the_same_records(tmp_path: Path) -> None:
    rows = [(0.0, 64, 40), (0.013, 32, 12), (0.047, 200, 30), (0.048, 16, 5), (0.30, 16, 8)]
    trace = trace_file(tmp_path, rows)
    fast = constant_steps(trace, async_scheduling=True, fast_forward=True)
    slow = constant_steps(trace, async_scheduling=True, fast_forward=False)
    columns = ["scheduled_s", "first_token_s", "finish_s"]
    assert fast[columns].to_numpy().tolist() == slow[columns].to_numpy().tolist()


def scenario_with(**engine: Any) -> Any:
    data = scenario_dict(engine={"max_model_len": 8192, **engine})
    return parse_scenario(data)


def test_async_scheduling_follows_vllms_default_for_the_deployment() -> None:
    assert resolve_async_scheduling(scenario_with(), "H100 SXM")  # version unknown: today's
    assert resolve_async_scheduling(scenario_with(vllm_version="0.15.1"), "H100 SXM")
    assert not resolve_async_scheduling(scenario_with(vllm_version="0.13.0"), "H100 SXM")
    assert not resolve_async_scheduling(scenario_with(pipeline_parallel_size=2), "H100 SXM")
    assert not resolve_async_scheduling(scenario_with(), "cpu-core")  # the CPU backend
    assert not resolve_async_scheduling(scenario_with(async_scheduling=False), "H100 SXM")
    assert resolve_async_scheduling(scenario_with(async_scheduling=True), "cpu-core")
    constant = parse_scenario(scenario_dict(latency={"type": "constant", "step_s": 0.01}))
    assert not resolve_async_scheduling(constant, "H100 SXM")  # queueing-theory checks


def running_with_prefix(count: int, prefix: int) -> tuple[Any, list[Any]]:
    """``count`` requests sharing a ``prefix``-token system prompt, all prefilled."""
    scheduler = make_scheduler(block_size=16)
    for i in range(count):
        request = make_request(i, prompt_tokens=prefix + 40, output_tokens=8)
        if prefix:
            request = make_request(
                i, prompt_tokens=prefix + 40, output_tokens=8, shared_prefix_tokens=prefix
            )
        scheduler.add(make_sequence(request))
    plan = scheduler.schedule(0.0)
    assert plan is not None
    scheduler.complete(plan, 0.01)
    decode = scheduler.schedule(0.01)
    assert decode is not None
    return scheduler, decode.scheduled


def test_cascade_attention_reads_a_prefix_all_running_requests_share_once() -> None:
    scheduler, rows = running_with_prefix(10, 512)
    assert cascade_shared_tokens(scheduler.kv, scheduler.running, rows) == 9 * 512
    plan_shape = scheduler.schedule(0.02)
    assert plan_shape is not None and plan_shape.batch.shared_context_tokens == 9 * 512


@pytest.mark.parametrize(
    ("count", "prefix"),
    [(10, 0), (10, 240), (7, 512)],  # no common prefix, shorter than 256 tokens, < 8 requests
)
def test_no_cascade_where_vllm_would_not_use_it(count: int, prefix: int) -> None:
    scheduler, rows = running_with_prefix(count, prefix)
    assert cascade_shared_tokens(scheduler.kv, scheduler.running, rows) == 0


def test_the_cpu_backend_reads_a_block_several_requests_hold_once() -> None:
    # Three requests (fewer than cascade needs) share a 256-token prefix: on the CPU backend
    # the second and third read those 16 blocks from cache, on a GPU they read them again.
    from sim.engine.kv_cache import KVCacheManager
    from sim.engine.scheduler import ContinuousBatchScheduler, ReplicaOptions, SchedulerConfig

    def decode_shape(reads: str) -> Any:
        kv = KVCacheManager(1000, 16, True)
        config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=8192)
        scheduler = ContinuousBatchScheduler(config, kv, ReplicaOptions(shared_kv_reads=reads))
        for i in range(3):
            request = make_request(i, prompt_tokens=300, output_tokens=8, shared_prefix_tokens=256)
            scheduler.add(make_sequence(request))
        plan = scheduler.schedule(0.0)
        assert plan is not None
        scheduler.complete(plan, 0.01)
        decode = scheduler.schedule(0.01)
        assert decode is not None
        kv.check_invariants()
        return decode.batch

    assert decode_shape("cached").shared_context_tokens == 2 * 256
    assert decode_shape("cascade").shared_context_tokens == 0
    assert decode_shape("none").shared_context_tokens == 0


def test_a_request_held_for_the_step_after_next_counts_as_waiting(tmp_path: Path) -> None:
    # Steps of 0.5 s; request 1 arrives at 0.6 s, during step 2 (0.5–1.0 s): async scheduling
    # holds it until step 4 (from 1.5 s), so the fleet's sample at 1.0 s sees it waiting.
    trace = trace_file(tmp_path, [(0.0, 16, 20), (0.6, 16, 4)])
    data = scenario_dict(
        latency={"type": "constant", "step_s": 0.5},
        engine={"max_model_len": 8192, "async_scheduling": True},
        workload={"trace": {"path": trace}},
        output={"sample_interval_s": 1.0},
    )
    result = build(parse_scenario(data)).run()
    samples = result.timeseries.set_index("time_s")
    assert samples.loc[1.0, "num_requests_waiting"] == 1
    assert result.records.set_index("request_id").loc[1, "scheduled_s"] == pytest.approx(1.5)
