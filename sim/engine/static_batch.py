"""Static batching, the pre-continuous-batching policy, for comparison.

:class:`StaticBatchScheduler` forms a batch only when the engine is idle, reserves every
member's KV for its full length up front, prefills all prompts, then decodes the whole batch
until its longest member is done (finished members keep their slot and are computed as
padding). With ``batch_window_s > 0`` it is a dynamic (time-window) batcher: it waits up to that
long after the oldest waiting request for the batch to fill.
"""

from __future__ import annotations

from sim.engine.kv_cache import KVCacheManager
from sim.engine.scheduler import ReplicaOptions, SchedulerBase, SchedulerConfig, step_shape
from sim.engine.sequence import Sequence, StepPlan


class StaticBatchScheduler(SchedulerBase):
    """Static batching (``batch_window_s == 0``) or dynamic time-window batching (``> 0``)."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        batch_window_s: float = 0.0,
        options: ReplicaOptions | None = None,
    ):
        super().__init__(config, kv, options)
        self.batch_window_s = batch_window_s
        self.batch: list[Sequence] = []

    @property
    def num_running(self) -> int:
        """Members of the current batch, finished ones included (they hold their slot)."""
        return len(self.batch)

    def wake_time(self, now: float) -> float | None:
        """With a window, the moment the oldest waiting request's window closes."""
        if self.batch or not len(self.waiting) or self.batch_window_s <= 0:
            return None
        return self.waiting.oldest_arrival_s() + self.batch_window_s

    def _form_batch(self, now: float) -> None:
        config = self.config
        if self.batch_window_s > 0 and len(self.waiting) < config.max_num_seqs:
            deadline = self.waiting.oldest_arrival_s() + self.batch_window_s
            if now < deadline:
                return
        while len(self.waiting) and len(self.batch) < config.max_num_seqs:
            seq = self.waiting.peek()
            # Reserve the whole sequence up front; no prefix reuse in this policy.
            if not self.kv.allocate_slots(seq.request_id, (), 0, seq.request.total_tokens):
                break
            self.waiting.pop()
            seq.record.scheduled_s = now
            self.batch.append(seq)

    def schedule(self, now: float) -> StepPlan | None:
        """Prefill the batch's prompts within the budget, then decode the batch in lockstep."""
        if not self.batch:
            if not len(self.waiting):
                return None
            self._form_batch(now)
            if not self.batch:
                return None
        budget = self.config.max_num_batched_tokens
        prefills = [s for s in self.batch if s.num_computed_tokens < s.request.prompt_tokens]
        if prefills:
            rows = []
            for seq in prefills:
                if budget <= 0:
                    break
                n = min(seq.request.prompt_tokens - seq.num_computed_tokens, budget)
                rows.append((seq, n))
                budget -= n
            return StepPlan(rows, [], step_shape(rows))
        rows = [(s, 1) for s in self.batch if not s.finished]
        padding = [s for s in self.batch if s.finished]
        padding_context = sum(s.num_computed_tokens for s in padding)
        return StepPlan(rows, [], step_shape(rows, len(padding), padding_context), padding)

    def complete(self, plan: StepPlan, now: float) -> list[Sequence]:
        """Advance the batch; release it (KV and slots) only when every member is done."""
        finished = [seq for seq, n in plan.scheduled if self._advance(seq, n, now)]
        for seq in plan.padding:
            seq.num_computed_tokens += 1
        if all(s.finished for s in self.batch):
            for seq in self.batch:
                self.kv.free(seq.request_id)
            self.batch = []
        return finished
