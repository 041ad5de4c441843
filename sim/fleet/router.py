"""Routing requests across replicas: which engine gets the next request.

A router sees each replica through :class:`ReplicaLoad` (its outstanding requests, KV use, and
how many leading blocks of a prompt it holds in its prefix cache) and picks one among those
accepting traffic (ready and not draining). Policies:

``round_robin``
    The next accepting replica in turn.
``random``
    Uniformly at random (the scenario's seeded generator).
``least_outstanding``
    Fewest requests submitted and not finished (waiting + running), as a least-request load
    balancer counts them; ties go to the lowest replica id.
``least_kv``
    Lowest KV-cache use, then fewest outstanding.
``prefix_affinity``
    Cache-aware routing with a load bound, as SGLang's router and llm-d's prefix scorer do it:
    the replica holding the longest cached prefix of the prompt — when that prefix is at least
    ``min_match`` of the prompt's blocks (a short common prefix, such as a system prompt every
    replica holds, says nothing about where the request belongs) — unless it is over the load
    bound — its outstanding requests (this one included) above both ``load_bound ×`` the mean
    and the mean plus ``load_slack`` (at light load a few extra requests cost a replica little,
    while a cache miss costs a whole prefill); with no cached prefix, the replica that a rendezvous
    hash of the prompt's first block (or of the session, for multi-turn traffic) picks, under
    the same bound, so that requests sharing a prefix meet on one replica even before it is
    cached; when every candidate is over the bound, the least-outstanding replica. Later turns
    of a session stick to the replica of their first turn while it is within the bound.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

RouterPolicy = Literal["round_robin", "random", "least_outstanding", "least_kv", "prefix_affinity"]
ROUTER_POLICIES: tuple[str, ...] = (
    "round_robin",
    "random",
    "least_outstanding",
    "least_kv",
    "prefix_affinity",
)


class ReplicaLoad(Protocol):
    """What a router may know about a replica."""

    replica_id: int

    @property
    def outstanding(self) -> int: ...

    @property
    def kv_usage(self) -> float: ...

    def cached_prefix_blocks(self, keys: Sequence[int]) -> int: ...


@dataclass
class Router:
    """Chooses a replica for each request; stateful (turn counter, session map)."""

    policy: RouterPolicy
    rng: np.random.Generator
    load_bound: float = 1.25
    load_slack: int = 8
    min_match: float = 0.5
    _turn: int = 0
    _sessions: dict[int, int] = field(default_factory=dict)
    # First block key → the replicas that requests starting with that block went to: only
    # those can hold a prefix of a request with the same first block (keys are chained), so
    # only they are asked how much of it they hold (a fleet of hundreds asks a few, not all).
    _holders: dict[int, set[int]] = field(default_factory=dict)
    num_affinity_hits: int = 0
    num_hash_placements: int = 0
    num_overflows: int = 0

    def __post_init__(self) -> None:
        if self.policy not in ROUTER_POLICIES:
            raise ValueError(
                f"router.policy: must be one of {', '.join(ROUTER_POLICIES)}; got {self.policy!r}"
            )
        if not 0.0 <= self.min_match <= 1.0:
            raise ValueError(f"router.min_match: must be within [0, 1], got {self.min_match}")
        if not self.load_bound >= 1.0:
            raise ValueError(f"router.load_bound: must be >= 1, got {self.load_bound}")
        if self.load_slack < 0:
            raise ValueError(f"router.load_slack: must be >= 0, got {self.load_slack}")

    def choose(
        self,
        candidates: Sequence[ReplicaLoad],
        keys: Sequence[int],
        session_id: int = -1,
        prompt_blocks: int | None = None,
        shareable: bool = True,
    ) -> ReplicaLoad:
        """The replica for a request whose sequence has block ``keys`` (chained, full blocks),
        ``prompt_blocks`` of them its prompt's (all of them when not given). A request that is
        not ``shareable`` starts with content no other request has: no replica can hold its
        prefix, and no later request will look for its blocks."""
        if not candidates:
            raise ValueError("no replica is accepting requests")
        match self.policy:
            case "round_robin":
                chosen = candidates[self._turn % len(candidates)]
                self._turn += 1
                return chosen
            case "random":
                return candidates[int(self.rng.integers(len(candidates)))]
            case "least_outstanding":
                return _least_outstanding(candidates)
            case "least_kv":
                return min(candidates, key=lambda r: (r.kv_usage, r.outstanding, r.replica_id))
            case "prefix_affinity":
                blocks = len(keys) if prompt_blocks is None else prompt_blocks
                return self._affinity(candidates, keys, session_id, blocks, shareable)
        raise AssertionError(self.policy)

    def _affinity(
        self,
        candidates: Sequence[ReplicaLoad],
        keys: Sequence[int],
        session_id: int,
        prompt_blocks: int,
        shareable: bool,
    ) -> ReplicaLoad:
        mean = sum(r.outstanding for r in candidates) / len(candidates)
        limit = max(self.load_bound * (mean + 1.0), mean + 1.0 + self.load_slack)

        def within(replica: ReplicaLoad) -> bool:
            return replica.outstanding + 1 <= limit

        chosen: ReplicaLoad | None = None
        if session_id >= 0 and session_id in self._sessions:
            sticky = next(
                (r for r in candidates if r.replica_id == self._sessions[session_id]), None
            )
            if sticky is not None and within(sticky):
                chosen = sticky
        holders = self._holders.get(keys[0]) if keys and shareable else None
        if chosen is None and holders:
            matched = [
                (r.cached_prefix_blocks(keys), r) for r in candidates if r.replica_id in holders
            ]
            best_blocks = max((blocks for blocks, _ in matched), default=0)
            if best_blocks > 0 and best_blocks >= self.min_match * prompt_blocks:
                best = [r for blocks, r in matched if blocks == best_blocks and within(r)]
                if best:
                    chosen = min(best, key=lambda r: (r.outstanding, r.replica_id))
                    self.num_affinity_hits += 1
        if chosen is None:
            anchor = session_id if session_id >= 0 else (keys[0] if keys else None)
            if anchor is not None:
                by_id = {r.replica_id: r for r in candidates}
                for replica_id in _rendezvous_order(anchor, tuple(by_id)):
                    if within(replica := by_id[replica_id]):
                        chosen = replica
                        self.num_hash_placements += 1
                        break
        if chosen is None:
            chosen = _least_outstanding(candidates)
            self.num_overflows += 1
        if session_id >= 0:
            self._sessions[session_id] = chosen.replica_id
        if keys and shareable:
            self._holders.setdefault(keys[0], set()).add(chosen.replica_id)
        return chosen


def _least_outstanding(candidates: Sequence[ReplicaLoad]) -> ReplicaLoad:
    return min(candidates, key=lambda r: (r.outstanding, r.replica_id))


@functools.lru_cache(maxsize=4096)
def _rendezvous_order(anchor: int, replica_ids: tuple[int, ...]) -> tuple[int, ...]:
    """``replica_ids`` in rendezvous order for ``anchor``; the orders of the anchors many
    requests share (system prompts, sessions) are kept, not hashed again for each request."""
    return tuple(sorted(replica_ids, key=lambda replica_id: _rendezvous(anchor, replica_id)))


def _rendezvous(anchor: int, replica_id: int) -> bytes:
    """Highest-random-weight order (ascending digest first): stable as replicas come and go."""
    return hashlib.blake2b(f"{anchor}:{replica_id}".encode(), digest_size=8).digest()
