"""Run a measurement plan against a live vLLM server: send its requests and time their streams.

:func:`measure` runs each point of a :class:`~calibration.measure_plan.MeasurementPlan` a few
times against a server (launched or existing, through :mod:`live.client`), takes a robust
statistic, and turns the point into an :class:`~calibration.observations.Observation` with
:mod:`calibration.measure_extract` (whose doc says what each kind's statistic is):

* **prefill** — one request with a fresh ``L``-token prompt (a new token stream per repetition,
  so the prefix cache never hits) and ``max_tokens=2``, sent to an otherwise idle server.
* **decode** — ``B`` requests sent at once, each with a fresh ``C``-token prompt.
* **mixed** — a decode batch of ``B`` at context ``C`` running; as soon as every request has its
  first token a fresh ``L``-token prompt is sent.

A per-request step time (or mixed gap) below the shortest lone-prefill TTFT so far divided by
:data:`~calibration.measure_extract.STALL_RATIO` is a burst of tokens delivered late after a
stall, and is left out.

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
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import numpy as np

from calibration.measure_extract import (
    STALL_RATIO,
    DecodeWindow,
    MixedStep,
    decode_observation,
    decode_window,
    held_back,
    mixed_observation,
    mixed_step,
    prefill_observation,
    robust_summary,
    ttft_s,
)
from calibration.measure_plan import (
    PREFILL_MAX_TOKENS,
    MeasurementPlan,
    Point,
    PointCost,
    estimate_point_s,
)
from calibration.observations import Observation
from live.client import StreamResult, stream_completion
from live.tokens import PromptTokens
from sim.engine.request import RequestStatus, SourceNamespace, source_id

#: The second value of every measurement source id: keeps them apart from workload sources.
MEASURE_SOURCE_TAG = -7


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
            repetitions = plan.repetitions
            if budget_s is not None:
                repetitions = repetitions_within(
                    budget_s - (time.perf_counter() - start),
                    [estimate_point_s(p, runner.cost) * scale for p in points[index:]],
                    plan.repetitions,
                )
            point_start = time.perf_counter()
            entry, observation, reps_run = await runner.run_point(
                index, point, over_budget, repetitions
            )
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


def repetitions_within(remaining_s: float, per_rep_s: Sequence[float], most: int) -> int:
    """Repetitions per point (1 … ``most``) that let every point left run within the budget.

    ``per_rep_s`` are the estimated seconds of one repetition of each point left, already scaled
    by how the points so far compared with their estimates. A server slower than the plan's
    costs assumed thus gets fewer repetitions of every point rather than the first points in
    full and the rest not at all (a decode grid never measured is extrapolated by the fit).
    """
    total = sum(per_rep_s)
    if total <= 0:
        return most
    return max(1, min(most, math.floor(remaining_s / total)))


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
        self, index: int, point: Point, over_budget: Callable[[], bool], repetitions: int
    ) -> tuple[dict[str, Any], Observation | None, int]:
        """Run ``repetitions`` of ``point``; return its raw entry, observation, reps run."""
        values: list[float] = []
        errors: list[str] = []
        details: list[dict[str, Any]] = []
        windows: list[DecodeWindow] = []
        steps: list[MixedStep] = []
        reps_run = 0
        for repetition in range(repetitions):
            if repetition and over_budget():
                errors.append(f"stopped after {repetition} repetitions: budget used")
                break
            reps_run += 1
            match point.kind:
                case "prefill":
                    result = await self.prefill(index, repetition, point)
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
                        why = held_back(results) or "no steady decode window"
                        errors.append(f"repetition {repetition}: {why}")
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
                        why = held_back(decodes) or "the prefill did not land among decodes"
                        errors.append(f"repetition {repetition}: {why}")
                        continue
                    steps.append(step)
                    values.append(step.step_s)
                    details.append(
                        {
                            "decode_context_tokens": step.decode_context_tokens,
                            "ttft_s": ttft_s(prefill),
                        }
                    )
        entry, observation = _point_result(point, values, errors, details, windows, steps)
        return entry, observation, reps_run

    async def prefill(self, index: int, repetition: int, point: Point) -> StreamResult:
        """A lone prefill; a cached one sends its prefix first, so that it is a cache hit."""
        cached = point.cached_tokens
        prompt = self.prompt(index, repetition, 0, point.prompt_tokens - cached)
        if cached:
            prefix = self.prompt(index, repetition, -1, cached)
            # One token past the prefix: its blocks are all full, so all of them are cached.
            await self.send([*prefix, *self.prompt(index, repetition, -2, 1)], 1)
            prompt = prefix + prompt
        return await self.send(prompt, PREFILL_MAX_TOKENS)

    def decode_prompt(self, index: int, repetition: int, request: int, point: Point) -> list[int]:
        """A decode point's prompt: its own tokens, after the batch's shared prefix if any."""
        shared = point.shared_prefix_tokens
        own = self.prompt(index, repetition, request, point.context_tokens - shared)
        if not shared:
            return own
        return self.prompt(index, repetition, -1, shared) + own

    async def decode_batch(self, index: int, repetition: int, point: Point) -> list[StreamResult]:
        if point.shared_prefix_tokens:
            # Cache the shared prefix first, as a system prompt is computed once and then hit:
            # every request of the batch then holds the same blocks for it.
            prefix = self.decode_prompt(index, repetition, -2, point)
            await self.send(prefix[: point.shared_prefix_tokens + 1], 1)
        return list(
            await asyncio.gather(
                *(
                    self.send(self.decode_prompt(index, repetition, i, point), point.max_tokens)
                    for i in range(point.batch_size)
                )
            )
        )

    async def mixed_batch(
        self, index: int, repetition: int, point: Point
    ) -> tuple[list[StreamResult], StreamResult]:
        # stream_completion reads the clock once when sending and once per arrival of bytes, so
        # a clock that counts its calls tells us when each stream's first token has arrived.
        clocks = [ArrivalClock() for _ in range(point.batch_size)]
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


def _point_result(
    point: Point,
    values: list[float],
    errors: list[str],
    details: list[dict[str, Any]],
    windows: Sequence[DecodeWindow],
    steps: Sequence[MixedStep],
) -> tuple[dict[str, Any], Observation | None]:
    """A point's raw entry and observation (None when no repetition was valid)."""
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
                observation = prefill_observation(
                    point.prompt_tokens, values, _cached_tokens(point, details)
                )
            case "decode":
                observation = decode_observation(
                    point.batch_size, windows, point.shared_prefix_tokens
                )
            case _:
                observation = mixed_observation(point.prompt_tokens, steps)
    return entry, observation


class ArrivalClock:
    """``time.perf_counter`` for :func:`live.client.stream_completion`, which reads it once when
    it sends and once per arrival of bytes: sets ``arrived`` once ``arrivals`` of them came."""

    def __init__(self, arrivals: int = 1) -> None:
        self.calls = 0
        self.wanted = 1 + arrivals
        self.arrived = asyncio.Event()

    def __call__(self) -> float:
        self.calls += 1
        if self.calls >= self.wanted:
            self.arrived.set()
        return time.perf_counter()


def _cached_tokens(point: Point, details: Sequence[dict[str, Any]]) -> int:
    """What a prefill point had cached: the median the server reported, else the plan's."""
    reported = [d["cached_tokens"] for d in details if d.get("cached_tokens") is not None]
    if not point.cached_tokens or not reported:
        return point.cached_tokens
    return min(int(np.median(reported)), point.prompt_tokens - 1)


def _ok(result: StreamResult, errors: list[str]) -> bool:
    if result.status is RequestStatus.OK and result.token_times_s:
        return True
    errors.append(f"{result.status.name}: {result.error or 'no tokens'}")
    return False
