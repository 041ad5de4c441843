"""Open-loop replay of a workload against a real server, recorded in the simulator's schema.

Each request without a parent is sent at its workload arrival time, whatever the server is doing
(open loop); a later turn of a session is sent its think time after the previous answer arrived,
carrying that answer's real token ids (see :mod:`live.tokens`), exactly as the simulator releases
it. A concurrency cap applies only if asked for (``max_concurrency``: a closed loop of that many
users, each pausing ``think_time_s`` after an answer before its slot takes the next request, as
the simulator does); a capped request's record starts when it is sent, as in ``vllm bench``.

Every request ends with a record, appended to ``records.jsonl`` as soon as it completes, so an
interrupted run (Ctrl-C, a dead server) keeps everything that finished and writes the rest with a
status: in-flight requests ``cancelled`` with what they had received, unsent ones ``cancelled``
with the reason. The load generator measures its own lag (send time − scheduled time) and warns
when it is large enough to distort the offered load.

Such a run can be resumed from its records file (:func:`read_records`, then ``replay(...,
resume_from=...)``): requests that ended ``ok`` or ``rejected`` keep their records and are not sent
again; the others (``cancelled``, ``error``, ``timeout``, or no record at all) are sent again.
Reading and rewriting the records file is :mod:`live.records_file`'s work; its public names are
re-exported here.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import warnings
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import IO, Any, Literal

import httpx
import numpy as np

from live.client import StreamResult, base_url, stream_completion
from live.records_file import (
    KEPT_STATUSES,
    RecordsFile,
    RecordsFileError,
    RecordsFileWarning,
    read_records,
    requests_digest,
    rewrite_records,
)
from live.tokens import PromptTokens
from sim.engine.request import Record, Request, RequestStatus, later_turns, record_of


class LoadGeneratorLagWarning(UserWarning):
    """The client sent requests late: the offered load was not the workload's."""


@dataclass(frozen=True)
class Target:
    """Where to send requests: an OpenAI-compatible base URL and the served model name."""

    base_url: str
    model: str
    endpoint: Literal["completions", "chat"] = "completions"

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_url", base_url(self.base_url))


class ReplayError(RuntimeError):
    """The replay could not start: the warm-up requests failed (wrong URL, model, server down)."""


@dataclass(frozen=True)
class ReplayOptions:
    """Knobs of a replay (all optional)."""

    max_concurrency: int | None = None
    think_time_s: float = 0.0  # a capped slot's pause after an answer
    timeout_s: float = 600.0
    # vLLM sends nothing until the first token, so under overload a short read timeout would
    # cut off queued requests (and make vLLM abort them): by default it is the whole deadline.
    read_timeout_s: float = 600.0
    warmup_requests: int = 2
    lag_warning_s: float = 0.010  # on the p99 of send lag
    abort_after_connection_errors: int = 5
    record_token_times: bool = False


@dataclass
class ReplayResult:
    """What a replay recorded; ``records`` are in request-id order and complete."""

    records: list[Record]
    lag_s: np.ndarray
    itl_s: np.ndarray
    started_at_unix_s: float
    duration_s: float
    interrupted: bool = False
    reason: str = ""
    resumed: bool = False  # resumed an earlier run (replay(..., resume_from=...))
    num_reused: int = 0  # records kept from the earlier run
    num_sent: int = 0  # requests this run sent


def _record_from(request: Request, result: StreamResult, t0: float, arrival_s: float) -> Record:
    """A record in the shared schema; times relative to the start of the measured run.

    ``output_tokens`` is what the server produced for a request that was sent (the planned
    length only for requests never sent).
    """
    record = Record(request.request_id, arrival_s, request.prompt_tokens, request.output_tokens)
    record.priority = request.priority
    if result.token_times_s:
        record.first_token_s = result.token_times_s[0] - t0
    record.finish_s = result.finish_s - t0 if math.isfinite(result.finish_s) else math.nan
    # The tokens that really arrived (usage's count where the stream carried no token ids).
    produced = result.num_output_tokens
    if not result.output_token_ids and result.completion_tokens is not None:
        produced = result.completion_tokens
    record.output_tokens = produced
    record.cached_tokens = result.cached_tokens or 0
    record.status = result.status
    record.error = result.error
    record.token_times_s = [t - t0 for t in result.token_times_s]
    return record


class _Replay:
    def __init__(
        self,
        requests: Sequence[Request],
        target: Target,
        tokens: PromptTokens,
        options: ReplayOptions,
        sink: IO[str] | None,
        clock: Callable[[], float],
        kept: dict[int, Record] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.requests = sorted(requests, key=lambda r: r.request_id)
        self.kept = dict(kept or {})
        self.pending = [r for r in self.requests if r.request_id not in self.kept]
        self.target = target
        self.tokens = tokens
        self.options = options
        self.sink = sink
        self.clock = clock
        self.progress = progress
        self.records: dict[int, Record] = dict(self.kept)
        self.lags: list[float] = []
        self.outputs: dict[int, list[int]] = {}  # output source id -> generated token ids
        self.children = later_turns(self.requests)
        self.tasks: set[asyncio.Task[None]] = set()
        self.done = asyncio.Event()
        self.connection_errors = 0
        self.abort_reason = ""
        self.t0 = 0.0
        self.started = math.nan  # clock() when the measured part began
        self.started_unix = math.nan
        self.semaphore = (
            asyncio.Semaphore(options.max_concurrency) if options.max_concurrency else None
        )

    def _write(self, record: Record) -> None:
        self.records[record.request_id] = record
        if self.sink is not None:
            row = record.as_row()
            if self.options.record_token_times:
                row["token_times_s"] = record.token_times_s or []
            self.sink.write(json.dumps(row, allow_nan=True) + "\n")
            self.sink.flush()
        if self.progress is not None:
            self.progress(len(self.records), len(self.requests))
        if len(self.records) == len(self.requests):
            self.done.set()

    async def _send(self, client: httpx.AsyncClient, request: Request, due: float) -> None:
        # Lag is the load generator's own delay, measured before any concurrency cap waits.
        self.lags.append(self.clock() - due)
        partial: list[StreamResult] = []
        try:
            prompt = self.tokens.prompt_ids(request, self.outputs)
            extra = {"priority": request.priority} if request.priority else None

            async def call() -> StreamResult:
                return await stream_completion(
                    client,
                    self.target.base_url,
                    self.target.model,
                    prompt,
                    request.output_tokens,
                    endpoint=self.target.endpoint,
                    timeout_s=self.options.timeout_s,
                    read_timeout_s=self.options.read_timeout_s,
                    clock=self.clock,
                    extra_body=extra,
                    on_partial=partial.append,
                )

            if self.semaphore is None:
                result = await call()
            else:
                await self.semaphore.acquire()
                pause_s = 0.0  # cancelled or failed: the slot frees at once
                try:
                    result = await call()
                    pause_s = self.options.think_time_s  # answered: after the user's pause
                finally:
                    self._free_slot(pause_s)
        except asyncio.CancelledError:
            if partial:
                result = partial[-1]
                self._write(_record_from(request, result, self.t0, result.send_s - self.t0))
            raise
        except Exception as exc:  # a bug or a full disk must not hang the run: record it
            record = record_of(request, math.nan)
            record.status = RequestStatus.ERROR
            record.error = f"unexpected {type(exc).__name__}: {exc}"
            if request.request_id not in self.records:
                self._write(record)
            self._release_children(client, request)
            return
        self._write(_record_from(request, result, self.t0, result.send_s - self.t0))
        self._after(client, request, result)

    def _free_slot(self, after_s: float) -> None:
        assert self.semaphore is not None
        if after_s > 0:
            asyncio.get_running_loop().call_later(after_s, self.semaphore.release)
        else:
            self.semaphore.release()

    def _after(self, client: httpx.AsyncClient, request: Request, result: StreamResult) -> None:
        if result.output_token_ids:
            self.outputs[request.output_source_id] = result.output_token_ids
        if result.status == RequestStatus.ERROR and result.error.startswith("connection"):
            self.connection_errors += 1
            limit = self.options.abort_after_connection_errors
            if limit and self.connection_errors >= limit and not self.abort_reason:
                self.abort_reason = f"server unreachable after {limit} connection errors"
                self.done.set()
        else:
            self.connection_errors = 0
        self._release_children(client, request)

    def _release_children(self, client: httpx.AsyncClient, request: Request) -> None:
        """Later turns follow whatever happened to this one, as in the simulator."""
        for child in self.children.get(request.request_id, ()):
            if child.request_id not in self.kept:
                self._spawn(self._later_turn(client, child))

    async def _later_turn(self, client: httpx.AsyncClient, request: Request) -> None:
        await asyncio.sleep(request.think_time_s)
        await self._send(client, request, self.clock())

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        if self.abort_reason:
            coroutine.close()
            return
        task = asyncio.ensure_future(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def schedule_offset_s(self) -> float:
        """Workload time of the first request to send: 0, or later when resuming.

        Records are timed from ``t0 = start − offset``, so a resumed part keeps the workload's
        timeline and its first request is sent at once.
        """
        roots = [r.arrival_s for r in self.pending if r.parent_id < 0]
        return min(roots) if self.kept and roots else 0.0

    async def _dispatch(self, client: httpx.AsyncClient) -> None:
        # A later turn whose earlier turn is kept from the resumed run starts at once (after its
        # think time); the earlier answer's tokens are not in the records, so its prompt has the
        # planned stream in their place (see PromptTokens.prompt_ids).
        for request in self.pending:
            if request.parent_id >= 0 and request.parent_id in self.kept:
                self._spawn(self._later_turn(client, request))
        roots = sorted((r for r in self.pending if r.parent_id < 0), key=lambda r: r.arrival_s)
        for request in roots:
            if self.abort_reason:
                return
            due = self.t0 + request.arrival_s
            delay = due - self.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            self._spawn(self._send(client, request, due))

    async def _warm_up(self, client: httpx.AsyncClient) -> None:
        """A few small requests before the clock starts: the first ones after start-up are slow."""
        for i in range(self.options.warmup_requests):
            prompt = self.tokens.stream(-(i + 1), 32)
            result = await stream_completion(
                client,
                self.target.base_url,
                self.target.model,
                prompt,
                8,
                endpoint=self.target.endpoint,
                timeout_s=self.options.timeout_s,
                read_timeout_s=self.options.read_timeout_s,
                clock=self.clock,
            )
            if result.status != RequestStatus.OK:
                raise ReplayError(
                    f"warm-up request to {self.target.base_url} (model {self.target.model!r}) "
                    f"failed: {result.error}"
                )

    async def run(self, after_warmup: Callable[[], None] | None = None) -> None:
        # vLLM closes idle connections after 5 s; reusing one just then fails the request.
        limits = httpx.Limits(
            max_connections=None, max_keepalive_connections=64, keepalive_expiry=4.0
        )
        async with httpx.AsyncClient(limits=limits, timeout=None) as client:
            await self._warm_up(client)
            if after_warmup is not None:
                after_warmup()
            self.started = self.clock()
            self.t0 = self.started - self.schedule_offset_s()
            self.started_unix = time.time()
            if not self.pending:
                return
            dispatcher = asyncio.ensure_future(self._dispatch(client))
            try:
                await self.done.wait()
            finally:
                dispatcher.cancel()
                for task in list(self.tasks):
                    task.cancel()
                await asyncio.gather(dispatcher, *self.tasks, return_exceptions=True)

    def close(self, reason: str) -> None:
        """Give every request that has no record one, with status cancelled."""
        for request in self.requests:
            if request.request_id not in self.records:
                record = record_of(request)
                record.status = RequestStatus.CANCELLED
                record.error = f"not sent: {reason}"
                self._write(record)


async def replay(
    requests: Sequence[Request],
    target: Target,
    tokens: PromptTokens,
    *,
    records_path: Path | None = None,
    options: ReplayOptions | None = None,
    after_warmup: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    resume_from: RecordsFile | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Send ``requests`` to ``target`` on their schedule and record every one of them.

    ``after_warmup`` runs once the warm-up requests are done, just before the measured part
    (e.g. to scrape ``/metrics``). Cancelling this coroutine (Ctrl-C) still writes every record.
    ``progress(done, total)`` is called as each request ends (records kept from an earlier run
    count as done).

    ``resume_from`` (see :func:`read_records`) resumes an interrupted run: records with a status
    in :data:`KEPT_STATUSES` are kept as they are and their requests not sent; every other
    request is sent again. ``records_path`` is first rewritten to hold only the kept records
    (one line per request id, whatever the earlier file held), then appended to as usual, so it
    ends with exactly one record per request and can itself be resumed. The remaining requests
    keep their open-loop schedule relative to each other, shifted so that the first of them is
    sent at once; their times are on the workload's timeline (a resumed record's ``arrival_s`` is
    its workload arrival time plus send lag). Their TTFT is measured under the load of the
    resumed part only: requests that completed earlier are not there to compete with them.
    """
    options = options or ReplayOptions()
    kept = resume_from.kept() if resume_from is not None else {}
    if records_path is not None and resume_from is not None:
        rewrite_records(records_path, [resume_from.lines_by_id[i] for i in sorted(kept)])
    sink = records_path.open("a", encoding="utf-8") if records_path is not None else None
    state = _Replay(requests, target, tokens, options, sink, clock, kept, progress)
    interrupted = False
    reason = ""
    try:
        await state.run(after_warmup)
    except asyncio.CancelledError:
        interrupted, reason = True, "run interrupted"
        raise
    finally:
        if state.abort_reason:
            interrupted, reason = True, state.abort_reason
        state.close(reason or "run ended")
        if sink is not None:
            sink.close()
    duration = clock() - state.started if math.isfinite(state.started) else 0.0
    lag = np.asarray(state.lags, dtype=np.float64)
    if lag.size and float(np.percentile(lag, 99)) > options.lag_warning_s:
        warnings.warn(
            f"load generator lag p99 {np.percentile(lag, 99) * 1e3:.1f} ms exceeds "
            f"{options.lag_warning_s * 1e3:.0f} ms: requests left late, the offered load was "
            "lower than the workload's (a busy client machine?)",
            LoadGeneratorLagWarning,
            stacklevel=2,
        )
    itl = [
        b - a
        for record in state.records.values()
        if record.status == RequestStatus.OK
        for a, b in pairwise(record.token_times_s or ())
    ]
    records = [state.records[r.request_id] for r in state.requests]
    return ReplayResult(
        records=records,
        lag_s=lag,
        itl_s=np.asarray(itl, dtype=np.float64),
        started_at_unix_s=state.started_unix,
        duration_s=duration,
        interrupted=interrupted,
        reason=reason,
        resumed=resume_from is not None,
        num_reused=len(kept),
        num_sent=len(state.lags),
    )


__all__ = [
    "KEPT_STATUSES",
    "LoadGeneratorLagWarning",
    "RecordsFile",
    "RecordsFileError",
    "RecordsFileWarning",
    "ReplayError",
    "ReplayOptions",
    "ReplayResult",
    "Target",
    "read_records",
    "replay",
    "requests_digest",
]
