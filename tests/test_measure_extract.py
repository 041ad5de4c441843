"""The statistics of calibration/measure_extract.py, without a server: synthetic token
timestamps stand in for streams.
"""

from __future__ import annotations

import math

import pytest

from calibration.measure_extract import (
    chunks,
    decode_observation,
    decode_window,
    held_back,
    mixed_observation,
    mixed_step,
    prefill_observation,
    robust_summary,
    ttft_s,
)
from live.client import StreamResult
from sim.engine.latency import BatchShape, prefill_chunk_pairs
from sim.engine.request import RequestStatus


def stream(send_s: float, token_times_s: list[float]) -> StreamResult:
    return StreamResult(
        send_s=send_s,
        token_times_s=token_times_s,
        output_token_ids=[5] * len(token_times_s),
        finish_s=token_times_s[-1] if token_times_s else send_s,
        prompt_tokens=None,
        completion_tokens=len(token_times_s),
        cached_tokens=None,
        status=RequestStatus.OK,
        error="",
        http_status=200,
        retry_after_s=None,
    )


def regular(first_s: float, step_s: float, num_tokens: int) -> list[float]:
    return [first_s + i * step_s for i in range(num_tokens)]


def test_chunks_group_tokens_that_share_a_timestamp() -> None:
    assert chunks([1.0, 2.0, 2.0, 2.0, 3.0]) == [(1.0, 1, 0), (2.0, 3, 1), (3.0, 1, 4)]
    assert chunks([]) == []


def test_prefill_observation_is_the_median_ttft_with_the_front_end() -> None:
    results = [stream(10.0, [10.0 + t, 10.1 + t]) for t in (0.030, 0.020, 0.500)]
    ttfts = [ttft_s(r) for r in results]
    observation = prefill_observation(512, ttfts)
    assert observation.seconds == pytest.approx(0.030)
    assert observation.kind == "prefill" and observation.includes_frontend
    assert observation.repetitions == 3
    assert observation.batch == BatchShape(
        num_prefill_tokens=512,
        num_prefill_seqs=1,
        prefill_attention_pairs=prefill_chunk_pairs(512, 0),
        num_sampled=1,
    )


def test_a_cached_prefill_computes_only_the_tokens_after_the_cached_prefix() -> None:
    observation = prefill_observation(1024, [0.02, 0.03], cached_tokens=896)
    assert observation.batch == BatchShape(
        num_prefill_tokens=128,
        num_prefill_seqs=1,
        prefill_attention_pairs=128 * 896 + 128 * 129 // 2,
        prefill_context_tokens=896,
        num_sampled=1,
    )
    with pytest.raises(ValueError, match="cached_tokens"):
        prefill_observation(512, [0.02], cached_tokens=512)


def test_decode_window_covers_only_steps_where_all_requests_decode() -> None:
    # Three requests, steps of 10 ms once all decode; the first started 3 steps earlier with
    # slow (mixed) steps, which must not count.
    early = [0.0, 0.05, 0.10, 0.15, *regular(0.16, 0.01, 12)]
    late = [regular(0.15 + 0.001 * i, 0.01, 13) for i in range(2)]
    results = [stream(0.0, early), *(stream(0.0, times) for times in late)]
    window = decode_window(results, context_tokens=100)
    assert window is not None
    assert window.step_s == pytest.approx(0.01)
    assert window.num_steps > 5
    # Sequence lengths attended: C + k for output token k, about C + the middle of the window.
    assert 3 * 100 < window.decode_context_tokens < 3 * (100 + 16)
    observation = decode_observation(3, [window])
    assert observation.batch.num_decode_seqs == 3 and observation.batch.num_sampled == 3
    assert observation.batch.decode_context_tokens == window.decode_context_tokens
    assert observation.kind == "decode" and not observation.includes_frontend


def test_decode_window_divides_gaps_by_the_tokens_a_chunk_carries() -> None:
    # Steps of 10 ms; the client fell behind and got tokens 3-4 and 7-9 in merged chunks.
    times = [0.0, 0.01, 0.02, 0.04, 0.04, 0.05, 0.06, 0.09, 0.09, 0.09, 0.10]
    window = decode_window([stream(-0.1, times)], context_tokens=10)
    assert window is not None
    assert window.step_s == pytest.approx(0.01)


def test_decode_window_drops_bursts_below_the_step_floor() -> None:
    steady = stream(0.0, regular(0.1, 0.01, 20))
    burst = stream(0.0, regular(0.28, 1e-5, 20))  # a stalled stream: every token at the end
    kept = decode_window([steady], context_tokens=10, min_step_s=0.001)
    assert kept is not None and kept.step_s == pytest.approx(0.01)
    unfiltered = decode_window([burst], context_tokens=10)
    assert unfiltered is not None and unfiltered.step_s == pytest.approx(1e-5)
    assert decode_window([burst], context_tokens=10, min_step_s=0.001) is None


def test_mixed_step_is_the_gap_ending_at_the_prefills_first_token() -> None:
    # Decodes step every 10 ms; the step with the prefill takes 50 ms and ends at 0.25.
    decode_times = [*regular(0.10, 0.01, 11), *regular(0.25, 0.01, 10)]
    decodes = [stream(0.0, [t + 0.0002 * i for t in decode_times]) for i in range(4)]
    prefill = stream(0.205, [0.2502, 0.26])
    step = mixed_step(decodes, prefill, context_tokens=64)
    assert step is not None
    assert step.step_s == pytest.approx(0.05)
    assert step.num_decode_seqs == 4
    assert step.decode_context_tokens == 4 * (64 + 11)  # output token 11 is computed in it
    observation = mixed_observation(512, [step])
    assert observation.kind == "mixed" and not observation.includes_frontend
    assert observation.batch.num_prefill_tokens == 512
    assert observation.batch.num_decode_seqs == 4 and observation.batch.num_sampled == 5
    assert observation.batch.prefill_attention_pairs == prefill_chunk_pairs(512, 0)


def test_mixed_step_is_found_when_the_first_token_arrives_a_step_late() -> None:
    # As vLLM-CPU with the model in the engine core delivered it: the 60 ms mixed step ends at
    # 0.26 in the running streams, and the prefill's first token reaches the client with the
    # next step's tokens, 5 ms later: nearer that short step's end than the long one's.
    decode_times = [*regular(0.10, 0.005, 21), *regular(0.26, 0.005, 10)]
    decodes = [stream(0.0, [t + 0.0001 * i for t in decode_times]) for i in range(4)]
    prefill = stream(0.201, [0.2651, 0.27])
    step = mixed_step(decodes, prefill, context_tokens=64)
    assert step is not None
    assert step.step_s == pytest.approx(0.06)


def test_mixed_step_needs_the_prefill_to_land_among_running_decodes() -> None:
    decodes = [stream(0.0, regular(0.10, 0.01, 10))]
    before_all_started = stream(0.05, [0.15, 0.16])
    assert mixed_step(decodes, before_all_started, context_tokens=64) is None
    after_they_finished = stream(0.15, [0.30, 0.31])
    assert mixed_step(decodes, after_they_finished, context_tokens=64) is None


def test_streams_held_back_to_their_end_are_named_as_such() -> None:
    streamed = stream(0.0, regular(0.10, 0.01, 40))
    assert held_back([streamed, streamed]) is None
    # All 40 tokens in one read at the end, as a starved CPU server delivered them.
    burst = stream(0.0, [0.5] * 40)
    note = held_back([streamed, burst])
    assert note is not None and note.startswith("1 of 2 streams arrived in bursts")
    assert "40 tokens in 1 chunk" in note and "VLLM_ENABLE_V1_MULTIPROCESSING=0" in note
    # A few merged reads are a busy client, not a held-back stream; short streams say nothing.
    merged = stream(0.0, [t for t in regular(0.10, 0.01, 20) for _ in range(2)])
    assert held_back([merged]) is None
    assert held_back([stream(0.0, [0.5] * 4)]) is None
    # The decode window finds no step in a burst, and the mixed step none among them.
    assert decode_window([burst, burst], context_tokens=64) is None
    assert mixed_step([burst], stream(0.2, [0.3, 0.31]), context_tokens=64) is None


def test_robust_summary_reports_median_and_iqr() -> None:
    summary = robust_summary([1.0, 2.0, 3.0, 4.0, 100.0])
    assert summary["median"] == 3.0
    assert summary["iqr"] == pytest.approx(2.0)
    assert summary["min"] == 1.0 and summary["max"] == 100.0
    assert not math.isnan(robust_summary([5.0])["iqr"])
