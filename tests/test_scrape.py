"""Parsing and differencing vLLM's /metrics (an excerpt captured from vLLM 0.32 on the CPU)."""

from __future__ import annotations

import json
import math

import pytest

from live.scrape import Histogram, MetricsSnapshot, metrics_delta, parse_metrics

pytest.importorskip("prometheus_client")

#: Captured from a vLLM 0.32.0 CPU server after three 80-token prompts (the same prompt, so two
#: of them hit 64 cached tokens) of 8 output tokens each; histograms trimmed to a few buckets.
#: The last lines are hand-made: a second engine, a counter whose TYPE line has no ``_total``
#: (the other naming style), and an unlabelled sample.
METRICS_AFTER = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 240.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.7962117288588068e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 128.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 240.0
# HELP vllm:prompt_tokens_cached_total Number of cached prompt tokens (local + external).
# TYPE vllm:prompt_tokens_cached_total counter
vllm:prompt_tokens_cached_total{engine="0",model_name="tiny"} 128.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny"} 24.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.01",model_name="tiny"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.02",model_name="tiny"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="tiny"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 3.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 3.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 0.06255817413330078
# HELP vllm:request_time_per_output_token_seconds Histogram of time_per_output_token_seconds.
# TYPE vllm:request_time_per_output_token_seconds histogram
vllm:request_time_per_output_token_seconds_bucket{engine="0",le="0.01",model_name="tiny"} 3.0
vllm:request_time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 3.0
vllm:request_time_per_output_token_seconds_count{engine="0",model_name="tiny"} 3.0
vllm:request_time_per_output_token_seconds_sum{engine="0",model_name="tiny"} 0.009036853571550247
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="tiny"} 21.0
vllm:iteration_tokens_total_bucket{engine="0",le="32.0",model_name="tiny"} 23.0
vllm:iteration_tokens_total_bucket{engine="0",le="128.0",model_name="tiny"} 24.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="tiny"} 24.0
vllm:iteration_tokens_total_count{engine="0",model_name="tiny"} 24.0
vllm:iteration_tokens_total_sum{engine="0",model_name="tiny"} 136.0
vllm:generation_tokens_total{engine="1",model_name="tiny"} 6.0
# HELP vllm:num_preemptions Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="tiny"} 2.0
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 6.44579328e+08
"""

#: The same server earlier: one request done, before any prefix hit.
METRICS_BEFORE = """\
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 80.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 0.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 80.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny"} 8.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.01",model_name="tiny"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.02",model_name="tiny"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="tiny"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 1.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 1.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 0.03
"""


@pytest.fixture
def after() -> MetricsSnapshot:
    return MetricsSnapshot(parse_metrics(METRICS_AFTER), time_s=110.0)


@pytest.fixture
def before() -> MetricsSnapshot:
    return MetricsSnapshot(parse_metrics(METRICS_BEFORE), time_s=100.0)


def test_parse_keys_by_sample_name_and_sorted_labels() -> None:
    samples = parse_metrics(METRICS_AFTER)
    labels = (("engine", "0"), ("model_name", "tiny"))
    assert samples[("vllm:prompt_tokens_total", labels)] == 240.0
    created = samples[("vllm:prefix_cache_queries_created", labels)]
    assert created == pytest.approx(1.7962117288588068e09)
    bucket_labels = (("engine", "0"), ("le", "+Inf"), ("model_name", "tiny"))
    assert samples[("vllm:time_to_first_token_seconds_bucket", bucket_labels)] == 3.0
    assert samples[("process_resident_memory_bytes", ())] == 6.44579328e08


def test_value_accepts_both_counter_spellings_and_sums_engines(after: MetricsSnapshot) -> None:
    assert after.value("vllm:prompt_tokens") == 240.0
    assert after.value("vllm:prompt_tokens_total") == 240.0
    assert after.value("vllm:generation_tokens") == 30.0  # engines 0 and 1
    assert after.value("vllm:generation_tokens", engine="1") == 6.0
    assert after.value("vllm:generation_tokens", engine=1) == 6.0  # type: ignore[arg-type]
    assert after.value("vllm:num_preemptions") == 2.0
    assert after.value("vllm:num_preemptions_total", model_name="tiny") == 2.0
    assert after.value("process_resident_memory_bytes") == 6.44579328e08


def test_missing_metrics_are_zero(after: MetricsSnapshot) -> None:
    assert after.value("vllm:no_such_metric") == 0.0
    assert after.value("vllm:prompt_tokens", model_name="other") == 0.0
    empty = after.histogram("vllm:no_such_histogram")
    assert empty == Histogram()
    assert math.isnan(empty.mean)


def test_histogram_buckets_sum_count_mean(after: MetricsSnapshot) -> None:
    ttft = after.histogram("vllm:time_to_first_token_seconds")
    assert ttft.buckets == ((0.01, 1.0), (0.02, 2.0), (0.04, 3.0), (math.inf, 3.0))
    assert ttft.count == 3.0
    assert ttft.sum == pytest.approx(0.06255817413330078)
    assert ttft.mean == pytest.approx(0.06255817413330078 / 3)
    iteration = after.histogram("vllm:iteration_tokens_total")
    assert iteration.bucket_counts()[32.0] == 23.0
    assert iteration.mean == pytest.approx(136 / 24)


def test_delta_is_what_happened_between_the_scrapes(
    before: MetricsSnapshot, after: MetricsSnapshot
) -> None:
    delta = metrics_delta(before, after)
    assert delta.duration_s == 10.0
    assert delta.prefix_cache_queries == 160.0
    assert delta.prefix_cache_hits == 128.0
    assert delta.prefix_cache_hit_rate == 0.8
    assert delta.prompt_tokens == 160.0
    assert delta.prompt_tokens_cached == 128.0
    assert delta.generation_tokens == 22.0  # 30 after (both engines) - 8 before
    assert delta.preemptions == 2.0  # absent before: counts from zero
    assert delta.ttft.buckets == ((0.01, 1.0), (0.02, 2.0), (0.04, 2.0), (math.inf, 2.0))
    assert delta.ttft.count == 2.0
    assert delta.ttft.sum == pytest.approx(0.06255817413330078 - 0.03)
    assert delta.tpot.count == 3.0  # vllm:request_time_per_output_token_seconds
    assert delta.iteration_tokens.count == 24.0
    assert delta.e2e == Histogram()  # not in the excerpt
    assert math.isnan(delta.e2e.mean)


def test_delta_as_dict_is_json(before: MetricsSnapshot, after: MetricsSnapshot) -> None:
    data = json.loads(json.dumps(metrics_delta(before, after).as_dict(), allow_nan=False))
    assert data["prefix_cache_hit_rate"] == 0.8
    assert data["ttft"]["buckets"] == {"0.01": 1.0, "0.02": 2.0, "0.04": 2.0, "+Inf": 2.0}
    assert data["ttft"]["count"] == 2.0
    assert data["e2e"] == {"buckets": {}, "sum": 0.0, "count": 0.0, "mean": None}


def test_hit_rate_without_queries_is_nan(before: MetricsSnapshot) -> None:
    delta = metrics_delta(before, before)
    assert delta.prefix_cache_queries == 0.0
    assert math.isnan(delta.prefix_cache_hit_rate)
    assert delta.as_dict()["prefix_cache_hit_rate"] is None


def test_counter_going_down_means_a_restart(
    before: MetricsSnapshot, after: MetricsSnapshot
) -> None:
    with pytest.raises(ValueError, match="restarted"):
        metrics_delta(after, before)


def _phases(count: float, ttft_sum: float, queue_sum: float, prefill_sum: float) -> MetricsSnapshot:
    lines = []
    for name, total in (
        ("vllm:time_to_first_token_seconds", ttft_sum),
        ("vllm:request_queue_time_seconds", queue_sum),
        ("vllm:request_prefill_time_seconds", prefill_sum),
    ):
        lines += [
            f"# TYPE {name} histogram",
            f'{name}_bucket{{engine="0",le="+Inf",model_name="tiny"}} {count}',
            f'{name}_count{{engine="0",model_name="tiny"}} {count}',
            f'{name}_sum{{engine="0",model_name="tiny"}} {total}',
        ]
    return MetricsSnapshot(parse_metrics("\n".join(lines) + "\n"), time_s=0.0)


def test_ttft_outside_the_engine_is_what_queue_and_prefill_leave() -> None:
    # Two requests: TTFT 25 ms on average, of which 1 ms queued and 15 ms in prefill.
    delta = metrics_delta(_phases(0, 0.0, 0.0, 0.0), _phases(2, 0.05, 0.002, 0.03))
    assert delta.prefill_time.count == 2.0
    assert delta.ttft_outside_engine_s == pytest.approx(0.025 - 0.001 - 0.015)
    parts = delta.ttft_parts()
    assert parts is not None
    assert parts["outside_engine"] + parts["queue"] + parts["prefill"] == pytest.approx(0.025)
    assert json.loads(json.dumps(delta.as_dict()))["ttft_outside_engine_s"] == pytest.approx(0.009)


def test_ttft_outside_the_engine_needs_the_phase_histograms(
    before: MetricsSnapshot, after: MetricsSnapshot
) -> None:
    delta = metrics_delta(before, after)  # vLLM's TTFT but no queue or prefill histogram
    assert math.isnan(delta.ttft_outside_engine_s)
    assert delta.as_dict()["ttft_outside_engine_s"] is None
    assert delta.ttft_parts() is None
