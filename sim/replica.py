"""One vLLM-like replica as a SimPy process: plan a step → ``timeout(step_time)`` → apply it.

One event per engine step, never one per token. An idle engine sleeps until a request arrives
(or, for dynamic batching, until its batching window closes).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

from sim.latency import IterationTimeModel
from sim.request import Record, Request, RequestStatus, block_keys, sequence_segments
from sim.scheduler import Scheduler, Sequence, StepPlan


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
    ) -> None:
        """Accept a request now (or reject it) and wake the engine if it is idle.

        ``keys`` are the prompt's chained block keys when the caller (a router) already has them.
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
        if not self.kv.enable_prefix_caching:
            keys = []
        elif keys is None:
            keys = block_keys(sequence_segments(request), self.kv.block_size, request.total_tokens)
        seq = Sequence(request, record, keys, hold_kv=hold_kv)
        if remote_transfer_s > 0:
            seq.num_generated = 1
            seq.remote_transfer_s = remote_transfer_s
            seq.on_kv_admitted = on_kv_admitted
        self.scheduler.add(seq)
        self._wake()

    def release_kv(self, request_id: int) -> None:
        """Free a finished request's held blocks (its KV has been sent) and wake the engine."""
        self.kv.free(request_id)
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.triggered:
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
            yield env.timeout(duration)
            self._completed(plan)

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

    def _completed(self, plan: StepPlan) -> None:
        self.prompt_tokens_computed += plan.batch.num_prefill_tokens
        self.output_tokens_generated += plan.batch.num_sampled - len(plan.padding)
        for seq in self.scheduler.complete(plan, self.env.now):
            self._on_finish(seq.record)

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
        self._completed(plan)
        self._wake()
