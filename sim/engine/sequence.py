"""What a scheduler works on: a request inside an engine (:class:`Sequence`), the queue it
waits in (:class:`WaitingQueue`, FCFS or by priority) and the plan of one step
(:class:`StepPlan`). Plain data, no policy: the policies live in :mod:`sim.engine.scheduler`.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from sim.engine.latency import BatchShape
from sim.engine.request import Record, Request

Policy = Literal["fcfs", "priority"]


@dataclass(slots=True, eq=False)
class Sequence:
    """A request inside an engine: its progress and its record."""

    request: Request
    record: Record
    keys: list[int]  # chained keys of the full blocks of prompt + output
    num_computed_tokens: int = 0
    num_generated: int = 0
    last_token_s: float = math.nan
    finished: bool = False
    # Disaggregated serving. A prefill replica keeps a finished sequence's KV (``hold_kv``)
    # until it has been sent. A decode replica admits a sequence whose prompt KV comes from a
    # prefill replica (``remote_transfer_s`` > 0): its blocks are allocated on admission, the
    # transfer takes that long, and it decodes from ``kv_ready_s`` on; ``on_kv_admitted`` is
    # told when the transfer starts and ends.
    hold_kv: bool = False
    # No other request's sequence starts like this one, so no other request can hit its
    # blocks: its keys are left empty (nothing registered in the prefix cache) unless it is
    # preempted, when they are computed and its blocks registered for its own re-admission.
    exclusive: bool = False
    # A request whose first ``keyed_blocks`` blocks other requests can share (a system prompt)
    # and none after them: its keys stop there, those blocks get ids, and every block after
    # them is held by count as an exclusive request's (the allocation that reaches past the
    # prefix makes ``exclusive`` True, keeping the ``id_blocks`` that have ids). Preemption
    # makes it an ordinary keyed request.
    keyed_blocks: int = 0
    id_blocks: int = 0
    in_flight: bool = False  # in a step not yet completed (pipeline parallelism overlaps steps)
    group: int = 0  # pipeline parallelism: the micro-batch group (virtual engine) it runs in
    remote_transfer_s: float = 0.0
    kv_ready_s: float = math.nan
    on_kv_admitted: Callable[[Sequence, float], None] | None = None

    @property
    def request_id(self) -> int:
        """The request's id (also the KV cache's owner id)."""
        return self.request.request_id

    @property
    def num_tokens(self) -> int:
        """Tokens known so far: the prompt plus every token generated."""
        return self.request.prompt_tokens + self.num_generated


@dataclass(slots=True)
class StepPlan:
    """One engine step: who computes how many tokens, and who was preempted to make room."""

    scheduled: list[tuple[Sequence, int]]
    preempted: list[Sequence]
    batch: BatchShape
    padding: list[Sequence] = field(default_factory=list)  # static batching: finished members


class WaitingQueue:
    """FCFS deque or a priority heap ordered by (priority, arrival, id); preempted go first."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._deque: deque[Sequence] = deque()
        self._heap: list[tuple[int, float, int, Sequence]] = []
        self._tiebreak = itertools.count()

    def __len__(self) -> int:
        return len(self._deque) if self.policy == "fcfs" else len(self._heap)

    def push(self, seq: Sequence) -> None:
        if self.policy == "fcfs":
            self._deque.append(seq)
        else:
            self._push_heap(seq)

    def push_front(self, seq: Sequence) -> None:
        if self.policy == "fcfs":
            self._deque.appendleft(seq)
        else:
            self._push_heap(seq)

    def _push_heap(self, seq: Sequence) -> None:
        entry = (seq.request.priority, seq.record.arrival_s, next(self._tiebreak), seq)
        heapq.heappush(self._heap, entry)

    def peek(self) -> Sequence:
        return self._deque[0] if self.policy == "fcfs" else self._heap[0][3]

    def oldest_arrival_s(self) -> float:
        """Arrival time of the request that has waited longest (not always the next one out)."""
        if self.policy == "fcfs":
            return self._deque[0].record.arrival_s
        return min(entry[1] for entry in self._heap)

    def pop(self) -> Sequence:
        return self._deque.popleft() if self.policy == "fcfs" else heapq.heappop(self._heap)[3]
