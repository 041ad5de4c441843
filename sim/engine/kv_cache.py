"""Paged KV cache with prefix caching, modelled on vLLM v1's KV-cache manager.

The cache is a pool of ``num_blocks`` blocks of ``block_size`` tokens. A request holds a list of
blocks covering its computed tokens. With prefix caching on, every *full* block is registered
under its chained key (see :func:`sim.engine.request.block_keys`); a later request whose leading
keys match reuses those blocks instead of recomputing them.

Free blocks sit in an LRU queue (a doubly linked list over block ids, O(1) removal): allocation
pops from the head; a finished request's blocks are appended in reverse order, so its tail blocks
— the least likely to be shared — are evicted first. A free block keeps its key until it is
popped for reuse, so it can still be hit ("touched") and taken back off the queue until then.

A request that no other request can share a block with (the simulator knows the whole workload)
may hold its blocks *anonymously*, by count: it takes them off the queue's head and gives them
back as one anonymous run at the tail, which keeps its place in the LRU order, so what is
evicted, and when, is exactly what it would be with ids. This only saves the simulator per-block
work (see :meth:`KVCacheManager.allocate_slots`).

Differences from vLLM kept on purpose: there is no reserved null block, and when two requests
compute the same block concurrently only the first copy is registered under the key.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class FreeBlockQueue:
    """LRU queue of free blocks: O(1) append, pop from the head, removal from the middle.

    An insertion-ordered dict is the doubly linked list (its C implementation is several times
    faster than one kept in Python lists, and allocation is most of what a long run does).

    Besides block ids, the queue holds *anonymous runs*: so many interchangeable blocks without
    an id, freed together by a request whose blocks no other request can hit (see
    :meth:`KVCacheManager.allocate_slots`). A run keeps its place in the LRU order, so blocks
    with cached content are evicted exactly when they would be; it costs one entry however many
    blocks it holds. Runs are keyed by negative numbers.

    Blocks never used yet are not entries: they are the ids from ``_fresh`` up, ahead of every
    entry (the head of the queue, in id order, as a queue filled with all ids would hold them).
    A replica of a big GPU has tens of thousands of blocks, and a fleet of hundreds of replicas
    would otherwise spend gigabytes on entries for blocks that a run may never touch.
    """

    def __init__(self, num_blocks: int) -> None:
        self._queue: OrderedDict[int, None] = OrderedDict()
        self._fresh = 0  # ids from here to _num_blocks: never used, free, at the head
        self._num_blocks = num_blocks
        self._runs: dict[int, int] = {}  # run key (< 0) -> blocks in it
        self._num_anonymous = 0
        self._next_run = -1

    @property
    def num_free(self) -> int:
        """Blocks in the queue (anonymous ones included)."""
        return (
            len(self._queue)
            - len(self._runs)
            + self._num_anonymous
            + (self._num_blocks - self._fresh)
        )

    @property
    def num_anonymous(self) -> int:
        """Free blocks in anonymous runs."""
        return self._num_anonymous

    def __contains__(self, block_id: int) -> bool:
        return block_id >= 0 and (
            self._fresh <= block_id < self._num_blocks or block_id in self._queue
        )

    def popleft(self) -> int:
        """Remove and return the least recently freed block (there must be no anonymous run
        ahead of it)."""
        ids, anonymous = self.popleft_many(1)
        assert not anonymous, "an anonymous block has no id"
        return ids[0]

    def popleft_many(self, count: int) -> tuple[list[int], int]:
        """Remove the ``count`` least recently freed blocks: ``(their ids, oldest first; how
        many of them were anonymous)``."""
        assert count <= self.num_free, "not enough free blocks"
        ids: list[int] = []
        fresh = self._fresh
        if fresh < self._num_blocks:  # the never-used blocks come first
            take = min(count, self._num_blocks - fresh)
            ids = list(range(fresh, fresh + take))
            self._fresh = fresh + take
            count -= take
            if not count:
                return ids, 0
        queue = self._queue
        popitem = queue.popitem
        runs = self._runs
        if not runs:
            ids += [popitem(False)[0] for _ in range(count)]
            return ids, 0
        head = next(iter(queue))
        if head < 0 and runs[head] > count:  # all from the run at the head, which goes on
            runs[head] -= count
            self._num_anonymous -= count
            return ids, count
        anonymous = 0
        while count:
            key = popitem(False)[0]
            if key >= 0:
                ids.append(key)
                count -= 1
                continue
            run = self._runs.pop(key)
            take = min(run, count)
            anonymous += take
            count -= take
            if run > take:  # the rest of the run stays at the head
                self._runs[key] = run - take
                queue[key] = None
                queue.move_to_end(key, last=False)
        self._num_anonymous -= anonymous
        return ids, anonymous

    def extend(self, block_ids: Sequence[int]) -> None:
        """Append blocks at the tail in the given order."""
        queue = self._queue
        for block_id in block_ids:
            queue[block_id] = None

    def append_anonymous(self, count: int) -> None:
        """Append ``count`` anonymous blocks at the tail (joining a run already there)."""
        if count <= 0:
            return
        queue = self._queue
        tail = next(reversed(queue)) if queue else 0
        if tail < 0:
            self._runs[tail] += count
        else:
            key = self._next_run
            self._next_run -= 1
            self._runs[key] = count
            queue[key] = None
        self._num_anonymous += count

    def remove(self, block_id: int) -> None:
        """Take a block out of the queue wherever it is (a cache hit on a free block)."""
        if block_id >= self._fresh:
            # Never used, so never a cache hit in a run; the never-used blocks become entries
            # at the head, in order, so that one can leave from the middle.
            queue = self._queue
            for fresh_id in reversed(range(self._fresh, self._num_blocks)):
                queue[fresh_id] = None
                queue.move_to_end(fresh_id, last=False)
            self._fresh = self._num_blocks
        del self._queue[block_id]

    def append(self, block_id: int) -> None:
        """Put a block at the tail (most recently freed: evicted last)."""
        assert block_id not in self
        self._queue[block_id] = None

    def ids(self) -> list[int]:
        """Entries from head (next to be evicted) to tail: block ids, and a negative key for each
        anonymous run; for tests and debugging."""
        return [*range(self._fresh, self._num_blocks), *self._queue]

    def runs(self) -> list[int]:
        """The sizes of the anonymous runs, head to tail; for tests and debugging."""
        return [self._runs[key] for key in self._queue if key < 0]


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
        # Σ over blocks of (references − 1): how often requests hold a block another request
        # holds too (a shared prefix), kept as the counts change so that reading it is O(1).
        self.num_shared_references = 0
        self._block_key: list[int | None] = [None] * num_blocks
        self._key_to_block: dict[int, int] = {}
        self._request_blocks: dict[int, list[int]] = {}
        self._request_num_cached: dict[int, int] = {}
        # Anonymous blocks: held by count (request -> blocks; read-only outside), and the ids
        # they stand for.
        # Every id is either concrete (held by requests, or free in the queue under its own id)
        # or spare (standing for one anonymous block, free or held).
        self.anonymous_held: dict[int, int] = {}
        self._spare_ids: list[int] = []
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
    def shared_tokens(self) -> int:
        """Tokens requests hold in blocks that another request holds too, beyond the first
        holder (only full cached blocks are shared): KV that a step over all of them reads from
        memory once if it stays in a cache between readers."""
        return self.num_shared_references * self.block_size

    def num_common_prefix_blocks(self, request_id: int, num_holders: int) -> int:
        """Leading blocks of a request that ``num_holders`` requests hold (vLLM's
        ``get_num_common_prefix_blocks``: with every running request as the holders, the prefix
        they all share, which cascade attention reads once)."""
        ref_count = self._ref_count
        count = 0
        for block_id in self._request_blocks.get(request_id, ()):
            if ref_count[block_id] != num_holders:
                break
            count += 1
        return count

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by requests, as vLLM's ``kv_cache_usage_perc``."""
        return 1.0 - self.free_queue.num_free / self.num_blocks

    def blocks_of(self, request_id: int) -> list[int]:
        """The block ids a request holds, in sequence order (none for anonymous blocks)."""
        return self._request_blocks.get(request_id, [])

    def num_blocks_of(self, request_id: int) -> int:
        """How many blocks a request holds."""
        held = self._request_blocks.get(request_id)
        return (len(held) if held is not None else 0) + self.anonymous_held.get(request_id, 0)

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
        *,
        anonymous: bool = False,
    ) -> bool:
        """Give a request blocks for ``num_new_tokens`` more tokens; False if they don't fit.

        ``new_computed_blocks`` are prefix-cache hits found for a request being (re)started; their
        tokens are already included in ``num_computed_tokens``. Nothing changes on failure.

        ``anonymous``: no other request can ever hit this request's blocks (and it has no keys),
        so it holds them by count, without ids: taking them off the free queue evicts what they
        cached, as always, and freeing them puts one anonymous run at the tail. If it must be
        registered after all (a preemption), :meth:`materialize` gives its blocks ids.
        """
        if anonymous:
            total = num_computed_tokens + num_new_tokens
            if total <= self.num_blocks_of(request_id) * self.block_size:
                return True  # fits in the blocks it holds (most decode steps)
            return self._allocate_anonymous(request_id, total)
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
        if not self._fits(num_new_blocks, new_computed_blocks):
            if not held:
                del self._request_blocks[request_id]
            return False
        for block_id in new_computed_blocks:
            if self._ref_count[block_id] == 0:
                self.free_queue.remove(block_id)
            else:
                self.num_shared_references += 1
            self._ref_count[block_id] += 1
        held.extend(new_computed_blocks)
        if request_id not in self._request_num_cached:
            self._request_num_cached[request_id] = len(new_computed_blocks)
        if num_new_blocks > 0:
            held.extend(self._pop_free_blocks(num_new_blocks))
        if self.enable_prefix_caching:
            self._cache_full_blocks(request_id, keys, num_computed_tokens + num_new_tokens)
        return True

    def allocate_keyed_prefix(
        self,
        request_id: int,
        keys: Sequence[int],
        num_computed_tokens: int,
        num_new_tokens: int,
        id_tokens: int,
        new_computed_blocks: Sequence[int] = (),
    ) -> bool:
        """:meth:`allocate_slots` for a request whose first ``id_tokens`` tokens are the only
        ones another request can share (their keys, ``keys``, stop there): those blocks with
        ids and registered, any after them by count (anonymous, the blocks no request can hit).
        False, and nothing changed, if they do not all fit."""
        total = num_computed_tokens + num_new_tokens
        if total <= id_tokens:
            return self.allocate_slots(
                request_id, keys, num_computed_tokens, num_new_tokens, new_computed_blocks
            )
        needed = self.blocks_needed(total) - self.num_blocks_of(request_id)
        if not self._fits(needed - len(new_computed_blocks), new_computed_blocks):
            return False
        if new_computed_blocks or num_computed_tokens < id_tokens:
            allocated = self.allocate_slots(
                request_id,
                keys,
                num_computed_tokens,
                max(0, id_tokens - num_computed_tokens),
                new_computed_blocks,
            )
            assert allocated
        allocated = self._allocate_anonymous(request_id, total)
        assert allocated
        return True

    def _fits(self, num_new_blocks: int, new_computed_blocks: Sequence[int]) -> bool:
        """Whether ``num_new_blocks`` more blocks can be taken besides the hits
        ``new_computed_blocks``: hit blocks that are free still occupy a free slot until
        touched."""
        evictable_hits = sum(1 for b in new_computed_blocks if self._ref_count[b] == 0)
        return num_new_blocks <= self.free_queue.num_free - evictable_hits

    def _allocate_anonymous(self, request_id: int, total: int) -> bool:
        # A request with a keyed prefix (Sequence.keyed_blocks) holds those blocks by id.
        held = self.anonymous_held.get(request_id, 0)
        num_new_blocks = -(-total // self.block_size) - self.num_blocks_of(request_id)
        if num_new_blocks <= 0:
            return True
        if not self._take_anonymous(num_new_blocks):
            return False
        self.anonymous_held[request_id] = held + num_new_blocks
        return True

    def add_anonymous_blocks(self, request_ids: Sequence[int]) -> bool:
        """One more anonymous block for each of ``request_ids`` (anonymous requests whose next
        token opens a block), taken off the free queue at once; False, and nothing changed, if
        there are not enough free blocks."""
        if not self._take_anonymous(len(request_ids)):
            return False
        held = self.anonymous_held
        for request_id in request_ids:
            held[request_id] = held.get(request_id, 0) + 1
        return True

    def _take_anonymous(self, count: int) -> bool:
        """Take ``count`` blocks off the free queue's head for anonymous requests: those with
        an id give it up (and their cached content). False, nothing taken, if too few."""
        if count > self.free_queue.num_free:
            return False
        block_ids, _ = self.free_queue.popleft_many(count)
        if block_ids:
            self._evict(block_ids)
            self._spare_ids.extend(block_ids)
        return True

    def _take_spare_ids(self, count: int) -> list[int]:
        """``count`` spare ids, for anonymous blocks that become blocks with an id."""
        spare = self._spare_ids
        block_ids = spare[len(spare) - count :]
        del spare[len(spare) - count :]
        return block_ids

    def materialize(self, request_id: int) -> None:
        """Give a request's anonymous blocks ids (so that they can be registered and hit),
        after the blocks it holds by id (a keyed prefix) if any."""
        count = self.anonymous_held.pop(request_id, 0)
        if not count:
            return
        block_ids = self._take_spare_ids(count)
        for block_id in block_ids:
            self._ref_count[block_id] = 1
        held = self._request_blocks.get(request_id)
        if held is None:
            self._request_blocks[request_id] = block_ids
            self._request_num_cached[request_id] = 0
        else:
            held.extend(block_ids)

    def free(self, request_id: int) -> None:
        """Release a request's blocks; those no longer referenced join the free queue tail-first."""
        anonymous = self.anonymous_held.pop(request_id, 0)
        if anonymous:
            # The sequence's last blocks: they join the queue before its blocks with ids.
            self.free_queue.append_anonymous(anonymous)
        held = self._request_blocks.pop(request_id, None)
        if held is None:
            return
        self._request_num_cached.pop(request_id, None)
        ref_count = self._ref_count
        released = []
        for block_id in reversed(held):
            count = ref_count[block_id] - 1
            ref_count[block_id] = count
            if count == 0:
                released.append(block_id)
            else:
                self.num_shared_references -= 1
        self.free_queue.extend(released)

    def register_full_blocks(self, request_id: int, keys: Sequence[int], num_tokens: int) -> None:
        """Register the full blocks among a request's first ``num_tokens`` tokens under
        ``keys``, as allocation does (for a request whose keys were left out until now)."""
        if self.enable_prefix_caching and request_id in self._request_blocks:
            self._cache_full_blocks(request_id, keys, num_tokens)

    # -- internals -------------------------------------------------------------------------
    def _pop_free_blocks(self, count: int) -> list[int]:
        """Take ``count`` blocks off the free queue's head, evicting what they cached (anonymous
        ones are given spare ids)."""
        block_ids, anonymous = self.free_queue.popleft_many(count)
        self._evict(block_ids)  # they are about to hold other tokens
        if anonymous:
            block_ids.extend(self._take_spare_ids(anonymous))
        ref_count = self._ref_count
        for block_id in block_ids:
            ref_count[block_id] = 1
        return block_ids

    def _evict(self, block_ids: list[int]) -> None:
        """Forget what the blocks cached (they were taken off the free queue for reuse)."""
        block_key = self._block_key
        key_to_block = self._key_to_block
        for block_id in block_ids:
            key = block_key[block_id]
            if key is not None:
                if key_to_block.get(key) == block_id:
                    del key_to_block[key]
                block_key[block_id] = None

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
        spare_set = set(self._spare_ids)
        assert self.num_shared_references == sum(n - 1 for n in referenced.values())
        for block_id in range(self.num_blocks):
            assert self._ref_count[block_id] == referenced.get(block_id, 0), block_id
            in_queue = block_id in self.free_queue
            assert in_queue == (self._ref_count[block_id] == 0 and block_id not in spare_set)
        queue = self.free_queue
        spare = self._spare_ids
        assert len(set(spare)) == len(spare) and not set(spare) & set(referenced)
        assert queue.num_anonymous + sum(self.anonymous_held.values()) == len(spare)
        free_ids = [b for b in queue.ids() if b >= 0]
        assert not set(spare) & set(free_ids)
        assert len(referenced) + len(free_ids) + len(spare) == self.num_blocks
        assert len(free_ids) + queue.num_anonymous == queue.num_free
        assert sum(queue.runs()) == queue.num_anonymous
        for block_id in spare:
            assert self._block_key[block_id] is None and self._ref_count[block_id] == 0
        for key, block_id in self._key_to_block.items():
            assert self._block_key[block_id] == key
