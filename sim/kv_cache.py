"""Paged KV cache with prefix caching, modelled on vLLM v1's KV-cache manager.

The cache is a pool of ``num_blocks`` blocks of ``block_size`` tokens. A request holds a list of
blocks covering its computed tokens. With prefix caching on, every *full* block is registered
under its chained key (see :func:`sim.request.block_keys`); a later request whose leading keys
match reuses those blocks instead of recomputing them.

Free blocks sit in an LRU queue (a doubly linked list over block ids, O(1) removal): allocation
pops from the head; a finished request's blocks are appended in reverse order, so its tail blocks
— the least likely to be shared — are evicted first. A free block keeps its key until it is
popped for reuse, so it can still be hit ("touched") and taken back off the queue until then.

Differences from vLLM kept on purpose: there is no reserved null block, and when two requests
compute the same block concurrently only the first copy is registered under the key.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class FreeBlockQueue:
    """LRU queue of free block ids: O(1) append, pop from the head, removal from the middle.

    An insertion-ordered dict is the doubly linked list (its C implementation is several times
    faster than one kept in Python lists, and allocation is most of what a long run does).
    """

    def __init__(self, num_blocks: int) -> None:
        self._queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_free(self) -> int:
        """Blocks in the queue."""
        return len(self._queue)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._queue

    def popleft(self) -> int:
        """Remove and return the least recently freed block."""
        assert self._queue, "no free blocks"
        return self._queue.popitem(last=False)[0]

    def popleft_many(self, count: int) -> list[int]:
        """Remove and return the ``count`` least recently freed blocks, oldest first."""
        assert count <= len(self._queue), "not enough free blocks"
        popitem = self._queue.popitem
        return [popitem(False)[0] for _ in range(count)]

    def extend(self, block_ids: Sequence[int]) -> None:
        """Append blocks at the tail in the given order."""
        queue = self._queue
        for block_id in block_ids:
            queue[block_id] = None

    def remove(self, block_id: int) -> None:
        """Take a block out of the queue wherever it is (a cache hit on a free block)."""
        del self._queue[block_id]

    def append(self, block_id: int) -> None:
        """Put a block at the tail (most recently freed: evicted last)."""
        assert block_id not in self._queue
        self._queue[block_id] = None

    def ids(self) -> list[int]:
        """Block ids from head (next to be evicted) to tail; for tests and debugging."""
        return list(self._queue)


class KVCacheManager:
    """Allocates KV blocks to requests and serves prefix-cache hits.

    Hit accounting follows vLLM's ``prefix_cache_queries``/``prefix_cache_hits`` counters: each
    lookup queries all of the request's current tokens and hits the tokens found in cache. A full
    hit is capped at ``num_tokens - 1`` so the last token is always recomputed (its logits are
    needed to sample the next token).
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks: must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size: must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.free_queue = FreeBlockQueue(num_blocks)
        self._ref_count = [0] * num_blocks
        self._block_key: list[int | None] = [None] * num_blocks
        self._key_to_block: dict[int, int] = {}
        self._request_blocks: dict[int, list[int]] = {}
        self._request_num_cached: dict[int, int] = {}
        self.queries_tokens = 0
        self.hits_tokens = 0
        self.preempted_queries_tokens = 0
        self.preempted_hits_tokens = 0

    # -- queries ---------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks with no request referencing them (cached or not)."""
        return self.free_queue.num_free

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by requests, as vLLM's ``kv_cache_usage_perc``."""
        return 1.0 - self.free_queue.num_free / self.num_blocks

    def blocks_of(self, request_id: int) -> list[int]:
        """The block ids a request holds, in sequence order."""
        return self._request_blocks.get(request_id, [])

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def get_computed_blocks(self, keys: Sequence[int], num_tokens: int) -> tuple[list[int], int]:
        """Longest cached prefix of a request: ``(block ids, hit tokens)``.

        ``keys`` are the request's chained full-block keys; ``num_tokens`` its current length.
        The lookup is counted only once the request is admitted (:meth:`record_lookup`), so a
        request that waits several steps for blocks is not counted several times.
        """
        if not self.enable_prefix_caching:
            return [], 0
        max_hit_blocks = min(len(keys), (num_tokens - 1) // self.block_size)
        hit: list[int] = []
        key_to_block = self._key_to_block
        for i in range(max_hit_blocks):
            block_id = key_to_block.get(keys[i])
            if block_id is None:
                break
            hit.append(block_id)
        return hit, len(hit) * self.block_size

    def cached_prefix_blocks(self, keys: Sequence[int]) -> int:
        """How many leading blocks of ``keys`` are in the cache now (a router's question)."""
        if not self.enable_prefix_caching:
            return 0
        key_to_block = self._key_to_block
        count = 0
        for key in keys:
            if key not in key_to_block:
                break
            count += 1
        return count

    def record_lookup(self, num_tokens: int, num_hit_tokens: int, *, preempted: bool) -> None:
        """Count an admitted request's lookup in the prefix-cache counters.

        As in vLLM, re-admissions of preempted requests are counted apart, so the hit rate says
        how much traffic reused earlier requests' KV, not how much recompute the cache saved.
        """
        if not self.enable_prefix_caching:
            return
        if preempted:
            self.preempted_queries_tokens += num_tokens
            self.preempted_hits_tokens += num_hit_tokens
        else:
            self.queries_tokens += num_tokens
            self.hits_tokens += num_hit_tokens

    # -- mutations -------------------------------------------------------------------------
    def allocate_slots(
        self,
        request_id: int,
        keys: Sequence[int],
        num_computed_tokens: int,
        num_new_tokens: int,
        new_computed_blocks: Sequence[int] = (),
    ) -> bool:
        """Give a request blocks for ``num_new_tokens`` more tokens; False if they don't fit.

        ``new_computed_blocks`` are prefix-cache hits found for a request being (re)started; their
        tokens are already included in ``num_computed_tokens``. Nothing changes on failure.
        """
        total = num_computed_tokens + num_new_tokens
        if not new_computed_blocks:
            # Fast path (most decode steps): the tokens fit in the blocks already held and no
            # block fills up, so there is nothing to allocate or to register in the cache.
            held_now = self._request_blocks.get(request_id)
            if held_now is not None and total <= len(held_now) * self.block_size:
                if not self.enable_prefix_caching:
                    return True
                num_cached = self._request_num_cached[request_id]
                if total // self.block_size <= num_cached or len(keys) <= num_cached:
                    return True
        held = self._request_blocks.setdefault(request_id, [])
        num_required = self.blocks_needed(total)
        num_new_blocks = num_required - len(held) - len(new_computed_blocks)
        # Hit blocks that are free still occupy a free slot until touched.
        num_evictable_hits = sum(1 for b in new_computed_blocks if self._ref_count[b] == 0)
        if num_new_blocks > self.free_queue.num_free - num_evictable_hits:
            if not held:
                del self._request_blocks[request_id]
            return False
        for block_id in new_computed_blocks:
            if self._ref_count[block_id] == 0:
                self.free_queue.remove(block_id)
            self._ref_count[block_id] += 1
        held.extend(new_computed_blocks)
        if request_id not in self._request_num_cached:
            self._request_num_cached[request_id] = len(new_computed_blocks)
        if num_new_blocks > 0:
            held.extend(self._pop_free_blocks(num_new_blocks))
        if self.enable_prefix_caching:
            self._cache_full_blocks(request_id, keys, num_computed_tokens + num_new_tokens)
        return True

    def free(self, request_id: int) -> None:
        """Release a request's blocks; those no longer referenced join the free queue tail-first."""
        held = self._request_blocks.pop(request_id, [])
        self._request_num_cached.pop(request_id, None)
        ref_count = self._ref_count
        released = []
        for block_id in reversed(held):
            count = ref_count[block_id] - 1
            ref_count[block_id] = count
            if count == 0:
                released.append(block_id)
        self.free_queue.extend(released)

    def register_full_blocks(self, request_id: int, keys: Sequence[int], num_tokens: int) -> None:
        """Register the full blocks among a request's first ``num_tokens`` tokens under
        ``keys``, as allocation does (for a request whose keys were left out until now)."""
        if self.enable_prefix_caching and request_id in self._request_blocks:
            self._cache_full_blocks(request_id, keys, num_tokens)

    # -- internals -------------------------------------------------------------------------
    def _pop_free_blocks(self, count: int) -> list[int]:
        """Take ``count`` blocks off the free queue's head, evicting what they cached."""
        block_ids = self.free_queue.popleft_many(count)
        block_key = self._block_key
        key_to_block = self._key_to_block
        ref_count = self._ref_count
        for block_id in block_ids:
            key = block_key[block_id]
            if key is not None:
                # Evict: the block is about to hold other tokens.
                if key_to_block.get(key) == block_id:
                    del key_to_block[key]
                block_key[block_id] = None
            ref_count[block_id] = 1
        return block_ids

    def _cache_full_blocks(self, request_id: int, keys: Sequence[int], num_tokens: int) -> None:
        held = self._request_blocks[request_id]
        num_full = min(num_tokens // self.block_size, len(keys), len(held))
        start = self._request_num_cached[request_id]
        block_key = self._block_key
        key_to_block = self._key_to_block
        for i in range(start, num_full):
            block_id = held[i]
            key = keys[i]
            if block_key[block_id] is None and key not in key_to_block:
                block_key[block_id] = key
                key_to_block[key] = block_id
        if num_full > start:
            self._request_num_cached[request_id] = num_full

    def check_invariants(self) -> None:
        """Assert that blocks are conserved and the index agrees with the blocks (for tests)."""
        referenced: dict[int, int] = {}
        for blocks in self._request_blocks.values():
            for block_id in blocks:
                referenced[block_id] = referenced.get(block_id, 0) + 1
        for block_id in range(self.num_blocks):
            assert self._ref_count[block_id] == referenced.get(block_id, 0), block_id
            assert (block_id in self.free_queue) == (self._ref_count[block_id] == 0), block_id
        assert len(referenced) + self.free_queue.num_free == self.num_blocks
        assert len(self.free_queue.ids()) == self.free_queue.num_free
        for key, block_id in self._key_to_block.items():
            assert self._block_key[block_id] == key
