"""Measure step times on a live vLLM server: the observations calibration fits the model to.

A :class:`MeasurementPlan` lists points of three kinds; :func:`measure` runs each point a few
times against a server (launched or existing, through :mod:`live.client`), takes a robust
statistic, and turns the point into an :class:`~calibration.observations.Observation`:

* **prefill** — one request with a fresh ``L``-token prompt (a new token stream per repetition,
  so the prefix cache never hits) and ``max_tokens=2``, sent to an otherwise idle server. Its
  client-side TTFT is the server's front-end overhead plus one engine step computing the whole
  prompt (the plan keeps ``L`` within ``max_num_batched_tokens``, so the prompt is not chunked).
  Observation: ``BatchShape(num_prefill_tokens=L, num_prefill_seqs=1,
  prefill_attention_pairs=prefill_chunk_pairs(L, 0), num_sampled=1)``, seconds = median TTFT,
  ``includes_frontend=True``.
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
  Each request asks for ``decode_tokens`` plus the number of steps the batch's prompts take to
  prefill (early requests decode while later prompts are still being prefilled), so the window
  holds about ``decode_tokens`` pure decode steps. ``B`` is capped at ``max_num_seqs``.
* **mixed** — a decode batch of ``B`` at context ``C`` running; as soon as every request has its
  first token a fresh ``L``-token prompt arrives. The step that prefills it also decodes the
  ``B`` running requests, and shows as one long gap in their streams: the gap that ends nearest
  the new request's first token. Observation: ``BatchShape(num_prefill_tokens=L,
  num_prefill_seqs=1, prefill_attention_pairs=prefill_chunk_pairs(L, 0), num_decode_seqs=B,
  decode_context_tokens=Σ(C + k), num_sampled=B + 1)``, seconds = median over repetitions of the
  median gap across the running requests, ``includes_frontend=False``. A repetition is dropped
  when the prefill did not land among decodes only (it arrived before all ``B`` were decoding,
  a decode finished first, or the gap's chunk carried more than one token).

Stalls: when the server's front end (or the client) does not get the CPU for a while, tokens
pile up and then arrive in a burst microseconds apart, which would read as impossibly short
steps. A per-request step time (or mixed gap) below the shortest lone-prefill TTFT / 50 is
treated as such a burst and left out (a decode step is never 50× shorter than a request's whole
front-end path plus a short prefill; on the tiny CPU model the ratio is about 5, bursts give
about 500). Prefill points therefore run first, shortest length first.

Every repetition records its value; each point's ``raw`` entry has the values, the median used,
and the interquartile range. Requests that fail (any status but OK) void their repetition.
The server is warmed up first (a short prefill, a small decode batch, a prefill of the largest
length; not recorded). With ``budget_s`` the run stops before a point (or a repetition) whose
estimated cost would overrun the budget, keeping what is complete; the points run in an order
that measures the extremes of each kind first, so an early stop still spans the ranges.

Prompt token streams use source ids ``source_id(UNIQUE, -7, run id, point, repetition,
request)`` — a namespace no workload uses — with a random run id per call, so repeated
calibrations against one long-running server never hit each other's cached blocks either.
"""

from __future__ import annotations

import asyncio
import math
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import httpx
import numpy as np

from calibration.observations import Observation
from live.client import StreamResult, stream_completion
from live.tokens import PromptTokens
from sim.engine.latency import BatchShape, prefill_chunk_pairs
from sim.engine.request import RequestStatus, SourceNamespace, source_id

#: The second value of every measurement source id: keeps them apart from workload sources.
MEASURE_SOURCE_TAG = -7
#: Output tokens of a lone prefill request: the first comes from the prefill step itself.
PREFILL_MAX_TOKENS = 2
#: A per-step time below the shortest lone prefill's TTFT divided by this is not a step but a
#: burst of tokens that a stalled front end or client delivered late (see the module doc).
STALL_RATIO = 50.0
#: Extra output tokens of a mixed point's decodes, so none finishes before the prefill lands.
MIXED_EXTRA_TOKENS = 16

_PREFILL_LADDER = (32, 128, 512, 1024, 2048, 4096, 8192, 16384)
_BATCH_LADDER = (1, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_MIN_CONTEXT = 64


# -- the plan ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PointCost:
    """Rough seconds per repetition of each kind of point, used only to fit a plan to a budget.

    The defaults are those of the tiny test model on one CPU core (vLLM's CPU backend), which
    is slower than any GPU server: on a GPU a plan sized with them finishes well within its
    budget, which is the safe side. :func:`measure` rescales them by what the points it has
    already run actually took.
    """

    request_s: float = 0.02  # front end + scheduling of one request
    per_prefill_token_s: float = 6e-5
    step_s: float = 2e-3  # a decode step of one short sequence
    per_decode_seq_s: float = 5e-5
    per_context_token_s: float = 8e-7

    def decode_step_s(self, num_seqs: int, context_tokens: int) -> float:
        """One decode step of ``num_seqs`` sequences attending to ``context_tokens`` in all."""
        return (
            self.step_s
            + self.per_decode_seq_s * num_seqs
            + self.per_context_token_s * context_tokens
        )

    def prefill_s(self, num_tokens: int) -> float:
        """One lone prefill request of ``num_tokens`` tokens (TTFT plus its one decode step)."""
        return self.request_s + self.per_prefill_token_s * num_tokens + self.step_s

    def decode_s(self, num_seqs: int, context: int, num_steps: int) -> float:
        """A decode batch: prefilling every prompt, then ``num_steps`` decode steps."""
        prefill = self.request_s + self.per_prefill_token_s * num_seqs * context
        return prefill + num_steps * self.decode_step_s(num_seqs, num_seqs * context)


@dataclass(frozen=True, slots=True)
class Point:
    """One measurement point: what to send, and how it was ordered in the plan."""

    kind: str  # "prefill" | "decode" | "mixed"
    prompt_tokens: int = 0  # L of a prefill or of the prefill arriving in a mixed point
    batch_size: int = 0  # B of a decode or mixed point
    context_tokens: int = 0  # C of a decode or mixed point
    max_tokens: int = PREFILL_MAX_TOKENS  # output tokens per decode request

    @property
    def label(self) -> str:
        """A short description for progress bars and logs."""
        match self.kind:
            case "prefill":
                return f"prefill L={self.prompt_tokens}"
            case "decode":
                return f"decode B={self.batch_size} C={self.context_tokens}"
            case _:
                return f"mixed B={self.batch_size} C={self.context_tokens} L={self.prompt_tokens}"

    def params(self) -> dict[str, int]:
        """The point's parameters, as recorded in ``Measurement.raw``."""
        match self.kind:
            case "prefill":
                return {"prompt_tokens": self.prompt_tokens}
            case "decode":
                return {
                    "batch_size": self.batch_size,
                    "context_tokens": self.context_tokens,
                    "max_tokens": self.max_tokens,
                }
            case _:
                return {
                    "batch_size": self.batch_size,
                    "context_tokens": self.context_tokens,
                    "prompt_tokens": self.prompt_tokens,
                    "max_tokens": self.max_tokens,
                }


@dataclass(frozen=True)
class MeasurementPlan:
    """What to measure on a live server, and the engine limits the plan was sized for.

    ``max_model_len``, ``max_num_seqs`` and ``max_num_batched_tokens`` are the server's limits
    when known (:meth:`for_budget` sets them): prefill lengths must then fit in one step
    (``L ≤ max_num_batched_tokens``, else the prompt is chunked and its TTFT is several steps),
    decode batches above ``max_num_seqs`` are capped to it, and a decode batch's requests ask for
    extra tokens covering the steps their prompts take to prefill. ``None``: unknown, no checks.

    Mixed points: a prefill of the middle prefill length arriving into a decode batch at the
    smallest context, for the smallest and the largest decode batch (at most ``max_num_seqs − 1``,
    or the scheduler would not admit the prefill until a decode finished).
    """

    prefill_lengths: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    decode_tokens: int = 32
    mixed: bool = True
    repetitions: int = 3
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("prefill_lengths", "decode_batches", "decode_contexts"):
            values = getattr(self, name)
            if not values or any(not isinstance(v, int) or v < 1 for v in values):
                raise ValueError(f"MeasurementPlan.{name}: must be positive ints, got {values!r}")
        if self.decode_tokens < 2:
            raise ValueError(
                f"MeasurementPlan.decode_tokens: must be >= 2 (one gap between two tokens), "
                f"got {self.decode_tokens}"
            )
        if self.repetitions < 1:
            raise ValueError(f"MeasurementPlan.repetitions: must be >= 1, got {self.repetitions}")
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"MeasurementPlan.{name}: must be >= 1 or None, got {value}")
        limit = self.max_num_batched_tokens
        if limit is not None and max(self.prefill_lengths) > limit:
            raise ValueError(
                f"MeasurementPlan.prefill_lengths: {max(self.prefill_lengths)} exceeds "
                f"max_num_batched_tokens={limit}, so its prefill would be chunked over several "
                "steps; keep lengths <= max_num_batched_tokens"
            )
        if self.max_model_len is not None:
            if max(self.prefill_lengths) + PREFILL_MAX_TOKENS > self.max_model_len:
                raise ValueError(
                    f"MeasurementPlan.prefill_lengths: {max(self.prefill_lengths)} + "
                    f"{PREFILL_MAX_TOKENS} output tokens exceeds max_model_len="
                    f"{self.max_model_len}; shorten the prompts"
                )
            if max(self.decode_contexts) + self.decode_tokens > self.max_model_len:
                raise ValueError(
                    f"MeasurementPlan.decode_contexts: {max(self.decode_contexts)} + "
                    f"decode_tokens {self.decode_tokens} exceeds max_model_len="
                    f"{self.max_model_len}; shorten the contexts"
                )

    @classmethod
    def for_budget(
        cls,
        budget_s: float,
        *,
        max_model_len: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        decode_tokens: int = 32,
        cost: PointCost | None = None,
    ) -> MeasurementPlan:
        """The richest plan whose estimated duration fits ``budget_s``, within the engine limits.

        Ranges: prefill lengths climb ``32, 128, 512, 1024, 2048, …`` up to the longest prompt one
        step can take (``min(max_num_batched_tokens, max_model_len − 2)``), which is always
        included; decode batches climb ``1, 4, 8, 16, 32, …`` up to ``max_num_seqs`` (included);
        decode contexts are 64, the largest (``(max_model_len − decode_tokens) / 2``, leaving room
        for the tokens generated while the batch's prompts prefill) and their geometric middle.

        Size: candidates from richest to poorest, the first whose estimated duration (the plan's
        points × repetitions, each costed with ``cost``, default :class:`PointCost`, plus the
        warm-up) fits is returned: 5 repetitions of everything; 3; at most 4 prefill lengths and
        4 decode batches; 2 contexts; 2 repetitions; no mixed points; and finally the smallest
        plan the fit can still separate its terms with (3 prefill lengths, 2 batches × 2
        contexts, 1 repetition), returned even when it does not fit — :func:`measure` then stops
        at the budget.
        """
        if not (math.isfinite(budget_s) and budget_s > 0):
            raise ValueError(f"budget_s: must be a positive number of seconds, got {budget_s}")
        for name, value in (
            ("max_model_len", max_model_len),
            ("max_num_seqs", max_num_seqs),
            ("max_num_batched_tokens", max_num_batched_tokens),
        ):
            if value < 1:
                raise ValueError(f"{name}: must be >= 1, got {value}")
        if max_model_len < decode_tokens + 2 * PREFILL_MAX_TOKENS:
            raise ValueError(
                f"max_model_len: {max_model_len} leaves no room for decode_tokens="
                f"{decode_tokens}; lower decode_tokens"
            )
        cost = cost or PointCost()
        longest = min(max_num_batched_tokens, max_model_len - PREFILL_MAX_TOKENS)
        lengths = _ladder(_PREFILL_LADDER, longest)
        batches = _ladder(_BATCH_LADDER, max_num_seqs)
        largest_context = max(1, (max_model_len - decode_tokens) // 2)
        smallest_context = min(_MIN_CONTEXT, largest_context)
        middle = 2 ** round(math.log2(smallest_context * largest_context) / 2)
        contexts = tuple(sorted({smallest_context, middle, largest_context}))
        base = cls(
            prefill_lengths=lengths,
            decode_batches=batches,
            decode_contexts=contexts,
            decode_tokens=decode_tokens,
            mixed=True,
            repetitions=5,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        candidates = [base, replace(base, repetitions=3)]
        thinner = replace(
            candidates[-1],
            prefill_lengths=_thin(lengths, 4),
            decode_batches=_thin(batches, 4),
        )
        candidates.append(thinner)
        candidates.append(replace(thinner, decode_contexts=_thin(contexts, 2)))
        candidates.append(replace(candidates[-1], repetitions=2))
        candidates.append(replace(candidates[-1], mixed=False))
        smallest = replace(
            candidates[-1],
            prefill_lengths=_thin(lengths, 3),
            decode_batches=_thin(batches, 2),
            repetitions=1,
        )
        candidates.append(smallest)
        for plan in candidates:
            if plan.estimated_duration_s(cost) <= budget_s:
                return plan
        return smallest

    def points(self) -> list[Point]:
        """The plan's points in run order: each kind's extremes first, then the rest."""
        points = [
            Point("prefill", prompt_tokens=length)
            for length in _extremes_first(self.prefill_lengths)
        ]
        batches = self.capped_batches()
        for batch, context in _corners_first(batches, tuple(sorted(set(self.decode_contexts)))):
            points.append(
                Point(
                    "decode",
                    batch_size=batch,
                    context_tokens=context,
                    max_tokens=self.decode_tokens + self.ramp_steps(batch, context),
                )
            )
        if self.mixed:
            length = sorted(self.prefill_lengths)[len(self.prefill_lengths) // 2]
            context = min(self.decode_contexts)
            # At max_num_seqs running, the scheduler admits no new request: leave a seat free.
            seats = self.max_num_seqs - 1 if self.max_num_seqs is not None else max(batches)
            for batch in sorted({min(min(batches), seats), min(max(batches), seats)}):
                if batch < 1:
                    continue
                if self.max_num_batched_tokens is not None:
                    # The prefill shares its step with the batch's decodes and must fit in it.
                    length = min(length, self.max_num_batched_tokens - batch)
                if length < 1:
                    continue
                max_tokens = self.decode_tokens + self.ramp_steps(batch, context)
                points.append(
                    Point(
                        "mixed",
                        prompt_tokens=length,
                        batch_size=batch,
                        context_tokens=context,
                        max_tokens=max_tokens + MIXED_EXTRA_TOKENS,
                    )
                )
        return points

    def capped_batches(self) -> tuple[int, ...]:
        """Decode batch sizes, capped at ``max_num_seqs`` when it is known (duplicates merged)."""
        cap = self.max_num_seqs
        return tuple(sorted({min(b, cap) if cap is not None else b for b in self.decode_batches}))

    def ramp_steps(self, batch_size: int, context_tokens: int) -> int:
        """Steps a decode batch's prompts take to prefill: extra tokens each request asks for.

        Limited so that prompt plus output stays within ``max_model_len``.
        """
        if self.max_num_batched_tokens is None:
            return 1
        steps = -(-batch_size * context_tokens // self.max_num_batched_tokens)
        if self.max_model_len is not None:
            steps = min(steps, self.max_model_len - context_tokens - self.decode_tokens)
        return max(0, steps)

    def estimated_duration_s(self, cost: PointCost | None = None) -> float:
        """Estimated seconds to run the plan (warm-up included), with ``cost`` per repetition."""
        cost = cost or PointCost()
        warmup = Point("prefill", prompt_tokens=max(self.prefill_lengths))
        total = estimate_point_s(warmup, cost) + 4 * cost.prefill_s(64)
        for point in self.points():
            total += self.repetitions * estimate_point_s(point, cost)
        return total


def estimate_point_s(point: Point, cost: PointCost) -> float:
    """Estimated seconds for one repetition of ``point``."""
    match point.kind:
        case "prefill":
            return cost.prefill_s(point.prompt_tokens)
        case "decode":
            return cost.decode_s(point.batch_size, point.context_tokens, point.max_tokens)
        case _:
            return cost.decode_s(
                point.batch_size, point.context_tokens, point.max_tokens
            ) + cost.prefill_s(point.prompt_tokens)


def _ladder(ladder: Sequence[int], cap: int) -> tuple[int, ...]:
    """Ladder values below ``cap``, then ``cap`` itself."""
    return (*[v for v in ladder if v < cap], cap)


def _thin(values: Sequence[int], count: int) -> tuple[int, ...]:
    """At most ``count`` of ``values`` (sorted), keeping both ends and spreading the rest."""
    ordered = sorted(set(values))
    if len(ordered) <= count:
        return tuple(ordered)
    if count == 1:
        return (ordered[-1],)
    indices = {round(i * (len(ordered) - 1) / (count - 1)) for i in range(count)}
    return tuple(ordered[i] for i in sorted(indices))


def _extremes_first(values: Sequence[int]) -> list[int]:
    ordered = sorted(set(values))
    if len(ordered) <= 2:
        return ordered
    return [ordered[0], ordered[-1], *ordered[1:-1]]


def _corners_first(batches: Sequence[int], contexts: Sequence[int]) -> list[tuple[int, int]]:
    grid = [(b, c) for b in batches for c in contexts]
    corners = [
        (batches[0], contexts[0]),
        (batches[-1], contexts[-1]),
        (batches[-1], contexts[0]),
        (batches[0], contexts[-1]),
    ]
    first = list(dict.fromkeys(corners))
    return first + [p for p in grid if p not in first]


_BUDGET_PART = re.compile(r"(\d+(?:\.\d+)?)([hms])")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0}


def parse_budget(text: str) -> float:
    """Seconds from a duration such as ``"10m"``, ``"90s"``, ``"1h"``, ``"2m30s"`` or ``"45"``.

    Units ``h``, ``m``, ``s`` in that order, each at most once; a bare number is seconds.
    Raises ValueError naming the expected format.
    """
    cleaned = text.strip().lower().replace(" ", "")
    expected = (
        f"budget {text!r}: expected a duration like '90s', '10m', '1h' or '2m30s' "
        "(hours h, minutes m, seconds s, largest first; a bare number is seconds)"
    )
    if not cleaned:
        raise ValueError(expected)
    try:
        seconds = float(cleaned)
    except ValueError:
        pass
    else:
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(expected)
        return seconds
    position = 0
    total = 0.0
    units_seen = ""
    for match in _BUDGET_PART.finditer(cleaned):
        if match.start() != position:
            raise ValueError(expected)
        unit = match.group(2)
        if unit in units_seen or (units_seen and "hms".index(unit) <= "hms".index(units_seen[-1])):
            raise ValueError(expected)
        units_seen += unit
        total += float(match.group(1)) * _UNIT_S[unit]
        position = match.end()
    if position != len(cleaned) or not total > 0:
        raise ValueError(expected)
    return total


# -- statistics from token timestamps (pure) ----------------------------------------------------
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

    The prefill's first token comes from the mixed step; in each running request the chunk
    arriving nearest that time ends the same step, and its gap to the chunk before is the step.
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
        later = [i for i, c in enumerate(grouped) if c[0] >= prefill.send_s]
        if not later:
            return None
        nearest = min(later, key=lambda i: abs(grouped[i][0] - first_token_s))
        arrival, count, first = grouped[nearest]
        if count != 1 or nearest == 0:
            continue  # merged tokens: this gap spans more than the mixed step
        gaps.append(arrival - grouped[nearest - 1][0])
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


def prefill_observation(prompt_tokens: int, ttfts_s: Sequence[float]) -> Observation:
    """A lone prefill's observation: median client TTFT, front-end overhead included."""
    return Observation(
        batch=BatchShape(
            num_prefill_tokens=prompt_tokens,
            num_prefill_seqs=1,
            prefill_attention_pairs=prefill_chunk_pairs(prompt_tokens, 0),
            num_sampled=1,
        ),
        seconds=float(np.median(ttfts_s)),
        kind="prefill",
        includes_frontend=True,
        repetitions=len(ttfts_s),
    )


def decode_observation(batch_size: int, windows: Sequence[DecodeWindow]) -> Observation:
    """A steady decode batch's observation: median over repetitions of the window statistic."""
    return Observation(
        batch=BatchShape(
            num_decode_seqs=batch_size,
            decode_context_tokens=round(float(np.mean([w.decode_context_tokens for w in windows]))),
            num_sampled=batch_size,
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


# -- running a plan against a server ------------------------------------------------------------
@dataclass
class Measurement:
    """What a measurement run produced.

    ``raw`` has one entry per point run: ``kind``, ``params``, ``values_s`` (one per valid
    repetition), ``statistic`` ("median"), ``seconds``, ``iqr_s``, and ``errors`` (why
    repetitions were dropped). ``frontend_overhead_s`` is None: the client cannot separate the
    front end from the prefill step, so the fit estimates it from the ``includes_frontend``
    observations. ``complete`` is False when the budget stopped the run early.
    """

    observations: list[Observation]
    raw: list[dict[str, Any]]
    frontend_overhead_s: float | None
    started_at: datetime
    duration_s: float
    run_id: int = 0
    complete: bool = True
    skipped: list[str] = field(default_factory=list)  # labels of points not run (budget)


def measure(
    target_url: str,
    model: str,
    tokens: PromptTokens,
    plan: MeasurementPlan,
    *,
    block_size: int,
    budget_s: float | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    cost: PointCost | None = None,
) -> Measurement:
    """Run ``plan`` against the server at ``target_url`` (serving ``model``); see the module doc.

    ``block_size`` is the server's KV block size; it is recorded, and prompts are not required
    to be multiples of it (a unique prompt never hits the prefix cache whatever its length).
    ``progress(done, total, label)`` is called once before the first point (``done=0``) and
    after each point. Raises RuntimeError when the warm-up requests fail (no usable server).
    Blocking; from async code use :func:`measure_async`.
    """
    return asyncio.run(
        measure_async(
            target_url,
            model,
            tokens,
            plan,
            block_size=block_size,
            budget_s=budget_s,
            progress=progress,
            cost=cost,
        )
    )


async def measure_async(
    target_url: str,
    model: str,
    tokens: PromptTokens,
    plan: MeasurementPlan,
    *,
    block_size: int,
    budget_s: float | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    cost: PointCost | None = None,
) -> Measurement:
    """:func:`measure` as a coroutine."""
    if block_size < 1:
        raise ValueError(f"block_size: must be >= 1, got {block_size}")
    if budget_s is not None and not budget_s > 0:
        raise ValueError(f"budget_s: must be > 0 or None, got {budget_s}")
    runner = _Runner(target_url, model, tokens, plan, cost or PointCost())
    started_at = datetime.now(UTC)
    start = time.perf_counter()
    points = plan.points()
    total = len(points)
    measurement = Measurement(
        observations=[],
        raw=[],
        frontend_overhead_s=None,
        started_at=started_at,
        duration_s=0.0,
        run_id=runner.run_id,
    )
    limits = httpx.Limits(max_connections=max(plan.capped_batches()) + 8)
    async with httpx.AsyncClient(limits=limits) as client:
        runner.client = client
        if progress is not None:
            progress(0, total, "warm-up")
        await runner.warm_up()
        # Ratio of actual to estimated seconds so far, to estimate what is left.
        spent_s = estimated_s = 0.0
        for index, point in enumerate(points):
            per_rep_s = estimate_point_s(point, runner.cost)
            scale = spent_s / estimated_s if estimated_s > 0 else 1.0

            def over_budget(per_rep_s: float = per_rep_s, scale: float = scale) -> bool:
                if budget_s is None:
                    return False
                return time.perf_counter() - start + per_rep_s * scale > budget_s

            if over_budget():
                measurement.complete = False
                measurement.skipped = [p.label for p in points[index:]]
                break
            point_start = time.perf_counter()
            entry, observation, reps_run = await runner.run_point(index, point, over_budget)
            spent_s += time.perf_counter() - point_start
            estimated_s += per_rep_s * max(1, reps_run)
            entry["block_size"] = block_size
            measurement.raw.append(entry)
            if observation is not None:
                measurement.observations.append(observation)
            if progress is not None:
                progress(index + 1, total, point.label)
    measurement.duration_s = time.perf_counter() - start
    return measurement


class _Runner:
    """Sends a plan's requests; one instance per :func:`measure_async` call."""

    def __init__(
        self,
        target_url: str,
        model: str,
        tokens: PromptTokens,
        plan: MeasurementPlan,
        cost: PointCost,
    ) -> None:
        self.url = target_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.tokens = tokens
        self.plan = plan
        self.cost = cost
        self.run_id = secrets.randbits(62)
        self.client: httpx.AsyncClient | None = None
        self.shortest_ttft_s = math.inf

    @property
    def min_step_s(self) -> float:
        """The shortest believable step: a fraction of the shortest lone-prefill TTFT so far."""
        return 0.0 if math.isinf(self.shortest_ttft_s) else self.shortest_ttft_s / STALL_RATIO

    def prompt(self, point_index: int, repetition: int, request: int, length: int) -> list[int]:
        source = source_id(
            SourceNamespace.UNIQUE,
            MEASURE_SOURCE_TAG,
            self.run_id,
            point_index,
            repetition,
            request,
        )
        return self.tokens.stream(source, length)

    async def send(
        self,
        prompt: list[int],
        max_tokens: int,
        clock: Callable[[], float] = time.perf_counter,
    ) -> StreamResult:
        assert self.client is not None
        return await stream_completion(
            self.client,
            self.url,
            self.model,
            prompt,
            max_tokens,
            timeout_s=900.0,
            read_timeout_s=300.0,
            clock=clock,
        )

    async def warm_up(self) -> None:
        """A short prefill, a small decode batch, and a prefill of the largest length."""
        longest = max(self.plan.prefill_lengths)
        results = [await self.send(self.prompt(-1, 0, 0, 32), 4)]
        results += await asyncio.gather(
            *(self.send(self.prompt(-1, 1, i, 64), 8) for i in range(4))
        )
        results.append(await self.send(self.prompt(-1, 2, 0, longest), PREFILL_MAX_TOKENS))
        failed = [r for r in results if r.status is not RequestStatus.OK]
        if failed:
            raise RuntimeError(
                f"warm-up requests to {self.url} (model {self.model!r}) failed: "
                f"{failed[0].status.name}: {failed[0].error}"
            )

    async def run_point(
        self, index: int, point: Point, over_budget: Callable[[], bool]
    ) -> tuple[dict[str, Any], Observation | None, int]:
        """Run every repetition of ``point``; return its raw entry, observation, reps run."""
        values: list[float] = []
        errors: list[str] = []
        details: list[dict[str, Any]] = []
        windows: list[DecodeWindow] = []
        steps: list[MixedStep] = []
        reps_run = 0
        for repetition in range(self.plan.repetitions):
            if repetition and over_budget():
                errors.append(f"stopped after {repetition} repetitions: budget used")
                break
            reps_run += 1
            match point.kind:
                case "prefill":
                    result = await self.send(
                        self.prompt(index, repetition, 0, point.prompt_tokens), PREFILL_MAX_TOKENS
                    )
                    if not _ok(result, errors):
                        continue
                    values.append(ttft_s(result))
                    self.shortest_ttft_s = min(self.shortest_ttft_s, values[-1])
                    details.append({"cached_tokens": result.cached_tokens})
                case "decode":
                    results = await self.decode_batch(index, repetition, point)
                    if not all(_ok(r, errors) for r in results):
                        continue
                    window = decode_window(
                        results, point.context_tokens, min_step_s=self.min_step_s
                    )
                    if window is None:
                        errors.append(f"repetition {repetition}: no steady decode window")
                        continue
                    windows.append(window)
                    values.append(window.step_s)
                    details.append(
                        {
                            "num_steps": window.num_steps,
                            "decode_context_tokens": window.decode_context_tokens,
                            "request_step_s": robust_summary(window.per_request_step_s),
                        }
                    )
                case _:
                    decodes, prefill = await self.mixed_batch(index, repetition, point)
                    if not all(_ok(r, errors) for r in (*decodes, prefill)):
                        continue
                    step = mixed_step(
                        decodes, prefill, point.context_tokens, min_step_s=self.min_step_s
                    )
                    if step is None:
                        errors.append(
                            f"repetition {repetition}: the prefill did not land among decodes"
                        )
                        continue
                    steps.append(step)
                    values.append(step.step_s)
                    details.append(
                        {
                            "decode_context_tokens": step.decode_context_tokens,
                            "ttft_s": ttft_s(prefill),
                        }
                    )
        entry: dict[str, Any] = {
            "kind": point.kind,
            "params": point.params(),
            "values_s": values,
            "statistic": "median",
            "repetitions": details,
            "errors": errors,
        }
        observation: Observation | None = None
        if values:
            summary = robust_summary(values)
            entry.update(seconds=summary["median"], iqr_s=summary["iqr"])
            match point.kind:
                case "prefill":
                    observation = prefill_observation(point.prompt_tokens, values)
                case "decode":
                    observation = decode_observation(point.batch_size, windows)
                case _:
                    observation = mixed_observation(point.prompt_tokens, steps)
        return entry, observation, reps_run

    async def decode_batch(self, index: int, repetition: int, point: Point) -> list[StreamResult]:
        return list(
            await asyncio.gather(
                *(
                    self.send(
                        self.prompt(index, repetition, i, point.context_tokens), point.max_tokens
                    )
                    for i in range(point.batch_size)
                )
            )
        )

    async def mixed_batch(
        self, index: int, repetition: int, point: Point
    ) -> tuple[list[StreamResult], StreamResult]:
        # stream_completion reads the clock once when sending and once per arrival of bytes, so
        # a clock that counts its calls tells us when each stream's first token has arrived.
        clocks = [_FirstArrivalClock() for _ in range(point.batch_size)]
        tasks = [
            asyncio.create_task(
                self.send(
                    self.prompt(index, repetition, i, point.context_tokens),
                    point.max_tokens,
                    clock=clocks[i],
                )
            )
            for i in range(point.batch_size)
        ]
        await asyncio.gather(*(c.arrived.wait() for c in clocks))
        prefill = await self.send(
            self.prompt(index, repetition, point.batch_size, point.prompt_tokens),
            PREFILL_MAX_TOKENS,
        )
        decodes = list(await asyncio.gather(*tasks))
        return decodes, prefill


class _FirstArrivalClock:
    """``time.perf_counter`` that sets ``arrived`` on its second call (the first bytes)."""

    def __init__(self) -> None:
        self.calls = 0
        self.arrived = asyncio.Event()

    def __call__(self) -> float:
        self.calls += 1
        if self.calls >= 2:
            self.arrived.set()
        return time.perf_counter()


def _ok(result: StreamResult, errors: list[str]) -> bool:
    if result.status is RequestStatus.OK and result.token_times_s:
        return True
    errors.append(f"{result.status.name}: {result.error or 'no tokens'}")
    return False
