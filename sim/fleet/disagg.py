"""Prefill/decode disaggregation: separate prefill and decode pools (xP:yD).

A request is routed to a prefill replica, which computes its prompt and first token and keeps
the prompt's KV. A decode replica is then chosen; once it has allocated blocks for the prompt,
the KV moves over the link between them (``link_latency_s + prompt KV bytes per GPU /
link bandwidth``), occupying both ends while in flight. When it has arrived the prefill replica
frees its copy, the first token reaches the client (so TTFT includes the transfer, as with
vLLM's disaggregated proxy, which answers from the decode instance), and the decode replica
generates the rest. A request the decode pool rejects (prompt and output longer than
``max_model_len``) was prefilled with one output token; its prefill copy is freed at once.

The pools can differ in GPU type and tensor parallelism; each is a :class:`~sim.fleet.pool.Fleet`
with its own router. Decode replicas are numbered after the prefill ones, so a record's
``replica_id`` tells which decode replica finished it and the summary lists both pools.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import simpy

from sim.engine.request import Record, Request, RequestStatus
from sim.engine.sequence import Sequence
from sim.fleet.pool import EngineFactory, Fleet, FleetReplica, HardwareOf, _Totals
from sim.fleet.router import Router
from sim.fleet.timeseries import Sample, SampledSeries


@dataclass(frozen=True)
class DisaggConfig:
    """Pool sizes, their engines and routers, and the KV transfer's cost."""

    num_prefill: int
    num_decode: int
    make_prefill: EngineFactory
    make_decode: EngineFactory
    prefill_router: Router
    decode_router: Router
    kv_bytes_per_token: float  # per GPU of the prefill pool (each GPU sends its shard)
    link_bandwidth_bytes_per_s: float
    link_latency_s: float
    prefill_hardware: HardwareOf | None = None
    decode_hardware: HardwareOf | None = None

    def transfer_s(self, prompt_tokens: int) -> float:
        return (
            self.link_latency_s
            + prompt_tokens * self.kv_bytes_per_token / self.link_bandwidth_bytes_per_s
        )


class DisaggregatedFleet:
    """The two pools and the hand-off between them; the same interface as :class:`Fleet`."""

    def __init__(
        self,
        env: simpy.Environment,
        config: DisaggConfig,
        *,
        max_model_len: int,
        on_finish: Callable[[Record], None],
    ) -> None:
        self.env = env
        self.config = config
        self._on_finish = on_finish
        self.prefill = Fleet(
            env,
            config.make_prefill,
            config.prefill_router,
            num_replicas=config.num_prefill,
            max_model_len=max_model_len,
            on_finish=self._prefilled,
            hardware=config.prefill_hardware,
        )
        self.decode = Fleet(
            env,
            config.make_decode,
            config.decode_router,
            num_replicas=config.num_decode,
            max_model_len=max_model_len,
            on_finish=self._decoded,
            id_offset=config.num_prefill,
            hardware=config.decode_hardware,
        )
        self.router = config.prefill_router
        self._pending: dict[int, tuple[Request, Record]] = {}
        # Prefill replicas holding a request's KV that no decode replica has admitted yet.
        self._unsent: dict[int, FleetReplica] = {}
        self.transfer_s: list[float] = []
        self.series = SampledSeries()  # fleet-wide; each pool keeps its own too

    @property
    def replicas(self) -> list[FleetReplica]:
        return self.prefill.replicas + self.decode.replicas

    def submit(self, request: Request, record: Record) -> None:
        """Send the prompt to the prefill pool (one output token, KV held for the hand-off)."""
        self._pending[request.request_id] = (request, record)
        prefill_request = dataclasses.replace(request, output_tokens=1)
        prefill_record = Record(request.request_id, record.arrival_s, request.prompt_tokens, 1)
        self.prefill.submit(prefill_request, prefill_record, hold_kv=True)

    def _prefilled(self, prefill_record: Record) -> None:
        request, record = self._pending.pop(prefill_record.request_id)
        source = self.prefill.replica(prefill_record.replica_id)
        record.scheduled_s = prefill_record.scheduled_s
        record.cached_tokens = prefill_record.cached_tokens
        record.num_preemptions += prefill_record.num_preemptions
        if prefill_record.status != RequestStatus.OK or request.output_tokens == 1:
            # Rejected by the prefill replica, or already complete: nothing to hand off.
            if prefill_record.status == RequestStatus.OK:
                source.release_kv(request.request_id)
            record.replica_id = prefill_record.replica_id
            record.status, record.error = prefill_record.status, prefill_record.error
            record.first_token_s = prefill_record.first_token_s
            record.finish_s = prefill_record.finish_s
            record.token_times_s = prefill_record.token_times_s
            self._on_finish(record)
            return
        transfer_s = self.config.transfer_s(request.prompt_tokens)
        self.transfer_s.append(transfer_s)

        def admitted(seq: Sequence, start_s: float) -> None:
            # Blocks are allocated on the decode side: the KV moves now, held at both ends.
            self._unsent.pop(request.request_id, None)
            seq.record.first_token_s = seq.kv_ready_s
            recording = bool(prefill_record.token_times_s)
            self.env.process(self._kv_arrives(source, seq, seq.kv_ready_s, recording))

        self._unsent[request.request_id] = source
        self.decode.submit(request, record, remote_transfer_s=transfer_s, on_kv_admitted=admitted)

    def _decoded(self, record: Record) -> None:
        """A request the decode pool finished. One it never admitted (rejected: prompt and
        output longer than max_model_len, or than its cache) frees the prefill replica's copy,
        which no transfer will release."""
        source = self._unsent.pop(record.request_id, None)
        if source is not None:
            source.release_kv(record.request_id)
        self._on_finish(record)

    def _kv_arrives(
        self, replica: FleetReplica, seq: Sequence, at_s: float, recording: bool
    ) -> Generator[simpy.Event, Any, None]:
        """At ``at_s`` the prompt's KV has crossed: the prefill replica frees its copy and the
        first token reaches the client, its time kept when ``recording`` token times (the
        decode replica records the later ones) unless the decode replica preempted the request
        meanwhile, to recompute the prompt itself."""
        yield self.env.timeout(max(0.0, at_s - self.env.now))
        replica.release_kv(seq.request_id)
        if recording and seq.kv_ready_s == at_s:
            times = seq.record.token_times_s
            seq.record.token_times_s = [at_s] if times is None else [at_s, *times]

    # -- the Fleet interface the simulation samples and summarises ----------------------------
    def totals(self) -> _Totals:
        a, b = self.prefill.totals(), self.decode.totals()
        return _Totals(
            busy_s=a.busy_s + b.busy_s,
            prompt_tokens=a.prompt_tokens + b.prompt_tokens,
            output_tokens=a.output_tokens + b.output_tokens,
            queries_tokens=a.queries_tokens + b.queries_tokens,
            hits_tokens=a.hits_tokens + b.hits_tokens,
        )

    def sample(self, now: float, num_finished: int, num_ok: int) -> None:
        """One row over both pools: sums, KV use and busy fraction averaged over replicas."""
        self.prefill.sample(now, num_finished, num_ok)
        self.decode.sample(now, num_finished, num_ok)
        p, d = self.prefill.series.last, self.decode.series.last
        n_p, n_d = max(1.0, p.num_replicas), max(1.0, d.num_replicas)
        self.series.add(
            Sample(
                time_s=now,
                num_requests_waiting=p.num_requests_waiting + d.num_requests_waiting,
                num_requests_running=p.num_requests_running + d.num_requests_running,
                kv_cache_usage=(p.kv_cache_usage * n_p + d.kv_cache_usage * n_d) / (n_p + n_d),
                # prefix-cache lookups happen on the prefill side
                prefix_cache_hit_rate=p.prefix_cache_hit_rate,
                prompt_tokens_per_s=p.prompt_tokens_per_s + d.prompt_tokens_per_s,
                output_tokens_per_s=p.output_tokens_per_s + d.output_tokens_per_s,
                busy_fraction=(p.busy_fraction * n_p + d.busy_fraction * n_d) / (n_p + n_d),
                num_finished=num_finished,
                num_ok=num_ok,
                num_replicas=p.num_replicas + d.num_replicas,
                num_replicas_starting=p.num_replicas_starting + d.num_replicas_starting,
                num_replicas_draining=p.num_replicas_draining + d.num_replicas_draining,
                cost_usd_per_hour=p.cost_usd_per_hour + d.cost_usd_per_hour,
            )
        )

    def replica_summary(self, end_s: float) -> list[dict[str, Any]]:
        rows = []
        for pool, fleet in (("prefill", self.prefill), ("decode", self.decode)):
            for row in fleet.replica_summary(end_s):
                rows.append({**row, "pool": pool})
        return rows
