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

from collections.abc import Sequence

_NIL = -1


class FreeBlockQueue:
    """LRU queue of free block ids: O(1) append, pop from the head, removal from the middle."""

    def __init__(self, num_blocks: int) -> None:
        self._prev = [i - 1 for i in range(num_blocks)]
        self._next = [i + 1 for i in range(num_blocks)]
        self._in_queue = [True] * num_blocks
        if num_blocks:
            self._next[-1] = _NIL
        self._head = 0 if num_blocks else _NIL
        self._tail = num_blocks - 1 if num_blocks else _NIL
        self.num_free = num_blocks

    def __contains__(self, block_id: int) -> bool:
        return self._in_queue[block_id]

    def popleft(self) -> int:
        """Remove and return the least recently freed block."""
        block_id = self._head
        assert block_id != _NIL, "no free blocks"
        self.remove(block_id)
        return block_id

    def remove(self, block_id: int) -> None:
        """Take a block out of the queue wherever it is (a cache hit on a free block)."""
        assert self._in_queue[block_id]
        prev, nxt = self._prev[block_id], self._next[block_id]
        if prev == _NIL:
            self._head = nxt
        else:
            self._next[prev] = nxt
        if nxt == _NIL:
            self._tail = prev
        else:
            self._prev[nxt] = prev
        self._in_queue[block_id] = False
        self.num_free -= 1

    def append(self, block_id: int) -> None:
        """Put a block at the tail (most recently freed: evicted last)."""
        assert not self._in_queue[block_id]
        self._prev[block_id] = self._tail
        self._next[block_id] = _NIL
        if self._tail == _NIL:
            self._head = block_id
        else:
            self._next[self._tail] = block_id
        self._tail = block_id
        self._in_queue[block_id] = True
        self.num_free += 1

    def ids(self) -> list[int]:
        """Block ids from head (next to be evicted) to tail; for tests and debugging."""
        out = []
        block_id = self._head
        while block_id != _NIL:
            out.append(block_id)
            block_id = self._next[block_id]
        return out


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
            if (
                held_now is not None
                and total <= len(held_now) * self.block_size
                and (
                    not self.enable_prefix_caching
                    or total // self.block_size <= self._request_num_cached[request_id]
                )
            ):
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
        for _ in range(max(num_new_blocks, 0)):
            held.append(self._pop_free_block())
        if self.enable_prefix_caching:
            self._cache_full_blocks(request_id, keys, num_computed_tokens + num_new_tokens)
        return True

    def free(self, request_id: int) -> None:
        """Release a request's blocks; those no longer referenced join the free queue tail-first."""
        held = self._request_blocks.pop(request_id, [])
        self._request_num_cached.pop(request_id, None)
        for block_id in reversed(held):
            self._ref_count[block_id] -= 1
            assert self._ref_count[block_id] >= 0
            if self._ref_count[block_id] == 0:
                self.free_queue.append(block_id)

    # -- internals -------------------------------------------------------------------------
    def _pop_free_block(self) -> int:
        block_id = self.free_queue.popleft()
        key = self._block_key[block_id]
        if key is not None:
            # Evict: the block is about to hold other tokens.
            if self._key_to_block.get(key) == block_id:
                del self._key_to_block[key]
            self._block_key[block_id] = None
        assert self._ref_count[block_id] == 0
        self._ref_count[block_id] = 1
        return block_id

    def _cache_full_blocks(self, request_id: int, keys: Sequence[int], num_tokens: int) -> None:
        held = self._request_blocks[request_id]
        num_full = min(num_tokens // self.block_size, len(keys), len(held))
        start = self._request_num_cached[request_id]
        for i in range(start, num_full):
            block_id = held[i]
            key = keys[i]
            if self._block_key[block_id] is None and key not in self._key_to_block:
                self._block_key[block_id] = key
                self._key_to_block[key] = block_id
        self._request_num_cached[request_id] = max(start, num_full)

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
