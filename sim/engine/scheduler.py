"""Engine schedulers: state in, :class:`StepPlan` out. No SimPy, no clock of their own.

:class:`ContinuousBatchScheduler` follows vLLM v1's scheduler. Each step has one token budget
(``max_num_batched_tokens``). Running requests are served first, in order: a decode takes one
token, an unfinished prefill takes its next chunk. When a running request cannot get KV blocks,
the most recently admitted running request is preempted (FCFS; under the priority policy the
lowest-priority, latest-arriving one): its blocks are freed, its computed tokens are lost except
for what stays in the prefix cache, and it goes back to the *front* of the waiting queue. If
nothing was preempted, waiting requests are admitted in policy order while the budget, the KV
cache and ``max_num_seqs`` allow. With chunked prefill off, a prompt's whole prefill must fit in
the remaining budget of one step.

The pre-continuous-batching policies, static and time-window batching, are in
:mod:`sim.engine.static_batch`.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence as Sequence_
from dataclasses import dataclass
from typing import Protocol

from sim.engine.kv_cache import KVCacheManager
from sim.engine.latency import BatchShape, prefill_chunk_pairs
from sim.engine.request import RequestStatus, block_keys, sequence_segments
from sim.engine.sequence import Policy, Sequence, StepPlan, WaitingQueue


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The engine knobs the scheduler obeys (vLLM names)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool = True
    policy: Policy = "fcfs"


@dataclass(frozen=True, slots=True)
class ReplicaOptions:
    """How the simulator runs one replica, apart from vLLM's scheduling knobs.

    The scheduler holds them because two are needed where it works: pipeline stages decide how
    many groups it deals requests into, and token times are recorded where tokens are emitted.
    The replica's engine loop reads them from its scheduler.
    """

    # Pipeline stages: a replica keeps one step per stage in flight (continuous batching only).
    pipeline_parallel_size: int = 1
    # Every token's time in the records (token_times.parquet); turns fast-forward off.
    record_token_times: bool = False
    # Advance predictable runs of decode steps as one event (sim/engine/replica.py); same
    # records.
    fast_forward: bool = True
    # vLLM's async scheduling (the default on GPUs since vLLM 0.14, not under PP or on the CPU
    # backend): step N+1 is scheduled while step N runs, so a request that arrives during step
    # N first runs in step N+2 (sim/engine/replica.py).
    async_scheduling: bool = False
    # Which KV a step reads once although several requests attend to it: "cascade" (vLLM's
    # FlashAttention backend on GPUs: a prefix every running request shares, when vLLM uses
    # cascade attention), "cached" (the CPU backend: any block several running requests hold
    # stays in the CPU's caches between them) or "none".
    shared_kv_reads: str = "cascade"


class Scheduler(Protocol):
    """What the replica's engine loop needs from a scheduler."""

    config: SchedulerConfig
    options: ReplicaOptions
    kv: KVCacheManager
    itl_values: array[float]
    itl_counts: array[int]
    num_preemptions: int

    def add(self, seq: Sequence) -> None:
        """Queue a newly arrived request."""
        ...

    def schedule(self, now: float) -> StepPlan | None:
        """Plan the next step, or None when there is nothing to run now."""
        ...

    def complete(self, plan: StepPlan, now: float) -> list[Sequence]:
        """Apply a finished step at time ``now``; return the sequences that finished."""
        ...

    def wake_time(self, now: float) -> float | None:
        """When an idle engine should look again even without an arrival (None: only on one)."""
        ...

    @property
    def num_waiting(self) -> int:
        """Requests waiting to be admitted."""
        ...

    @property
    def num_running(self) -> int:
        """Requests admitted and not finished."""
        ...


class SchedulerBase:
    """What the continuous and the static-batch policy (sim/engine/static_batch.py) share: the
    waiting queue, and step completion (advance computed tokens, emit tokens, finish requests).
    """

    def __init__(
        self, config: SchedulerConfig, kv: KVCacheManager, options: ReplicaOptions | None = None
    ) -> None:
        self.config = config
        self.options = options if options is not None else ReplicaOptions()
        self.kv = kv
        self.waiting = WaitingQueue(config.policy)
        # Inter-token latencies, run-length encoded: ``itl_counts[i]`` tokens waited
        # ``itl_values[i]``. A decode step gives every request in it the same latency, so this
        # keeps a long run's memory proportional to its steps, not to its tokens.
        self.itl_values: array[float] = array("d")
        self.itl_counts: array[int] = array("q")
        self.num_preemptions = 0

    @property
    def num_waiting(self) -> int:
        """Requests waiting to be admitted (including preempted ones)."""
        return len(self.waiting)

    def add(self, seq: Sequence) -> None:
        """Queue a newly arrived request at the back (or by priority)."""
        self.waiting.push(seq)

    def add_itl(self, value_s: float, count: int) -> None:
        """Record ``count`` inter-token latencies of ``value_s`` (merged into the last run if
        equal to it)."""
        values = self.itl_values
        if values and values[-1] == value_s:
            self.itl_counts[-1] += count
        else:
            values.append(value_s)
            self.itl_counts.append(count)

    def _advance(self, seq: Sequence, num_new_tokens: int, now: float) -> bool:
        """Count a step's tokens for ``seq``; emit a token if it caught up. True if it finished."""
        seq.num_computed_tokens += num_new_tokens
        if seq.num_computed_tokens < seq.num_tokens:
            return False  # a prefill chunk that is not the last one
        record = seq.record
        seq.num_generated += 1
        if seq.num_generated == 1:
            record.first_token_s = now
        else:
            self.add_itl(now - seq.last_token_s, 1)
        seq.last_token_s = now
        if self.options.record_token_times:
            if record.token_times_s is None:
                record.token_times_s = [now]
            else:
                record.token_times_s.append(now)
        if seq.num_generated < seq.request.output_tokens:
            return False
        self._finish(seq, now)
        return True

    @staticmethod
    def _finish(seq: Sequence, now: float) -> None:
        seq.finished = True
        record = seq.record
        record.finish_s = now
        record.status = RequestStatus.OK


#: vLLM's cascade attention (FlashAttention backend, vllm/v1/attention/backends/flash_attn.py
#: ``use_cascade_attention``): it splits attention over the prefix every running request shares
#: from the rest only when that prefix is at least 256 tokens and at least 8 requests run.
CASCADE_MIN_PREFIX_TOKENS = 256
CASCADE_MIN_REQUESTS = 8


def cascade_shared_tokens(
    kv: KVCacheManager, running: list[Sequence], rows: list[tuple[Sequence, int]]
) -> int:
    """Context tokens that cascade attention reads once instead of once per request: with a
    common prefix of ``p`` tokens over all running requests, all in this step, ``(n - 1)·p``;
    else 0. The prefix is what vLLM finds (blocks every running request holds, capped by the
    tokens each has computed), counted as it does from the first running request."""
    num_rows = len(rows)
    if num_rows < CASCADE_MIN_REQUESTS or num_rows != len(running):
        return 0
    blocks = kv.num_common_prefix_blocks(running[0].request_id, num_rows)
    prefix = blocks * kv.block_size
    if prefix < CASCADE_MIN_PREFIX_TOKENS:
        return 0
    prefix = min(prefix, min(seq.num_computed_tokens for seq, _ in rows))
    prefix -= prefix % kv.block_size
    if prefix < CASCADE_MIN_PREFIX_TOKENS:
        return 0
    return (num_rows - 1) * prefix


def step_shape(
    rows: list[tuple[Sequence, int]],
    num_padding: int = 0,
    padding_context: int = 0,
    shared: int = 0,
) -> BatchShape:
    """Aggregate a step's rows into the shape the iteration-time model needs; ``shared``:
    the context tokens read once for several requests (see :func:`cascade_shared_tokens`)."""
    prefill_tokens = prefill_seqs = decode_seqs = pairs = prefill_context = decode_context = 0
    sampled = 0
    for seq, n in rows:
        computed = seq.num_computed_tokens
        generated = seq.num_generated
        tokens = seq.request.prompt_tokens + generated  # seq.num_tokens, without the call
        if n == 1 and generated > 0 and computed == tokens - 1:
            decode_seqs += 1
            decode_context += computed + 1
        else:
            prefill_seqs += 1
            prefill_tokens += n
            prefill_context += computed
            pairs += prefill_chunk_pairs(n, computed)
        if computed + n == tokens:
            sampled += 1
    return BatchShape(
        num_prefill_tokens=prefill_tokens,
        num_prefill_seqs=prefill_seqs,
        num_decode_seqs=decode_seqs + num_padding,
        prefill_attention_pairs=pairs,
        prefill_context_tokens=prefill_context,
        decode_context_tokens=decode_context + padding_context,
        num_sampled=sampled + num_padding,
        shared_context_tokens=min(shared, decode_context + prefill_context),
    )


class ContinuousBatchScheduler(SchedulerBase):
    """vLLM-v1-style continuous batching with chunked prefill and preemption by recompute."""

    def __init__(
        self, config: SchedulerConfig, kv: KVCacheManager, options: ReplicaOptions | None = None
    ) -> None:
        super().__init__(config, kv, options)
        self.running: list[Sequence] = []
        # Pipeline parallelism: requests are dealt into one group per stage as they are admitted
        # (vLLM's virtual engines) and each step serves one group in turn, so that a step per
        # stage can be in flight.
        self._next_group = 0

    @property
    def num_running(self) -> int:
        """Requests holding KV blocks."""
        return len(self.running)

    def wake_time(self, now: float) -> float | None:
        """When the next transferred KV arrives, if a running request waits for one."""
        pending = [s.kv_ready_s for s in self.running if s.kv_ready_s > now]
        return min(pending) if pending else None

    def _preempt(self, victim: Sequence, now: float, num_scheduled: int = 0) -> None:
        """Free ``victim``'s blocks and requeue it first; ``num_scheduled`` tokens of it were
        already scheduled (and their full blocks registered) in the step being planned."""
        if victim.kv_ready_s > now:
            # Its prompt's KV was still on the way from a prefill replica, so the first token
            # never reached the client: this replica recomputes the prompt and sends it.
            victim.num_generated = 0
            victim.record.first_token_s = math.nan
        kv = self.kv
        if (victim.exclusive or victim.keyed_blocks) and kv.enable_prefix_caching:
            # Register now what the eager path would have registered as the blocks filled.
            request = victim.request
            victim.keys = block_keys(
                sequence_segments(request), kv.block_size, request.total_tokens
            )
            kv.materialize(victim.request_id)
            kv.register_full_blocks(
                victim.request_id, victim.keys, victim.num_computed_tokens + num_scheduled
            )
            victim.exclusive = False
            victim.keyed_blocks = victim.id_blocks = 0
        kv.free(victim.request_id)
        victim.num_computed_tokens = 0
        # A preempted decode of remote KV recomputes it here, like any preempted request.
        victim.remote_transfer_s = 0.0
        victim.kv_ready_s = math.nan
        victim.record.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.push_front(victim)

    def _pick_victim(self) -> Sequence | None:
        """The request to preempt (never one inside a running pipeline step); None if none."""
        running = self.running
        if self.config.policy == "fcfs":
            # The latest admitted not in flight: almost always the last one.
            for index in range(len(running) - 1, -1, -1):
                if not running[index].in_flight:
                    return running.pop(index)
            return None
        candidates = [s for s in running if not s.in_flight]
        if not candidates:
            return None
        victim = max(candidates, key=lambda s: (s.request.priority, s.record.arrival_s))
        running.remove(victim)
        return victim

    def schedule(self, now: float) -> StepPlan | None:
        """Plan one step: running requests first, then admissions if nothing was preempted.
        Under pipeline parallelism the step serves the next group that has work."""
        groups = self.options.pipeline_parallel_size
        if groups == 1:
            return self._schedule(now, None)
        for attempt in range(groups):
            group = (self._next_group + attempt) % groups
            plan = self._schedule(now, group)
            if plan is not None:
                self._next_group = (group + 1) % groups
                return plan
        return None

    def _schedule(self, now: float, group: int | None) -> StepPlan | None:
        """One step for pipeline ``group`` (None: no pipelining): the running loop, then
        admissions. The running loop is inline (no helper per request) because it runs for
        every running request of every real step: the hot path of a simulation."""
        config = self.config
        kv = self.kv
        budget = config.max_num_batched_tokens
        scheduled: list[tuple[Sequence, int]] = []
        scheduled_ids: dict[int, int] = {}  # request id -> index in scheduled
        preempted: list[Sequence] = []

        running = self.running
        allocate = kv.allocate_slots
        anonymous_held = kv.anonymous_held
        block_size = kv.block_size
        chunked = config.enable_chunked_prefill
        track_ids = config.policy == "priority"  # only priority preemption reaches back
        emptied = False
        index = 0
        while index < len(running) and budget > 0:
            seq = running[index]
            if seq.in_flight or seq.kv_ready_s > now or (group is not None and seq.group != group):
                # In a pipeline step still running, or its KV is on the way from a prefill
                # replica: not schedulable this step.
                index += 1
                continue
            computed = seq.num_computed_tokens
            num_new = seq.request.prompt_tokens + seq.num_generated - computed
            if chunked:
                if num_new > budget:
                    num_new = budget
            else:
                # Without chunking a prompt is admitted whole: running requests only decode.
                assert num_new == 1, (seq.request_id, num_new)
            assert num_new > 0
            seq_preempted = False
            request_id = seq.request.request_id
            fits = (
                seq.exclusive
                and computed + num_new
                <= (anonymous_held.get(request_id, 0) + seq.id_blocks) * block_size
            )  # the fast path of an anonymous allocation, inline: most decodes take it
            while True:
                if fits:
                    break
                if seq.keyed_blocks and not seq.exclusive:
                    if self._allocate_keyed(seq, computed, num_new):
                        break
                elif allocate(request_id, seq.keys, computed, num_new, anonymous=seq.exclusive):
                    break
                victim = self._pick_victim()
                if victim is None:  # everyone else is in a running pipeline step: wait
                    seq_preempted = True
                    break
                num_scheduled = 0
                if track_ids and victim.request_id in scheduled_ids:
                    # Priority policy: the victim was already scheduled, earlier in the list.
                    position = scheduled_ids.pop(victim.request_id)
                    num_scheduled = scheduled[position][1]
                    budget += num_scheduled
                    scheduled[position] = (victim, 0)
                    emptied = True
                    index -= 1
                self._preempt(victim, now, num_scheduled)
                preempted.append(victim)
                seq_preempted = victim is seq
                if seq_preempted:
                    break
            if seq_preempted:
                break  # as vLLM: once a request cannot stay, nothing after it is scheduled
            if track_ids:
                scheduled_ids[seq.request.request_id] = len(scheduled)
            scheduled.append((seq, num_new))
            budget -= num_new
            index += 1
        if emptied:
            scheduled = [(s, n) for s, n in scheduled if n > 0]

        if not preempted:
            self._admit_waiting(now, group, budget, scheduled)

        if not scheduled:
            return None if not preempted else StepPlan([], preempted, BatchShape())
        shared = self._shared_tokens(scheduled)
        return StepPlan(scheduled, preempted, step_shape(scheduled, shared=shared))

    def _shared_tokens(self, rows: list[tuple[Sequence, int]]) -> int:
        """Context tokens this step reads once for several requests (see ReplicaOptions)."""
        match self.options.shared_kv_reads:
            case "cascade":
                return cascade_shared_tokens(self.kv, self.running, rows)
            case "cached":
                return self.kv.shared_tokens
        return 0

    def _admit_waiting(
        self, now: float, group: int | None, budget: int, scheduled: list[tuple[Sequence, int]]
    ) -> None:
        """Admit waiting requests in policy order into ``scheduled`` while the ``budget`` left
        this step, the KV cache and ``max_num_seqs`` allow; a prefix hit starts the prefill
        after the cached tokens. Stops at the first request that does not fit (as vLLM)."""
        config = self.config
        kv = self.kv
        while len(self.waiting) and budget > 0 and len(self.running) < config.max_num_seqs:
            seq = self.waiting.peek()
            if seq.remote_transfer_s > 0:
                if not self._admit_remote(seq, now):
                    break
                continue
            computed_blocks: list[int] = []
            num_hit = 0
            if seq.num_computed_tokens == 0:
                computed_blocks, num_hit = kv.get_computed_blocks(seq.keys, seq.num_tokens)
            num_new = seq.num_tokens - num_hit
            if not config.enable_chunked_prefill and num_new > budget:
                break
            num_new = min(num_new, budget)
            if seq.keyed_blocks and not seq.exclusive:
                if not self._allocate_keyed(seq, num_hit, num_new, computed_blocks):
                    break
            elif not kv.allocate_slots(
                seq.request_id,
                seq.keys,
                num_hit,
                num_new,
                computed_blocks,
                anonymous=seq.exclusive,
            ):
                break
            kv.record_lookup(seq.num_tokens, num_hit, preempted=seq.record.num_preemptions > 0)
            self.waiting.pop()
            seq.num_computed_tokens = num_hit
            if group is not None:
                seq.group = group
            record = seq.record
            if math.isnan(record.scheduled_s):
                record.scheduled_s = now
                record.cached_tokens = num_hit
            self.running.append(seq)
            scheduled.append((seq, num_new))
            budget -= num_new

    def _allocate_keyed(
        self, seq: Sequence, computed: int, num_new: int, hits: Sequence_[int] = ()
    ) -> bool:
        """Allocate for a request with a keyed prefix (see Sequence.keyed_blocks): its keyed
        blocks with ids, any after them by count; once it holds all of its keyed blocks it is
        held by count from then on. False, nothing changed, if the blocks do not fit."""
        kv = self.kv
        keyed_tokens = seq.keyed_blocks * kv.block_size
        if not kv.allocate_keyed_prefix(
            seq.request_id, seq.keys, computed, num_new, keyed_tokens, hits
        ):
            return False
        if computed + num_new >= keyed_tokens:
            seq.exclusive = True
            seq.id_blocks = len(kv.blocks_of(seq.request_id))
        return True

    def _admit_remote(self, seq: Sequence, now: float) -> bool:
        """Allocate blocks for a prompt whose KV a prefill replica sends; False if none free."""
        prompt = seq.num_tokens - 1  # the first token came with it, its KV not computed yet
        if seq.keyed_blocks and not seq.exclusive:
            if not self._allocate_keyed(seq, 0, prompt):
                return False
        elif not self.kv.allocate_slots(
            seq.request_id, seq.keys, 0, prompt, anonymous=seq.exclusive
        ):
            return False
        self.waiting.pop()
        seq.num_computed_tokens = prompt
        seq.kv_ready_s = now + seq.remote_transfer_s
        seq.last_token_s = seq.kv_ready_s
        self.running.append(seq)
        if seq.on_kv_admitted is not None:
            seq.on_kv_admitted(seq, now)
        return True

    def complete(self, plan: StepPlan, now: float) -> list[Sequence]:
        """Advance every scheduled request by its tokens; free and return the finished ones
        (a prefill replica's ``hold_kv`` ones keep their blocks until released)."""
        finished = []
        for seq, num_new in plan.scheduled:
            if self._advance(seq, num_new, now):
                if not seq.hold_kv:
                    self.kv.free(seq.request_id)
                finished.append(seq)
        if finished:
            self.running = [s for s in self.running if not s.finished]
        return finished

    def complete_run(
        self, rows: list[tuple[Sequence, int]], times: Sequence_[float], num_steps: int
    ) -> list[Sequence]:
        """Apply ``num_steps`` consecutive steps of every running request (``rows`` is the
        first step's plan, in which each row produces a token; after it, each step decodes one
        token of each), step ``j`` ending at ``times[j]``, no request finished before the last:
        what :meth:`complete` would have done step by step (sim/replica.py's fast-forward).
        Frees and returns the requests that finished in the last step."""
        add_itl = self.add_itl
        first_s, last_s = times[1], times[num_steps]
        later = num_steps - 1
        finished = []
        for seq, num_new in rows:
            # Step 1's token (the first, or one more gap), in row order as step by step.
            if seq.num_generated == 0:
                seq.record.first_token_s = first_s
            else:
                add_itl(first_s - seq.last_token_s, 1)
            seq.num_computed_tokens += num_new + later
            seq.num_generated += num_steps
            seq.last_token_s = last_s
            if seq.num_generated >= seq.request.output_tokens:
                self._finish(seq, last_s)
                if not seq.hold_kv:
                    self.kv.free(seq.request_id)
                finished.append(seq)
        # Each later step: one latency for every row (add_itl, inline: a run has many steps).
        values, counts = self.itl_values, self.itl_counts
        num_rows = len(rows)
        last = values[-1] if values else math.nan
        previous = first_s
        for step in range(2, num_steps + 1):
            now = times[step]
            value = now - previous
            previous = now
            if value == last:
                counts[-1] += num_rows
            else:
                values.append(value)
                counts.append(num_rows)
                last = value
        if finished:
            self.running = [s for s in self.running if not s.finished]
        return finished
