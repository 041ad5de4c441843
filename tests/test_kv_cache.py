"""Exact tests of the paged KV cache: block ids, free-queue order, prefix hits and eviction."""

from __future__ import annotations

import pytest

from sim.engine.kv_cache import FreeBlockQueue, KVCacheManager
from sim.engine.request import block_keys

BLOCK = 16


def keys_for(source: int, num_tokens: int) -> list[int]:
    return block_keys([(source, num_tokens)], BLOCK, num_tokens)


def test_free_queue_pops_from_head_and_removes_from_the_middle() -> None:
    queue = FreeBlockQueue(5)
    assert queue.ids() == [0, 1, 2, 3, 4]
    assert queue.popleft() == 0
    queue.remove(3)
    assert queue.ids() == [1, 2, 4]
    queue.append(0)
    queue.append(3)
    assert queue.ids() == [1, 2, 4, 0, 3]
    assert queue.num_free == 5
    assert 3 in queue and queue.popleft() == 1 and 1 not in queue


def test_allocation_takes_blocks_in_order_and_free_returns_them_tail_first() -> None:
    kv = KVCacheManager(8, BLOCK, enable_prefix_caching=True)
    assert kv.allocate_slots(1, keys_for(1, 40), 0, 40)
    assert kv.blocks_of(1) == [0, 1, 2]  # 40 tokens -> 3 blocks
    assert kv.allocate_slots(2, keys_for(2, 20), 0, 20)
    assert kv.blocks_of(2) == [3, 4]
    kv.free(1)
    # Tail blocks of the freed request are evicted first.
    assert kv.free_queue.ids() == [5, 6, 7, 2, 1, 0]
    assert kv.num_free_blocks == 6
    kv.check_invariants()


def test_growing_a_request_adds_a_block_only_when_the_last_one_is_full() -> None:
    kv = KVCacheManager(4, BLOCK, enable_prefix_caching=False)
    assert kv.allocate_slots(7, [], 0, 16)
    assert kv.blocks_of(7) == [0]
    assert kv.allocate_slots(7, [], 16, 0)  # nothing new needed
    assert kv.blocks_of(7) == [0]
    assert kv.allocate_slots(7, [], 16, 1)
    assert kv.blocks_of(7) == [0, 1]


def test_failed_allocation_changes_nothing() -> None:
    kv = KVCacheManager(3, BLOCK, enable_prefix_caching=True)
    assert kv.allocate_slots(1, keys_for(1, 32), 0, 32)
    assert not kv.allocate_slots(2, keys_for(2, 32), 0, 32)
    assert kv.blocks_of(2) == []
    assert kv.free_queue.ids() == [2]
    kv.check_invariants()


def test_prefix_hit_reuses_full_blocks_of_a_finished_request() -> None:
    kv = KVCacheManager(10, BLOCK, enable_prefix_caching=True)
    shared = keys_for(99, 48)
    assert kv.allocate_slots(1, shared, 0, 48)
    kv.free(1)
    hit, num_hit = kv.get_computed_blocks(shared[:2] + keys_for(5, 48)[2:], 64)
    assert hit == [0, 1]
    assert num_hit == 32


def test_a_full_hit_still_recomputes_the_last_token() -> None:
    kv = KVCacheManager(10, BLOCK, enable_prefix_caching=True)
    shared = keys_for(99, 48)
    assert kv.allocate_slots(1, shared, 0, 48)
    # Same 48 tokens: at most (48 - 1) // 16 = 2 blocks may hit.
    hit, num_hit = kv.get_computed_blocks(shared, 48)
    assert hit == [0, 1] and num_hit == 32
    # 49 tokens: all three full blocks hit.
    hit, num_hit = kv.get_computed_blocks(shared, 49)
    assert hit == [0, 1, 2] and num_hit == 48


def test_hits_on_a_running_request_share_blocks_and_count_references() -> None:
    kv = KVCacheManager(10, BLOCK, enable_prefix_caching=True)
    shared = keys_for(99, 64)
    assert kv.allocate_slots(1, shared, 0, 64)
    hit, num_hit = kv.get_computed_blocks(shared, 64)
    assert hit == [0, 1, 2]
    assert kv.allocate_slots(2, shared, num_hit, 64 - num_hit, hit)
    assert kv.blocks_of(2) == [0, 1, 2, 4]
    kv.free(1)
    # Blocks 0-2 are still referenced by request 2; only block 3 is free again.
    assert kv.free_queue.ids() == [5, 6, 7, 8, 9, 3]
    kv.check_invariants()


def test_touching_a_free_cached_block_takes_it_off_the_free_queue() -> None:
    kv = KVCacheManager(4, BLOCK, enable_prefix_caching=True)
    shared = keys_for(99, 32)
    assert kv.allocate_slots(1, shared, 0, 32)
    kv.free(1)
    assert kv.free_queue.ids() == [2, 3, 1, 0]
    hit, num_hit = kv.get_computed_blocks(shared, 40)
    assert kv.allocate_slots(2, shared, num_hit, 8, hit)
    assert kv.blocks_of(2) == [0, 1, 2]
    assert kv.free_queue.ids() == [3]
    kv.check_invariants()


def test_eviction_pops_lru_blocks_and_forgets_their_keys() -> None:
    kv = KVCacheManager(4, BLOCK, enable_prefix_caching=True)
    old = keys_for(1, 48)
    assert kv.allocate_slots(1, old, 0, 48)
    kv.free(1)
    assert kv.free_queue.ids() == [3, 2, 1, 0]
    # A new 32-token request takes block 3 (never cached) then block 2 (evicting old's 3rd key).
    assert kv.allocate_slots(2, keys_for(2, 32), 0, 32)
    assert kv.blocks_of(2) == [3, 2]
    hit, num_hit = kv.get_computed_blocks(old, 49)
    assert hit == [0, 1] and num_hit == 32
    kv.check_invariants()


def test_hit_blocks_that_are_free_count_against_free_space() -> None:
    kv = KVCacheManager(3, BLOCK, enable_prefix_caching=True)
    shared = keys_for(9, 32)
    assert kv.allocate_slots(1, shared, 0, 32)
    kv.free(1)
    hit, num_hit = kv.get_computed_blocks(shared, 64)
    assert hit == [0, 1]
    # Needs 4 blocks in all: 2 hits (both free) + 2 new, but only 3 blocks exist.
    assert not kv.allocate_slots(2, shared, num_hit, 32, hit)
    assert kv.free_queue.num_free == 3
    kv.check_invariants()


def test_lookups_are_counted_in_tokens_only_when_recorded() -> None:
    kv = KVCacheManager(10, BLOCK, enable_prefix_caching=True)
    kv.get_computed_blocks(keys_for(1, 64), 64)
    assert kv.queries_tokens == 0
    kv.record_lookup(64, 32, preempted=False)
    assert (kv.queries_tokens, kv.hits_tokens) == (64, 32)
    # Re-admissions after preemption are counted apart, as in vLLM.
    kv.record_lookup(80, 48, preempted=True)
    assert (kv.queries_tokens, kv.hits_tokens) == (64, 32)
    assert (kv.preempted_queries_tokens, kv.preempted_hits_tokens) == (80, 48)
    off = KVCacheManager(10, BLOCK, enable_prefix_caching=False)
    assert off.get_computed_blocks(keys_for(1, 64), 64) == ([], 0)
    off.record_lookup(64, 0, preempted=False)
    assert off.queries_tokens == 0


def test_usage_is_the_share_of_referenced_blocks() -> None:
    kv = KVCacheManager(4, BLOCK, enable_prefix_caching=True)
    assert kv.usage == 0.0
    assert kv.allocate_slots(1, [], 0, 17)
    assert kv.usage == pytest.approx(0.5)


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 16), (4, 0)])
def test_bad_sizes_are_rejected(num_blocks: int, block_size: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        KVCacheManager(num_blocks, block_size, enable_prefix_caching=True)


def test_block_keys_are_chained_and_depend_only_on_content() -> None:
    a = block_keys([(1, 20), (2, 30)], 16, 50)
    b = block_keys([(1, 20), (2, 40)], 16, 60)
    c = block_keys([(1, 16), (3, 4), (2, 30)], 16, 50)
    assert len(a) == 3 and len(b) == 3
    assert a == b[:3]  # same content up to token 48
    assert c[0] == a[0] and c[1] != a[1]  # block 2 differs, and so does everything after it
    assert c[2] != a[2]


def test_anonymous_blocks_keep_their_place_in_the_lru_order() -> None:
    # Request 1 caches 2 blocks; exclusive request 2 holds 3 blocks by count; both finish.
    kv = KVCacheManager(8, BLOCK, enable_prefix_caching=True)
    assert kv.allocate_slots(1, keys_for(1, 32), 0, 32)
    assert kv.allocate_slots(2, (), 0, 40, anonymous=True)
    assert kv.blocks_of(2) == [] and kv.num_blocks_of(2) == 3
    assert kv.num_free_blocks == 3
    kv.free(1)
    kv.free(2)
    kv.check_invariants()
    queue = kv.free_queue
    # Free: never-used 5, 6, 7; then request 1's blocks tail-first; then one run of 3.
    assert queue.ids()[:5] == [5, 6, 7, 1, 0] and queue.runs() == [3]
    assert kv.num_free_blocks == 8 and kv.usage == 0.0
    # Six blocks for a keyed request: the never-used three, then request 1's (evicting its
    # cached keys, as without anonymous blocks), then one from the run, which gets a spare id.
    assert kv.allocate_slots(3, keys_for(3, 96), 0, 96)
    assert kv.blocks_of(3)[:5] == [5, 6, 7, 1, 0]
    assert kv.cached_prefix_blocks(keys_for(1, 32)) == 0
    assert queue.runs() == [2] and kv.num_free_blocks == 2
    kv.check_invariants()


def test_an_anonymous_request_that_must_be_registered_gets_ids() -> None:
    kv = KVCacheManager(4, BLOCK, enable_prefix_caching=True)
    assert kv.allocate_slots(7, (), 0, 40, anonymous=True)
    kv.materialize(7)
    assert len(kv.blocks_of(7)) == 3 and kv.num_blocks_of(7) == 3
    kv.register_full_blocks(7, keys_for(7, 40), 40)
    kv.check_invariants()
    kv.free(7)
    hit, tokens = kv.get_computed_blocks(keys_for(7, 40), 40)
    assert tokens == 32 and len(hit) == 2  # its two full blocks can be hit again
    kv.check_invariants()


def test_anonymous_runs_merge_at_the_tail_and_split_at_the_head() -> None:
    queue = FreeBlockQueue(2)
    queue.append_anonymous(3)
    queue.append_anonymous(2)
    assert queue.runs() == [5] and queue.num_free == 7
    assert queue.popleft_many(3) == ([0, 1], 1)
    assert queue.runs() == [4] and queue.num_free == 4
    queue.append(0)
    queue.append_anonymous(1)
    assert queue.runs() == [4, 1]
    assert queue.popleft_many(6) == ([0], 5)
    assert queue.num_free == 0


def test_never_used_blocks_cost_nothing_until_used() -> None:
    # A queue of a trillion blocks: one entry each would not fit in memory.
    queue = FreeBlockQueue(10**12)
    assert queue.num_free == 10**12 and 10**12 - 1 in queue and 10**12 not in queue
    assert queue.popleft_many(3) == ([0, 1, 2], 0)
    queue.extend([1, 0])
    queue.append_anonymous(4)
    assert queue.num_free == 10**12 - 3 + 2 + 4
    assert 5 in queue and 2 not in queue
    # Never-used blocks stay ahead of freed ones and runs.
    assert queue.popleft_many(2) == ([3, 4], 0)


def test_a_keyed_prefix_then_blocks_by_count_frees_as_a_fully_keyed_request_would() -> None:
    # Two requests share a 2-block system prompt, each with 3 more blocks of its own. One
    # takes its own blocks by id (keys it alone could hit), the other by count after its
    # keyed prefix (Sequence.keyed_blocks): the free queue ends up in the same order.
    def run(by_count: bool) -> tuple[str, int]:
        kv = KVCacheManager(12, BLOCK, enable_prefix_caching=True)
        system = (99, 32)
        for request_id in (1, 2):
            segments = [system, (request_id, 48)]
            keys = block_keys(segments, BLOCK, 80)
            hit, tokens = kv.get_computed_blocks(keys, 80)
            if by_count:
                assert kv.allocate_slots(request_id, keys[:2], tokens, 32 - tokens, hit)
                assert kv.allocate_slots(request_id, keys[:2], 32, 48, anonymous=True)
                assert kv.num_blocks_of(request_id) == 5 and len(kv.blocks_of(request_id)) == 2
            else:
                assert kv.allocate_slots(request_id, keys, tokens, 80 - tokens, hit)
        prompt = set(kv.blocks_of(1)[:2])
        kv.check_invariants()
        kv.free(1)
        kv.free(2)
        kv.check_invariants()
        queue = kv.free_queue
        runs = iter(queue.runs())
        entries = queue.ids()
        assert entries[:4] == [8, 9, 10, 11]  # never used: the head, in id order
        # Then head to tail: P for a system-prompt block, o for one of a request's own.
        order = "".join(
            "o" * next(runs) if b < 0 else ("P" if b in prompt else "o") for b in entries[4:]
        )
        return order, kv.cached_prefix_blocks(block_keys([system], BLOCK, 32))

    keyed, by_count = run(False), run(True)
    assert keyed == by_count == ("ooooooPP", 2)  # own blocks first, the prompt kept longest


def test_a_request_with_a_keyed_prefix_that_must_be_registered_gets_ids_after_its_prefix() -> None:
    kv = KVCacheManager(8, BLOCK, enable_prefix_caching=True)
    segments = [(99, 32), (7, 40)]
    keys = block_keys(segments, BLOCK, 72)
    assert kv.allocate_slots(7, keys[:2], 0, 32)
    assert kv.allocate_slots(7, keys[:2], 32, 40, anonymous=True)
    assert kv.num_blocks_of(7) == 5
    prefix = kv.blocks_of(7)[:2]
    kv.materialize(7)
    assert kv.blocks_of(7)[:2] == prefix and len(kv.blocks_of(7)) == 5
    kv.register_full_blocks(7, keys, 72)
    kv.check_invariants()
    kv.free(7)
    hit, tokens = kv.get_computed_blocks(keys, 72)
    assert tokens == 64 and hit[:2] == prefix  # all four full blocks, prefix first
    kv.check_invariants()


def test_allocating_a_keyed_prefix_gives_ids_to_the_prefix_and_counts_the_rest() -> None:
    kv = KVCacheManager(12, BLOCK, enable_prefix_caching=True)
    system = (99, 32)
    keys = block_keys([system, (1, 48)], BLOCK, 80)[:2]
    # Within the prefix: ordinary blocks with ids, registered.
    assert kv.allocate_keyed_prefix(1, keys, 0, 20, 32)
    assert len(kv.blocks_of(1)) == 2 and kv.num_blocks_of(1) == 2
    # Past it: the rest of the prefix by id, the blocks after it by count.
    assert kv.allocate_keyed_prefix(1, keys, 20, 60, 32)
    assert len(kv.blocks_of(1)) == 2 and kv.num_blocks_of(1) == 5
    assert kv.cached_prefix_blocks(keys) == 2
    kv.check_invariants()
    # A second request hits the prefix and takes the rest by count in the same call.
    other = block_keys([system, (2, 48)], BLOCK, 80)[:2]
    hit, tokens = kv.get_computed_blocks(other, 80)
    assert tokens == 32
    assert kv.allocate_keyed_prefix(2, other, tokens, 48, 32, hit)
    assert kv.blocks_of(2) == kv.blocks_of(1) and kv.num_blocks_of(2) == 5
    assert kv.num_shared_references == 2
    kv.check_invariants()


def test_a_keyed_prefix_allocation_that_does_not_fit_changes_nothing() -> None:
    kv = KVCacheManager(4, BLOCK, enable_prefix_caching=True)
    keys = block_keys([(99, 32), (1, 48)], BLOCK, 80)[:2]
    before = (kv.free_queue.ids(), kv.num_free_blocks)
    assert not kv.allocate_keyed_prefix(1, keys, 0, 80, 32)  # 5 blocks, 4 free
    assert (kv.free_queue.ids(), kv.num_free_blocks) == before
    assert kv.blocks_of(1) == [] and kv.num_blocks_of(1) == 0
    assert kv.cached_prefix_blocks(keys) == 0
    kv.check_invariants()
