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

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from sim.latency import IterationTimeModel, decode_step_times
from sim.request import Record, Request, RequestStatus, block_keys, sequence_segments
from sim.scheduler import ContinuousBatchScheduler, Scheduler, Sequence, StepPlan

#: The most steps one fast-forward run plans ahead (then the scheduler plans a step again).
MAX_RUN_STEPS = 512


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
    end: int  # the last step of the run (lowered when an arrival cuts it short)
    started: int = 1
    completed: int = 0
    # Made when step 2 starts (many runs are cut short before): each request's computed
    # tokens before step 1, and request indices by those tokens modulo the block size.
    computed: list[int] = field(default_factory=list)
    by_residue: list[list[int]] | None = None


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
        self.pipeline_depth = scheduler.config.pipeline_parallel_size
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
        # Fast-forward needs the continuous scheduler, one step at a time and a deterministic
        # step time (a random one would draw its samples in another order).
        self.fast_forward = (
            scheduler.config.fast_forward
            and self.pipeline_depth == 1
            and isinstance(scheduler, ContinuousBatchScheduler)
            and not scheduler.config.record_token_times
            and getattr(latency_model, "deterministic", True)
        )
        self._run: _DecodeRun | None = None
        self._cut: simpy.Event | None = None
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
    ) -> None:
        """Accept a request now (or reject it) and wake the engine if it is idle.

        ``keys`` are the prompt's chained block keys when the caller (a router) already has them.
        ``exclusive``: no other request's sequence starts like this one's (see
        :attr:`sim.scheduler.Sequence.exclusive`), so its keys are not needed.
        ``hold_kv`` and ``remote_transfer_s`` are for disaggregated serving (see
        :class:`sim.scheduler.Sequence`): a remote sequence arrives with its first token.
        """
        record.replica_id = self.replica_id
        reason = self._rejection(request)
        if reason:
            record.status = RequestStatus.REJECTED
            record.error = reason
            self._on_finish(record)
            return
        exclusive = exclusive and self.kv.enable_prefix_caching
        if not self.kv.enable_prefix_caching or exclusive:
            keys = []
        elif keys is None:
            keys = block_keys(sequence_segments(request), self.kv.block_size, request.total_tokens)
        seq = Sequence(request, record, keys, hold_kv=hold_kv, exclusive=exclusive)
        if remote_transfer_s > 0:
            seq.num_generated = 1
            seq.remote_transfer_s = remote_transfer_s
            seq.on_kv_admitted = on_kv_admitted
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
            self.sync()
            self._run.end = self._run.started
            if self._cut is not None and not self._cut.triggered:
                self._cut.succeed()
        elif self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    def _rejection(self, request: Request) -> str:
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
        while True:
            plan = scheduler.schedule(env.now)
            if plan is None:
                yield from self._idle()
                continue
            # A step that only preempted runs no model (vLLM skips execution): it takes no time.
            duration = step_time(plan.batch) if plan.scheduled else 0.0
            self.num_steps += 1
            self.busy_s += duration
            run = self._decode_run(plan, duration) if self.fast_forward else None
            if run is None:
                yield env.timeout(duration)
                self._completed(plan, env.now)
            else:
                yield from self._fast_forward(run)

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

    def _completed(self, plan: StepPlan, now: float) -> None:
        self.prompt_tokens_computed += plan.batch.num_prefill_tokens
        self.output_tokens_generated += plan.batch.num_sampled - len(plan.padding)
        for seq in self.scheduler.complete(plan, now):
            self._on_finish(seq.record)

    # -- fast-forward -------------------------------------------------------------------------
    def _decode_run(self, plan: StepPlan, duration: float) -> _DecodeRun | None:
        """The run of pure-decode steps that starts with ``plan``, or None if it is not one
        (or would be a single step)."""
        batch = plan.batch
        scheduler = self.scheduler
        num_seqs = batch.num_decode_seqs
        if (
            plan.preempted
            or batch.num_prefill_seqs
            or num_seqs != scheduler.num_running
            or (scheduler.num_waiting and num_seqs < scheduler.config.max_num_seqs)
        ):
            # Not every running request decodes, or a waiting one could be admitted later
            # (with a full batch nothing is admitted until a request finishes).
            return None
        seqs = [seq for seq, _ in plan.scheduled]
        # Step j produces each request's (num_generated + j)-th token: the first finish ends it.
        steps = min(MAX_RUN_STEPS, min(s.request.output_tokens - s.num_generated for s in seqs))
        if steps < 2:
            return None
        kv = self.kv
        block_size = kv.block_size
        free = kv.num_free_blocks
        # Over steps 2..n a request opens at most (n - 2) // block_size + 1 blocks.
        if num_seqs * ((steps - 2) // block_size + 1) > free:
            steps = self._steps_with_room(seqs, steps, free)
            if steps < 2:
                return None
        contexts = batch.decode_context_tokens + num_seqs * np.arange(1, steps, dtype=np.int64)
        durations = np.empty(steps, dtype=np.float64)
        durations[0] = duration
        durations[1:] = decode_step_times(self.latency_model, num_seqs, contexts)
        # np.cumsum adds left to right, as the step-by-step clock does: the same floats.
        times = np.cumsum(np.concatenate(([self.env.now], durations)))
        return _DecodeRun(plan, seqs, times.tolist(), durations.tolist(), end=steps)

    def _steps_with_room(self, seqs: list[Sequence], steps: int, free: int) -> int:
        """The most steps (up to ``steps``) whose new blocks fit in ``free`` blocks."""
        kv = self.kv
        block_size = kv.block_size
        computed = np.fromiter((s.num_computed_tokens for s in seqs), np.int64, len(seqs))
        held = np.fromiter((len(kv.blocks_of(s.request_id)) for s in seqs), np.int64, len(seqs))

        def blocks_needed(last_step: int) -> int:
            """New blocks that steps 2..last_step allocate (step 1's are held already)."""
            needed = -(-(computed + last_step) // block_size) - held
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
            self._cut = env.event()
            # Sterbenz: the difference is exact, so the event lands on times[end] itself.
            done = env.timeout(max(0.0, run.times[run.end] - env.now))
            yield done | self._cut
            if done.processed:  # (a timeout is "triggered" from the start)
                break
        self._cut = None
        end = run.end
        self._sync_run(run, run.times[end])
        self._run = None
        scheduler = self.scheduler
        assert isinstance(scheduler, ContinuousBatchScheduler)
        finished = scheduler.complete_run(run.seqs, run.times, end)
        self.output_tokens_generated += len(run.seqs)  # the last step's
        for seq in finished:
            self._on_finish(seq.record)

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
        while run.started < run.end and times[run.started] <= now:
            step = run.started + 1
            if run.by_residue is None:
                run.computed = [seq.num_computed_tokens for seq in seqs]
                run.by_residue = [[] for _ in range(block_size)]
                for index, tokens in enumerate(run.computed):
                    run.by_residue[tokens % block_size].append(index)
            computed = run.computed
            by_residue = run.by_residue
            # Step j takes request i to computed[i] + j tokens: it needs a new block when that
            # is one past a block boundary, and registers a block when it fills one. Every
            # other step takes the allocation's fast path, which changes nothing.
            fills = by_residue[-step % block_size]
            opens = by_residue[(1 - step) % block_size]
            indices = sorted(fills + opens) if block_size > 1 else fills
            for index in indices:
                seq = seqs[index]
                allocated = kv.allocate_slots(
                    seq.request_id, seq.keys, computed[index] + step - 1, 1
                )
                assert allocated, "a fast-forward run outgrew the free blocks"
            run.started = step
            self.num_steps += 1
            self.num_fast_forwarded_steps += 1
            self.busy_s += run.durations[step - 1]
        last_complete = min(run.end - 1, run.started)
        while run.completed < last_complete and times[run.completed + 1] <= now:
            run.completed += 1
            self.output_tokens_generated += len(seqs)

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
