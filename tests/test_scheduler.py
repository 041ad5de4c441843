"""Exact tests of the continuous-batching scheduler: budgets, chunks, admission, preemption."""

from __future__ import annotations

from sim.engine.request import RequestStatus
from sim.engine.sequence import StepPlan
from tests.factories import make_request, make_scheduler, make_sequence


def rows(plan: StepPlan | None) -> list[tuple[int, int]]:
    assert plan is not None
    return [(seq.request_id, n) for seq, n in plan.scheduled]


def test_token_budget_splits_prompts_into_chunks() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=100)
    for i in range(3):
        scheduler.add(make_sequence(make_request(i, prompt_tokens=60, output_tokens=3)))
    plan = scheduler.schedule(0.0)
    assert rows(plan) == [(0, 60), (1, 40)]
    assert plan is not None
    assert plan.batch.num_prefill_tokens == 100 and plan.batch.num_sampled == 1
    scheduler.complete(plan, 1.0)
    # Running first: request 0 decodes, request 1 finishes its prompt, request 2 starts.
    plan = scheduler.schedule(1.0)
    assert rows(plan) == [(0, 1), (1, 20), (2, 60)]
    assert plan is not None
    assert plan.batch.num_decode_seqs == 1 and plan.batch.num_prefill_tokens == 80


def test_without_chunked_prefill_a_prompt_must_fit_the_remaining_budget() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=100, enable_chunked_prefill=False)
    for i in range(3):
        scheduler.add(make_sequence(make_request(i, prompt_tokens=60, output_tokens=3)))
    plan = scheduler.schedule(0.0)
    assert rows(plan) == [(0, 60)]
    assert scheduler.num_waiting == 2


def test_max_num_seqs_caps_admissions() -> None:
    scheduler = make_scheduler(max_num_seqs=2)
    for i in range(3):
        scheduler.add(make_sequence(make_request(i, prompt_tokens=10, output_tokens=3)))
    assert rows(scheduler.schedule(0.0)) == [(0, 10), (1, 10)]
    assert scheduler.num_running == 2 and scheduler.num_waiting == 1


def test_tokens_are_emitted_when_a_request_catches_up_and_it_finishes_on_its_last() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=32)
    seq = make_sequence(make_request(0, prompt_tokens=40, output_tokens=3))
    scheduler.add(seq)
    times = []
    for step in range(1, 10):
        plan = scheduler.schedule(float(step))
        if plan is None:
            break
        times.append((step, rows(plan)))
        scheduler.complete(plan, float(step))
    # 40-token prompt in chunks of 32 + 8, then 2 decodes: first token at step 2, done at 4.
    assert times == [(1, [(0, 32)]), (2, [(0, 8)]), (3, [(0, 1)]), (4, [(0, 1)])]
    record = seq.record
    assert (record.scheduled_s, record.first_token_s, record.finish_s) == (1.0, 2.0, 4.0)
    assert record.status == RequestStatus.OK
    assert (list(scheduler.itl_values), list(scheduler.itl_counts)) == ([1.0], [2])
    assert scheduler.kv.num_free_blocks == scheduler.kv.num_blocks


def test_preemption_evicts_the_latest_admitted_and_requeues_it_first() -> None:
    # 4 blocks of 16 tokens; two requests of 30 prompt tokens take 2 blocks each.
    scheduler = make_scheduler(num_blocks=4, enable_prefix_caching=False)
    a = make_sequence(make_request(0, prompt_tokens=30, output_tokens=10))
    b = make_sequence(make_request(1, prompt_tokens=30, output_tokens=10))
    c = make_sequence(make_request(2, prompt_tokens=5, output_tokens=1))
    for seq in (a, b, c):
        scheduler.add(seq)
    plan = scheduler.schedule(0.0)
    assert rows(plan) == [(0, 30), (1, 30)]  # c does not fit in KV
    assert plan is not None
    scheduler.complete(plan, 1.0)  # both emit token 1 -> 31 tokens each
    for t in (1.0, 2.0):
        plan = scheduler.schedule(t)
        assert rows(plan) == [(0, 1), (1, 1)]  # the KV of tokens 31 and 32 fits in 2 blocks
        assert plan is not None
        scheduler.complete(plan, t + 1.0)
    # 33 tokens each: the next decode writes token 33's KV and needs a third block.
    plan = scheduler.schedule(3.0)
    assert plan is not None
    assert [s.request_id for s in plan.preempted] == [1]
    assert rows(plan) == [(0, 1)]
    assert b.record.num_preemptions == 1 and b.num_computed_tokens == 0
    assert scheduler.waiting.peek() is b  # back at the front, ahead of c
    assert scheduler.num_preemptions == 1
    scheduler.kv.check_invariants()


def test_a_preempted_request_recomputes_its_prompt_and_generated_tokens() -> None:
    scheduler = make_scheduler(num_blocks=4, enable_prefix_caching=False)
    a = make_sequence(make_request(0, prompt_tokens=30, output_tokens=10))
    b = make_sequence(make_request(1, prompt_tokens=30, output_tokens=4))
    scheduler.add(a)
    scheduler.add(b)
    now = 0.0
    recompute = None
    while (plan := scheduler.schedule(now)) is not None:
        now += 1.0
        for seq, n in plan.scheduled:
            if seq is b and b.record.num_preemptions and n > 1:
                recompute = n
        scheduler.complete(plan, now)
    # b had generated 3 tokens when preempted: its recompute covers 30 + 3 tokens.
    assert recompute == 33
    assert a.record.status == b.record.status == RequestStatus.OK
    assert b.num_generated == 4
    assert scheduler.kv.num_free_blocks == 4


def test_no_admissions_in_a_step_that_preempted() -> None:
    scheduler = make_scheduler(num_blocks=4, enable_prefix_caching=False)
    a = make_sequence(make_request(0, prompt_tokens=30, output_tokens=10))
    b = make_sequence(make_request(1, prompt_tokens=30, output_tokens=10))
    scheduler.add(a)
    scheduler.add(b)
    for t in (1.0, 2.0, 3.0):
        plan = scheduler.schedule(t)
        assert plan is not None
        scheduler.complete(plan, t)
    scheduler.add(make_sequence(make_request(2, prompt_tokens=1, output_tokens=1)))
    plan = scheduler.schedule(4.0)
    assert plan is not None and plan.preempted
    assert all(seq.request_id != 2 for seq, _ in plan.scheduled)


def test_priority_policy_admits_lower_priority_values_first() -> None:
    scheduler = make_scheduler(max_num_seqs=1, policy="priority")
    scheduler.add(make_sequence(make_request(0, priority=5, arrival_s=0.0)))
    scheduler.add(make_sequence(make_request(1, priority=1, arrival_s=1.0)))
    scheduler.add(make_sequence(make_request(2, priority=1, arrival_s=0.5)))
    assert rows(scheduler.schedule(2.0)) == [(2, 32)]


def test_prefix_hits_are_skipped_and_recorded_as_cached_tokens() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=8192)
    first = make_sequence(
        make_request(0, prompt_tokens=100, output_tokens=1, shared_prefix_tokens=64)
    )
    scheduler.add(first)
    plan = scheduler.schedule(0.0)
    assert plan is not None
    scheduler.complete(plan, 1.0)
    second = make_sequence(
        make_request(1, prompt_tokens=90, output_tokens=1, shared_prefix_tokens=64)
    )
    scheduler.add(second)
    assert rows(scheduler.schedule(1.0)) == [(1, 90 - 64)]
    assert second.record.cached_tokens == 64
    kv = scheduler.kv
    assert (kv.queries_tokens, kv.hits_tokens) == (190, 64)


def test_priority_preemption_can_take_back_a_request_scheduled_earlier_in_the_step() -> None:
    scheduler = make_scheduler(num_blocks=4, enable_prefix_caching=False, policy="priority")
    low = make_sequence(make_request(0, prompt_tokens=20, output_tokens=30, priority=5))
    high = make_sequence(make_request(1, prompt_tokens=31, output_tokens=30, priority=0))
    scheduler.add(low)
    plan = scheduler.schedule(0.0)
    assert plan is not None
    scheduler.complete(plan, 1.0)
    scheduler.add(high)  # running is now [low, high]
    now = 1.0
    while (plan := scheduler.schedule(now)) is not None and not plan.preempted:
        now += 1.0
        scheduler.complete(plan, now)
    assert plan is not None
    # high needs a third block; low (worse priority) is already scheduled this step but goes.
    assert plan.preempted == [low]
    assert rows(plan) == [(1, 1)]
    assert scheduler.running == [high]
    scheduler.kv.check_invariants()
