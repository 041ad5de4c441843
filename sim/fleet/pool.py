"""Replicas behind a router in one SimPy environment.

A :class:`Fleet` owns the replicas (each its own scheduler, KV cache and iteration-time model,
made by an engine factory), routes each arriving request with a :class:`~sim.fleet.router.Router`,
and samples the fleet into one time series. Replicas can be added (ready after a start-up delay)
and drained (no new requests; the ones they hold finish) while the simulation runs, which is
what an autoscaler does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import simpy

from sim.engine.latency import IterationTimeModel
from sim.engine.replica import Replica
from sim.engine.request import (
    ALL_SHARED_FIRST,
    Record,
    Request,
    Segment,
    block_keys,
    sequence_segments,
)
from sim.engine.scheduler import Scheduler
from sim.fleet.router import Router
from sim.fleet.timeseries import Sample, SampledSeries

#: The most keyed prefixes whose keys a fleet keeps (a trace may have many distinct ones).
PREFIX_KEYS_CACHED = 4096

#: Makes replica ``i``'s engine: its scheduler (with its own KV cache) and step-time model.
EngineFactory = Callable[[int], tuple[Scheduler, IterationTimeModel]]


@dataclass(frozen=True)
class ReplicaHardware:
    """What replica ``i`` runs on, for cost: its GPU, how many, and the price per GPU-hour."""

    gpu: str = "unknown"
    num_gpus: int = 1
    gpu_hour_usd: float | None = None


#: Says what replica ``i`` runs on.
HardwareOf = Callable[[int], ReplicaHardware]


class FleetReplica(Replica):
    """A replica as the router sees it: outstanding requests, KV use, cached prefixes."""

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
        # Replica's parameters spelled out, not *args/**kwargs: mypyc (tools/build_native.py)
        # compiles this class and cannot forward them to a compiled base.
        super().__init__(
            env,
            replica_id,
            scheduler,
            latency_model,
            max_model_len=max_model_len,
            on_finish=on_finish,
        )
        self.num_submitted = 0
        self.num_finished = 0
        self.accepting = True
        self.ready = True
        self.hardware = ReplicaHardware()
        self.started_s = 0.0
        self.drained_s: float | None = None  # when it stopped taking requests
        self.stopped_s: float | None = None  # when it had finished them

    @property
    def outstanding(self) -> int:
        """Requests routed here and not finished (waiting + running)."""
        return self.num_submitted - self.num_finished

    @property
    def kv_usage(self) -> float:
        self.sync()
        return self.kv.usage

    def cached_prefix_blocks(self, keys: Sequence[int]) -> int:
        self.sync()
        return self.kv.cached_prefix_blocks(keys)


@dataclass
class _Totals:
    """Counters summed over every replica that ever ran (removed ones included)."""

    busy_s: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0
    queries_tokens: int = 0
    hits_tokens: int = 0


class Fleet:
    """Replicas behind a router; see the module docstring."""

    def __init__(
        self,
        env: simpy.Environment,
        make_engine: EngineFactory,
        router: Router,
        *,
        num_replicas: int,
        max_model_len: int,
        on_finish: Callable[[Record], None],
        id_offset: int = 0,
        hardware: HardwareOf | None = None,
    ) -> None:
        if num_replicas < 1:
            raise ValueError(f"fleet.replicas: must be >= 1, got {num_replicas}")
        self.env = env
        self.make_engine = make_engine
        self.router = router
        self.max_model_len = max_model_len
        self._on_finish = on_finish
        self.id_offset = id_offset  # replica ids start here (a second pool numbers on)
        self.hardware = hardware or (lambda i: ReplicaHardware())
        self.replicas: list[FleetReplica] = []
        self.series = SampledSeries()  # the pool's samples (the run may give it a writer)
        self._last = (0.0, _Totals())
        self._pending: list[tuple[Request, Record, dict[str, Any]]] = []
        self._accepting_cache: list[FleetReplica] | None = None
        # The first stream of more than one request's sequence (None: treat all as shared).
        # A request starting with any other stream shares no block with another request.
        self.shared_sources: frozenset[int] | None = None
        # Requests that can share only their first segment (see set_shared_sources).
        self.keyed_prefixes: frozenset[int] | None = None
        # The keys of a keyed prefix, by its segment and length: every request that starts with
        # the same system prompt has the same ones (at most PREFIX_KEYS_CACHED kept).
        self._prefix_keys: dict[tuple[Segment, int], list[int]] = {}
        for _ in range(num_replicas):
            self.add_replica(startup_s=0.0)

    # -- membership --------------------------------------------------------------------------
    def add_replica(self, startup_s: float) -> FleetReplica:
        """A new replica, ready (and routed to) after ``startup_s`` seconds."""
        replica_id = self.id_offset + len(self.replicas)
        scheduler, latency_model = self.make_engine(len(self.replicas))
        hardware = self.hardware(len(self.replicas))
        replica = FleetReplica(
            self.env,
            replica_id,
            scheduler,
            latency_model,
            max_model_len=self.max_model_len,
            on_finish=self._finished,
        )
        replica.started_s = self.env.now
        replica.hardware = hardware
        self.replicas.append(replica)
        self._accepting_cache = None
        if startup_s > 0:
            replica.ready = False
            self.env.process(self._become_ready(replica, startup_s))
        return replica

    def _become_ready(self, replica: FleetReplica, startup_s: float) -> Generator[Any, Any, None]:
        yield self.env.timeout(startup_s)
        replica.ready = True
        self._accepting_cache = None
        pending, self._pending = self._pending, []
        for request, record, options in pending:  # requests that found no replica accepting
            self.submit(request, record, **options)

    def drain(self, replica: FleetReplica) -> None:
        """Stop routing to ``replica``; it finishes what it holds and then stops."""
        replica.accepting = False
        self._accepting_cache = None
        replica.drained_s = self.env.now
        if replica.outstanding == 0:
            replica.stopped_s = self.env.now

    @property
    def accepting(self) -> list[FleetReplica]:
        """Replicas the router may choose: ready and not draining (a fresh list)."""
        return list(self._accepting())

    def _accepting(self) -> list[FleetReplica]:
        # Every arrival asks; membership changes only in add_replica, _become_ready and drain.
        if self._accepting_cache is None:
            self._accepting_cache = [r for r in self.replicas if r.ready and r.accepting]
        return self._accepting_cache

    @property
    def starting(self) -> list[FleetReplica]:
        return [r for r in self.replicas if not r.ready and r.accepting]

    @property
    def draining(self) -> list[FleetReplica]:
        return [r for r in self.replicas if not r.accepting and r.stopped_s is None]

    # -- traffic -----------------------------------------------------------------------------
    def submit(self, request: Request, record: Record, **options: Any) -> None:
        """Route ``request`` to a replica now; it waits for one when none is ready.
        ``options`` go to :meth:`Replica.submit` (disaggregated serving)."""
        candidates = self._accepting()
        if not candidates:
            self._pending.append((request, record, options))
            return
        kv = candidates[0].kv
        caching = kv.enable_prefix_caching  # decided once, when the fleet's engines were built
        exclusive = caching and self._exclusive(request)
        cached = caching and not exclusive
        keyed_blocks = self._keyed_blocks(request, kv.block_size) if cached else 0
        # Prefix affinity places even a request that caches nothing by its first keys. A
        # request no replica can serve is rejected by the one it reaches: no keys for it (a
        # hostile length would build millions).
        keys: list[int] = []
        affinity = self.router.policy == "prefix_affinity"
        if (cached or affinity) and not candidates[0].rejection(request):
            # A request with a keyed prefix needs only its keys, unless the router reads all.
            if keyed_blocks and not affinity:
                keys = self._keyed_prefix_keys(
                    request.segments[0], kv.block_size, keyed_blocks * kv.block_size
                )
            else:
                keys = block_keys(sequence_segments(request), kv.block_size, request.total_tokens)
        prompt_blocks = request.prompt_tokens // kv.block_size
        chosen = self.router.choose(
            candidates, keys, request.session_id, prompt_blocks, shareable=not exclusive
        )
        assert isinstance(chosen, FleetReplica)
        chosen.num_submitted += 1
        chosen.submit(
            request,
            record,
            keys=(keys[:keyed_blocks] if keyed_blocks else keys) if cached else [],
            exclusive=exclusive,
            keyed_blocks=keyed_blocks,
            **options,
        )

    def _keyed_prefix_keys(self, first: Segment, block_size: int, num_tokens: int) -> list[int]:
        """The keys of the first ``num_tokens`` tokens of a keyed prefix (its first segment),
        shared by every request that starts with it; read-only (a preempted request computes
        its own, all of them)."""
        cache_key = (first, num_tokens)
        keys = self._prefix_keys.get(cache_key)
        if keys is None:
            if len(self._prefix_keys) >= PREFIX_KEYS_CACHED:
                self._prefix_keys.clear()
            keys = block_keys((first,), block_size, num_tokens)
            self._prefix_keys[cache_key] = keys
        return keys

    def _keyed_blocks(self, request: Request, block_size: int) -> int:
        """How many leading blocks of a request other requests may share when nothing after
        its first segment can be shared (:attr:`keyed_prefixes`): the full blocks of that
        segment (0: every block is keyed, as a request of unknown structure)."""
        keyed = self.keyed_prefixes
        if keyed is None or not request.segments:
            return 0
        if keyed is not ALL_SHARED_FIRST and request.request_id not in keyed:
            return 0
        first = request.segments[0][1]
        if first >= request.prompt_tokens:
            return 0
        return first // block_size

    def _exclusive(self, request: Request) -> bool:
        """No other request's sequence starts like this one's (known only once
        :meth:`set_shared_sources` has run), so it can share no block."""
        return self.shared_sources is not None and (
            not request.segments or request.segments[0][0] not in self.shared_sources
        )

    def set_shared_sources(
        self, sources: frozenset[int], keyed_prefixes: frozenset[int] | None = None
    ) -> None:
        """Mark which requests can share blocks: those whose first stream is in ``sources``
        (:func:`~sim.engine.request.shared_first_sources`); and which of them can share only
        their first segment's blocks: the ids in ``keyed_prefixes``, or
        :data:`ALL_SHARED_FIRST` (None: not known, every block keyed)."""
        self.shared_sources = sources
        self.keyed_prefixes = keyed_prefixes

    def replica(self, replica_id: int) -> FleetReplica:
        return self.replicas[replica_id - self.id_offset]

    def _finished(self, record: Record) -> None:
        replica = self.replica(record.replica_id)
        replica.num_finished += 1
        if not replica.accepting and replica.outstanding == 0 and replica.stopped_s is None:
            replica.stopped_s = self.env.now
        self._on_finish(record)

    # -- observation -------------------------------------------------------------------------
    def totals(self) -> _Totals:
        totals = _Totals()
        for replica in self.replicas:
            replica.sync()
            totals.busy_s += replica.busy_s
            totals.prompt_tokens += replica.prompt_tokens_computed
            totals.output_tokens += replica.output_tokens_generated
            totals.queries_tokens += replica.kv.queries_tokens
            totals.hits_tokens += replica.kv.hits_tokens
        return totals

    def sample(self, now: float, num_finished: int, num_ok: int) -> None:
        """Add one sample to :attr:`series`; rates and the hit rate are over the last interval."""
        last_t, last = self._last
        totals = self.totals()
        live = [r for r in self.replicas if r.ready and r.stopped_s is None]
        dt = now - last_t
        queries = totals.queries_tokens - last.queries_tokens
        hits = totals.hits_tokens - last.hits_tokens
        busy = totals.busy_s - last.busy_s

        def per_s(x: float) -> float:
            return x / dt if dt > 0 else 0.0

        self.series.add(
            Sample(
                time_s=now,
                num_requests_waiting=sum(r.num_waiting for r in self.replicas) + len(self._pending),
                num_requests_running=sum(r.scheduler.num_running for r in self.replicas),
                kv_cache_usage=sum(r.kv.usage for r in live) / len(live) if live else 0.0,
                prefix_cache_hit_rate=hits / queries if queries > 0 else 0.0,
                prompt_tokens_per_s=per_s(totals.prompt_tokens - last.prompt_tokens),
                output_tokens_per_s=per_s(totals.output_tokens - last.output_tokens),
                busy_fraction=min(1.0, per_s(busy) / len(live)) if live else 0.0,
                num_finished=num_finished,
                num_ok=num_ok,
                num_replicas=len(self.accepting),
                num_replicas_starting=len(self.starting),
                num_replicas_draining=len(self.draining),
                cost_usd_per_hour=self.cost_per_hour(),
            )
        )
        self._last = (now, totals)

    def cost_per_hour(self) -> float:
        """USD per hour of every replica started and not stopped (NaN if one has no price)."""
        total = 0.0
        for replica in self.replicas:
            if replica.stopped_s is None:
                price = replica.hardware.gpu_hour_usd
                if price is None:
                    return math.nan
                total += price * replica.hardware.num_gpus
        return total

    def replica_summary(self, end_s: float) -> list[dict[str, Any]]:
        """Per replica: requests routed, hit rate, busy fraction of its lifetime, preemptions."""
        out = []
        for replica in self.replicas:
            kv = replica.kv
            stop = replica.stopped_s if replica.stopped_s is not None else end_s
            lifetime = max(0.0, stop - replica.started_s)
            out.append(
                {
                    "replica_id": replica.replica_id,
                    "requests": replica.num_submitted,
                    "prefix_cache_hit_rate": (
                        kv.hits_tokens / kv.queries_tokens if kv.queries_tokens else None
                    ),
                    "busy_fraction": replica.busy_s / lifetime if lifetime > 0 else None,
                    "preemptions": replica.scheduler.num_preemptions,
                    "gpu": replica.hardware.gpu,
                    "num_gpus": replica.hardware.num_gpus,
                    "started_s": replica.started_s,
                    "drained_s": replica.drained_s,
                    "stopped_s": replica.stopped_s,
                }
            )
        return out
