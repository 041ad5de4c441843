"""One vLLM-like replica as a SimPy process: plan a step → ``timeout(step_time)`` → apply it.

One event per engine step, never one per token. An idle engine sleeps until a request arrives
(or, for dynamic batching, until its batching window closes).

Fast-forward: when a step is pure decode — every running request decodes, nothing is waiting
that could be admitted, nothing was preempted — the steps after it are predictable until the
first request finishes or the KV cache runs out: the same requests, each one token further,
each step's time from the same model. Such a run is advanced as one event. Nothing outside the
engine may see the difference: whoever reads the replica (a router, the sampler, the
autoscaler) calls :meth:`Replica.sync` first, which applies the block allocations of every step
started by now and the counters of every step finished by now, exactly as the step-by-step
engine would have; an arrival or a freed block cuts the run short after the step in progress.
``tests/test_fast_forward.py`` holds both modes to the same records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from sim.engine.latency import IterationTimeModel, decode_step_times
from sim.engine.request import Record, Request, RequestStatus, block_keys, sequence_segments
from sim.engine.scheduler import ContinuousBatchScheduler, Scheduler
from sim.engine.sequence import Sequence, StepPlan

#: The most steps one fast-forward run lasts (then the scheduler plans a step again).
MAX_RUN_STEPS = 4096
#: Steps a run computes the times of at first; it doubles them while it goes uncut (most runs
#: are cut short by an arrival, and a step time not needed is a step time wasted; but each
#: doubling is one more event, dearer than a few step times: 16 ran ~2% faster than 8 on the
#: default scenario, side by side).
FIRST_RUN_STEPS = 16
NO_INDICES: list[int] = []


@dataclass(slots=True, eq=False)
class _DecodeRun:
    """Consecutive pure-decode steps of the same requests, advanced as one event.

    Step ``j`` (1-based) runs from ``times[j - 1]`` to ``times[j]``; step 1 is the plan the
    scheduler made. ``started`` steps have had their blocks allocated, ``completed`` steps
    their token counters applied; the requests' own counters are applied at the end.
    """

    plan: StepPlan
    seqs: list[Sequence]
    times: list[float]
    durations: list[float]
    end: int  # the last step planned so far (lowered when an arrival cuts the run short)
    limit: int  # the last step it may reach: a request finishes, or the free blocks run out
    context: int  # tokens step 2 attends to (each later step: one more per request)
    shared: int  # of those, in blocks other requests hold too (the same in every step)
    started: int = 1
    completed: int = 0
    cut: bool = False
    # Made when step 2 starts (many runs are cut short before): each request's tokens after
    # step 1 minus one, and request indices by those numbers modulo the block size (all of
    # them for new blocks; only those with keys for blocks to register).
    computed: list[int] = field(default_factory=list)
    opens_by_residue: dict[int, list[int]] | None = None
    fills_by_residue: dict[int, list[int]] = field(default_factory=dict)
    anonymous_by_residue: dict[int, list[int]] = field(default_factory=dict)  # request ids


class Replica:
    """An engine: a scheduler, its KV cache and an iteration-time model, driven by SimPy.

    Requests that can never run are rejected on arrival with a status, as vLLM rejects them:
    prompt + output longer than ``max_model_len``, or more KV blocks than the whole cache holds.
    """

    def __init__(
        self,
        env: simpy.Environment,
        replica_id: int,
        scheduler: Scheduler,
        latency_model: IterationTimeModel,
        *,
        max_model_len: int,
        on_finish: Callable[[Record], None],
    ) -> None:
        self.env = env
        self.pipeline_depth = scheduler.options.pipeline_parallel_size
        self.replica_id = replica_id
        self.scheduler = scheduler
        self.kv = scheduler.kv
        self.latency_model = latency_model
        self.max_model_len = max_model_len
        self._on_finish = on_finish
        self._wakeup: simpy.Event | None = None
        self.num_steps = 0
        self.busy_s = 0.0
        self.prompt_tokens_computed = 0
        self.output_tokens_generated = 0
        self.num_fast_forwarded_steps = 0  # steps advanced inside a run, without an event
        # Host time each request received takes from a busy engine (a calibrated profile's
        # per_arrival_s): the step in progress takes that much longer (between steps, or with
        # pipeline stages, the next step).
        self.arrival_s = float(getattr(latency_model, "arrival_s", 0.0))
        # Fast-forward needs the continuous scheduler, one step at a time and a deterministic
        # step time (a random one would draw its samples in another order), which arrivals do
        # not lengthen.
        self.fast_forward = (
            scheduler.options.fast_forward
            and self.pipeline_depth == 1
            and isinstance(scheduler, ContinuousBatchScheduler)
            and not scheduler.options.record_token_times
            and getattr(latency_model, "deterministic", True)
            and self.arrival_s == 0.0
        )
        self._run: _DecodeRun | None = None
        self._wake_s = 0.0  # when the engine, in a fast-forward run, wakes next
        # Async scheduling (one engine loop only): requests that arrived while a step ran, with
        # their arrival times, not yet seen by the scheduler (see _admit_pending).
        self.async_scheduling = scheduler.options.async_scheduling and self.pipeline_depth == 1
        self._pending: list[tuple[float, Sequence]] = []
        self._busy = False  # a step (or run) is in progress
        # The front end's host thread (see delivered_s): seconds per streamed token, and when
        # it has sent every token handed to it so far.
        self.streamed_token_s = float(getattr(latency_model, "streamed_token_s", 0.0))
        self.frontend_free_s = 0.0
        self._arrival_debt_s = 0.0  # arrivals' host time owed by the next step
        self._step_end_s = math.nan  # while a step runs (not a run), when it ends
        self.process = env.process(
            self._engine_loop() if self.pipeline_depth == 1 else self._pipelined_loop()
        )

    def submit(
        self,
        request: Request,
        record: Record,
        *,
        keys: list[int] | None = None,
        hold_kv: bool = False,
        remote_transfer_s: float = 0.0,
        on_kv_admitted: Callable[[Sequence, float], None] | None = None,
        exclusive: bool = False,
        keyed_blocks: int = 0,
    ) -> None:
        """Accept a request now (or reject it) and wake the engine if it is idle.

        ``keys`` are the prompt's chained block keys as the fleet decided them (empty when the
        request caches nothing); ``exclusive``: no other request's sequence starts like this
        one's (see :attr:`sim.engine.sequence.Sequence.exclusive`); ``keyed_blocks``: only its
        first blocks can be shared, and ``keys`` stop there (``Sequence.keyed_blocks``). A
        caller without a fleet
        leaves ``keys`` None and the replica computes them from its own cache's settings.
        ``hold_kv`` and ``remote_transfer_s`` are for disaggregated serving (see
        :class:`sim.engine.sequence.Sequence`): a remote sequence arrives with its first token.
        """
        record.replica_id = self.replica_id
        if self.arrival_s > 0.0 and not self.sleeping:
            self._charge_arrival()
        reason = self.rejection(request)
        if reason:
            record.status = RequestStatus.REJECTED
            record.error = reason
            self._on_finish(record)
            return
        if keys is None:
            caching = self.kv.enable_prefix_caching
            exclusive = exclusive and caching
            keys = []
            if caching and not exclusive:
                keys = block_keys(
                    sequence_segments(request), self.kv.block_size, request.total_tokens
                )
        seq = Sequence(
            request, record, keys, hold_kv=hold_kv, exclusive=exclusive, keyed_blocks=keyed_blocks
        )
        if remote_transfer_s > 0:
            seq.num_generated = 1
            seq.remote_transfer_s = remote_transfer_s
            seq.on_kv_admitted = on_kv_admitted
        if self.async_scheduling and self._busy:
            # The next step was scheduled when the current one started: this request waits for
            # the one after it.
            self._pending.append((self.env.now, seq))
            if self._run is not None:
                self._cut_run(1)
            return
        self.scheduler.add(seq)
        self._wake()

    def release_kv(self, request_id: int) -> None:
        """Free a finished request's held blocks (its KV has been sent) and wake the engine."""
        self.sync()
        self.kv.free(request_id)
        self._wake()

    def _wake(self) -> None:
        if self._run is not None:
            # Something changed the scheduler's input: plan again after the step in progress.
            self._cut_run(0)
        elif self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    def _cut_run(self, steps_after: int) -> None:
        """End the fast-forward run ``steps_after`` steps after the one in progress (never
        later than where it already ends)."""
        run = self._run
        assert run is not None
        self.sync()
        end = min(run.started + steps_after, run.limit)
        if end > run.end:
            if run.cut:
                return  # already cut earlier than this
            self._plan_steps(run, end - run.end)
        run.end = min(run.end, end) if run.cut else end
        run.cut = True
        self._wake_at_run_end(run)

    def _wake_at_run_end(self, run: _DecodeRun) -> None:
        """Make the engine, waiting in :meth:`_fast_forward`, wake at the end of ``run`` as a cut
        left it. What an interrupt would do (take the engine off the timeout it waits on, and
        wait for the new end), without an exception thrown into the engine at every arrival:
        the timeout is swapped for one at the new end."""
        wake_s = run.times[run.end]
        if wake_s == self._wake_s:
            return
        # Sterbenz: the difference is exact, so the event lands on times[end] itself.
        self._resume_at(wake_s)
        self._wake_s = wake_s

    def _resume_at(self, wake_s: float) -> None:
        """Move the timeout the engine waits on (a step, or a fast-forward run) to ``wake_s``."""
        process = self.process
        process.target.callbacks.remove(process._resume)
        wake = self.env.timeout(max(0.0, wake_s - self.env.now))
        wake.callbacks.append(process._resume)
        process._target = wake

    def _admit_pending(self, last_start_s: float, everything: bool) -> None:
        """Give the scheduler the pending requests that arrived by ``last_start_s`` (the start
        of the step that just ended: the next step was scheduled then), or all of them."""
        pending = self._pending
        count = len(pending) if everything else 0
        if not everything:
            while count < len(pending) and pending[count][0] <= last_start_s:
                count += 1
        for _, seq in pending[:count]:
            self.scheduler.add(seq)
        del pending[:count]

    def rejection(self, request: Request) -> str:
        """Why this replica cannot ever serve ``request`` (longer than its context, or more KV
        blocks than its whole cache); "" when it can."""
        if request.total_tokens > self.max_model_len:
            return (
                f"prompt ({request.prompt_tokens}) + output ({request.output_tokens}) tokens "
                f"exceed max_model_len={self.max_model_len}"
            )
        needed = self.kv.blocks_needed(request.total_tokens)
        if needed > self.kv.num_blocks:
            return (
                f"needs {needed} KV blocks but the cache has {self.kv.num_blocks} "
                f"({self.kv.num_blocks * self.kv.block_size} tokens)"
            )
        return ""

    def _engine_loop(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        scheduler = self.scheduler
        step_time = self.latency_model.step_time
        last_start = env.now
        while True:
            if self._pending:
                self._admit_pending(last_start, everything=False)
            plan = scheduler.schedule(env.now)
            if plan is None and self._pending:
                # Nothing to run: the engine schedules what arrived right away.
                self._admit_pending(last_start, everything=True)
                plan = scheduler.schedule(env.now)
            if plan is None:
                self._busy = False
                yield from self._idle()
                continue
            self._busy = self.async_scheduling
            # A step that only preempted runs no model (vLLM skips execution): it takes no time.
            duration = step_time(plan.batch) if plan.scheduled else 0.0
            if self._arrival_debt_s > 0.0 and plan.scheduled:
                duration += self._arrival_debt_s
                self._arrival_debt_s = 0.0
            self.num_steps += 1
            self.busy_s += duration
            last_start = env.now
            run = (
                self._decode_run(plan, duration)
                if self.fast_forward and not self._pending
                else None
            )
            if run is None:
                self._step_end_s = env.now + duration
                yield env.timeout(duration)
                self._step_end_s = math.nan
                self._completed(plan, env.now)
            else:
                yield from self._fast_forward(run)
                last_start = run.times[run.end - 1]

    @property
    def sleeping(self) -> bool:
        """Idle, and nothing has woken it yet: a request arriving now costs its own TTFT
        only (once woken, the next arrivals cost its steps)."""
        return self._wakeup is not None and not self._wakeup.triggered

    def _charge_arrival(self) -> None:
        """A request reached a busy engine: the step in progress ends ``arrival_s`` later (the
        engine waits on a timeout at the new end instead), or the next step owes it."""
        if math.isnan(self._step_end_s):
            self._arrival_debt_s += self.arrival_s
            return
        self._step_end_s += self.arrival_s
        self.busy_s += self.arrival_s
        self._resume_at(self._step_end_s)

    def _idle(self) -> Generator[simpy.Event, Any, None]:
        """Sleep until a request arrives, a step finishes, or the scheduler's own wake time."""
        env = self.env
        self._wakeup = env.event()
        wake_at = self.scheduler.wake_time(env.now)
        if wake_at is None:
            yield self._wakeup
        else:
            yield self._wakeup | env.timeout(max(0.0, wake_at - env.now))
        self._wakeup = None

    def delivered_s(self, now: float, tokens: int) -> float:
        """When the ``tokens`` a step ending at ``now`` produced reach their clients.

        One front-end thread streams a replica's tokens (vLLM's API server: detokenize, frame,
        send), ``streamed_token_s`` each, a step's tokens after those of earlier steps: under
        light load they leave ``tokens * streamed_token_s`` after the step, and when tokens come
        faster than it streams them, the lag grows. The engine does not wait for it (vLLM's
        engine core runs ahead of its API server). With ``streamed_token_s`` 0: ``now``."""
        cost = self.streamed_token_s
        if cost == 0.0 or tokens <= 0:
            return now
        start = now if now > self.frontend_free_s else self.frontend_free_s
        self.frontend_free_s = start + tokens * cost
        return self.frontend_free_s

    def _completed(self, plan: StepPlan, now: float) -> None:
        self.prompt_tokens_computed += plan.batch.num_prefill_tokens
        sampled = plan.batch.num_sampled - len(plan.padding)
        self.output_tokens_generated += sampled
        for seq in self.scheduler.complete(plan, self.delivered_s(now, sampled)):
            self._on_finish(seq.record)

    # -- fast-forward -------------------------------------------------------------------------
    def _decode_run(self, plan: StepPlan, duration: float) -> _DecodeRun | None:
        """The run of steps that starts with ``plan`` when every step after it is a pure decode
        of the same requests, or None if it is not one (or would be a single step).

        ``plan`` itself may finish prompts (an arrival's prefill beside the decodes): every row
        must produce a token in it, and every running request must be in it."""
        batch = plan.batch
        scheduler = self.scheduler
        rows = plan.scheduled
        num_seqs = len(rows)
        if (
            plan.preempted
            or batch.num_sampled != num_seqs
            or num_seqs != scheduler.num_running
            or (scheduler.num_waiting and num_seqs < scheduler.config.max_num_seqs)
        ):
            # A prompt chunk that is not its last, a running request left out, or a waiting
            # one that could be admitted later (with a full batch nothing is admitted until a
            # request finishes).
            return None
        # Step j produces each request's (num_generated + j)-th token: the first finish ends
        # the run. Step 2 attends to every request's tokens after step 1, plus its new one.
        steps = MAX_RUN_STEPS
        context = 0
        for seq, num_new in rows:
            left = seq.request.output_tokens - seq.num_generated
            if left < steps:
                steps = left
            context += seq.num_computed_tokens + num_new + 1
        if steps < 2:
            return None
        kv = self.kv
        free = kv.num_free_blocks
        # Over steps 2..n a request opens at most (n - 2) // block_size + 1 blocks.
        if num_seqs * ((steps - 2) // kv.block_size + 1) > free:
            steps = self._steps_with_room(rows, steps, free)
            if steps < 2:
                return None
        seqs = [seq for seq, _ in rows]
        now = self.env.now
        # The shared prefix stays as it is while no request comes or goes.
        shared = batch.shared_context_tokens
        run = _DecodeRun(plan, seqs, [now, now + duration], [duration], 1, steps, context, shared)
        self._plan_steps(run, FIRST_RUN_STEPS)
        return run

    def _plan_steps(self, run: _DecodeRun, count: int) -> None:
        """Compute the times of up to ``count`` more steps of ``run`` (not past its limit)."""
        last = min(run.limit, run.end + count)
        if last <= run.end:
            return
        num_seqs = len(run.seqs)
        # Step j attends to context + (j - 2) * num_seqs tokens.
        first_context = run.context + (run.end - 1) * num_seqs
        durations = decode_step_times(
            self.latency_model, num_seqs, first_context, last - run.end, run.shared
        )
        times = run.times
        now = times[-1]
        for duration in durations:  # one addition at a time, as the step-by-step clock
            now += duration
            times.append(now)
        run.durations.extend(durations)
        run.end = last

    def _steps_with_room(self, rows: list[tuple[Sequence, int]], steps: int, free: int) -> int:
        """The most steps (up to ``steps``) whose new blocks fit in ``free`` blocks."""
        kv = self.kv
        block_size = kv.block_size
        # Step j takes a request to base + j tokens (base: its tokens after step 1, minus one).
        base = np.fromiter((s.num_computed_tokens + n - 1 for s, n in rows), np.int64, len(rows))
        held = np.fromiter((kv.num_blocks_of(s.request_id) for s, _ in rows), np.int64, len(rows))

        def blocks_needed(last_step: int) -> int:
            """New blocks that steps 2..last_step allocate (step 1's are held already)."""
            needed = -(-(base + last_step) // block_size) - held
            return int(np.maximum(needed, 0).sum())

        if blocks_needed(steps) <= free:
            return steps
        low, high = 1, steps  # blocks_needed(low) <= free < blocks_needed(high)
        while high - low > 1:
            middle = (low + high) // 2
            if blocks_needed(middle) <= free:
                low = middle
            else:
                high = middle
        return low

    def _fast_forward(self, run: _DecodeRun) -> Generator[simpy.Event, Any, None]:
        """Wait out a run (or the part of it an arrival leaves), then apply it."""
        env = self.env
        self._run = run
        while True:
            # A cut moves this wake-up earlier (see _wake_at_run_end). Sterbenz: the difference
            # is exact, so the event lands on times[end] itself.
            self._wake_s = run.times[run.end]
            yield env.timeout(max(0.0, self._wake_s - env.now))
            if run.cut or run.end >= run.limit:
                break
            self._plan_steps(run, run.end)  # uncut so far: plan as many steps again
        end = run.end
        self._sync_run(run, run.times[end])
        self._run = None
        scheduler = self.scheduler
        assert isinstance(scheduler, ContinuousBatchScheduler)
        times = run.times
        if self.streamed_token_s:
            # Each step's tokens through the front end, one step at a time as step by step.
            # Step j (from 1) ends at times[j] with a token for every request of the run.
            times = [times[0]] + [self.delivered_s(t, len(run.seqs)) for t in times[1 : end + 1]]
        finished = scheduler.complete_run(run.plan.scheduled, times, end)
        self.output_tokens_generated += len(run.seqs)  # the last step's
        if end == 1:
            self.prompt_tokens_computed += run.plan.batch.num_prefill_tokens
        for seq in finished:
            self._on_finish(seq.record)

    @property
    def num_waiting(self) -> int:
        """Requests waiting to run: the scheduler's, and those async scheduling holds for the
        step after next (vLLM counts both as waiting)."""
        return self.scheduler.num_waiting + len(self._pending)

    def sync(self) -> None:
        """Bring a fast-forward run up to now: what a reader would see in step-by-step mode."""
        if self._run is not None:
            self._sync_run(self._run, self.env.now)

    def _sync_run(self, run: _DecodeRun, now: float) -> None:
        """Allocate the blocks of every step started by ``now``, and count the steps and the
        tokens of every step (but the run's last) finished by then."""
        times = run.times
        kv = self.kv
        block_size = kv.block_size
        seqs = run.seqs
        # Anonymous blocks of several steps, taken in one go when no block of the run has an
        # id (then nothing else takes blocks in between, so the same blocks leave the queue).
        gathered: list[int] = []
        while run.started < run.end and times[run.started] <= now:
            step = run.started + 1
            if run.opens_by_residue is None:
                self._index_run(run, block_size)
            assert run.opens_by_residue is not None
            computed = run.computed
            # Step j (from 2) takes request i to computed[i] + j tokens: it needs a new block
            # when that is one past a block boundary, and registers a block when it fills one
            # (if it has keys). Every other step takes the allocation's fast path, which
            # changes nothing. Anonymous requests' new blocks are taken in one go (which of
            # them gets which block does not matter: they have no ids).
            opens = run.opens_by_residue.get((1 - step) % block_size, NO_INDICES)
            fills = run.fills_by_residue.get(-step % block_size, NO_INDICES)
            anonymous = run.anonymous_by_residue.get((1 - step) % block_size, NO_INDICES)
            if anonymous:
                if run.opens_by_residue:
                    allocated = kv.add_anonymous_blocks(anonymous)
                    assert allocated, "a fast-forward run outgrew the free blocks"
                else:
                    gathered += anonymous
            if block_size == 1:
                indices = opens
            elif fills:
                indices = sorted(fills + opens)
            else:
                indices = opens
            for index in indices:
                seq = seqs[index]
                allocated = kv.allocate_slots(
                    seq.request_id, seq.keys, computed[index] + step - 1, 1, anonymous=seq.exclusive
                )
                assert allocated, "a fast-forward run outgrew the free blocks"
            run.started = step
            self.num_steps += 1
            self.num_fast_forwarded_steps += 1
            self.busy_s += run.durations[step - 1]
        if gathered:
            allocated = kv.add_anonymous_blocks(gathered)
            assert allocated, "a fast-forward run outgrew the free blocks"
        last_complete = min(run.end - 1, run.started)
        while run.completed < last_complete and times[run.completed + 1] <= now:
            run.completed += 1
            self.output_tokens_generated += len(seqs)
            if run.completed == 1:
                self.prompt_tokens_computed += run.plan.batch.num_prefill_tokens

    @staticmethod
    def _index_run(run: _DecodeRun, block_size: int) -> None:
        """Which requests open or fill a block at which step, by residue (see _DecodeRun)."""
        seqs = run.seqs
        run.computed = [seq.num_computed_tokens + n - 1 for seq, n in run.plan.scheduled]
        opens: dict[int, list[int]] = {}
        fills: dict[int, list[int]] = {}
        anonymous: dict[int, list[int]] = {}
        for index, tokens in enumerate(run.computed):
            residue = tokens % block_size
            seq = seqs[index]
            if seq.exclusive:
                anonymous.setdefault(residue, []).append(seq.request.request_id)
                continue
            opens.setdefault(residue, []).append(index)
            if seq.keys:
                fills.setdefault(residue, []).append(index)
        run.opens_by_residue, run.fills_by_residue = opens, fills
        run.anonymous_by_residue = anonymous

    def _pipelined_loop(self) -> Generator[simpy.Event, Any, None]:
        """Pipeline parallelism: up to ``pipeline_depth`` steps in flight, as vLLM keeps one
        batch per stage. A step takes ``step_time`` from first stage to sampled tokens; the
        first stage is free for the next batch after ``step_time / depth``. A request is in at
        most one step at a time."""
        env = self.env
        scheduler = self.scheduler
        step_time = self.latency_model.step_time
        depth = self.pipeline_depth
        self._in_flight = 0
        while True:
            plan = scheduler.schedule(env.now) if self._in_flight < depth else None
            if plan is None or not plan.scheduled:
                if plan is not None:
                    self.num_steps += 1  # a step that only preempted
                    continue
                yield from self._idle()
                continue
            duration = step_time(plan.batch)
            if self._arrival_debt_s > 0.0:
                duration += self._arrival_debt_s
                self._arrival_debt_s = 0.0
            self.num_steps += 1
            self.busy_s += duration / depth
            for seq, _ in plan.scheduled:
                seq.in_flight = True
            self._in_flight += 1
            env.process(self._finish_step(plan, duration))
            yield env.timeout(duration / depth)

    def _finish_step(self, plan: StepPlan, duration: float) -> Generator[simpy.Event, Any, None]:
        yield self.env.timeout(duration)
        for seq, _ in plan.scheduled:
            seq.in_flight = False
        self._in_flight -= 1
        self._completed(plan, self.env.now)
        self._wake()
