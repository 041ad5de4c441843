"""One simulation run: requests released into a fleet, sampled, bounded, and summarised.

:class:`Simulation` holds what :func:`sim.run.build` wired together (requests, replica 0's
engine, an engine factory for the others, router, autoscaler or disaggregation); its
:meth:`~Simulation.run` makes a :class:`_Run` — the SimPy environment and the processes that
release requests, sample the fleet and stop an overloaded run — and turns what it leaves into a
:class:`SimResult` through :mod:`sim.report`.
"""

from __future__ import annotations

import gc
import itertools
import time
import warnings
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import simpy

from sim.engine.latency import CalibratedModel, IterationTimeModel
from sim.engine.request import (
    ALL_SHARED_FIRST,
    Record,
    Request,
    RequestStatus,
    keyed_prefix_requests,
    later_turns,
    record_of,
    shared_first_sources,
)
from sim.engine.scheduler import Scheduler
from sim.fleet.autoscaler import Autoscaler, AutoscalerConfig
from sim.fleet.disagg import DisaggConfig, DisaggregatedFleet
from sim.fleet.pool import EngineFactory, Fleet, HardwareOf
from sim.fleet.router import Router
from sim.fleet.timeseries import MAX_KEPT
from sim.report import sketch
from sim.report.cost import cost_summary
from sim.report.fleet import fleet_summary
from sim.report.outputs import TableWriter, write_outputs
from sim.report.record_sink import KeptRecords, StreamedRecords
from sim.report.sketch import Values
from sim.report.stability import stability
from sim.report.summary import PERCENTILES, SLO, PrefixCacheCounts, RecordStats, RunFacts
from sim.workload.generate import SyntheticRequests

#: The most samples a run that writes no time-series file takes over its arrivals (the
#: interval grows to fit). Its series keeps up to twice that (sim/fleet/timeseries.py), which
#: leaves room for the samples after the last arrival before it would merge rows.
MAX_SAMPLES = MAX_KEPT // 2


class RecordsStreamedError(RuntimeError):
    """The records of a streamed run were written out in chunks, not kept."""


@dataclass
class SimResult:
    """What a run produced. A streamed run (``Simulation.run(stream=True)``) keeps no records
    table: they are in ``records_path`` (None if they went nowhere) and :attr:`records`
    raises. ``timeseries`` is the kept copy of the samples (every one unless there were more
    than sim/fleet/timeseries.py's MAX_KEPT); a run given an ``out_dir`` wrote every sample
    to ``timeseries_path`` as it took them."""

    records_table: pd.DataFrame | None
    timeseries: pd.DataFrame
    summary: dict[str, Any]
    token_times: pd.DataFrame | None = None
    records_path: Path | None = None
    timeseries_path: Path | None = None

    @property
    def records(self) -> pd.DataFrame:
        """The per-request records, by request id."""
        if self.records_table is None:
            where = f"were written to {self.records_path}" if self.records_path else "were not kept"
            raise RecordsStreamedError(f"this run streamed its records: they {where}")
        return self.records_table

    def write(self, out_dir: str | Path, fmt: Literal["parquet", "csv"] = "parquet") -> list[Path]:
        """Write records, time series (Parquet or CSV) and ``summary.json``; return the paths.
        A streamed run's records are already written, and a time series the run wrote to
        ``out_dir`` as it sampled is only listed."""
        tables: dict[str, pd.DataFrame] = {}
        if self.records_table is not None:
            tables["records"] = self.records_table
        sampled = self.timeseries_path
        written_already = (
            sampled is not None
            and sampled.suffix == f".{fmt}"
            and sampled.parent.resolve() == Path(out_dir).resolve()
        )
        if not written_already:
            tables["timeseries"] = self.timeseries
        if self.token_times is not None:
            tables["token_times"] = self.token_times
        paths = write_outputs(out_dir, tables, {"summary": self.summary}, fmt)
        return [sampled, *paths] if written_already and sampled is not None else paths


class Simulation:
    """One replica (or fleet) under a workload, ready to run once.

    Requests without a parent arrive at their ``arrival_s``; a later turn of a session is
    released ``think_time_s`` after its parent finishes (whatever the parent's status).

    With ``max_concurrency`` set (a closed loop, as ``vllm bench serve --max-concurrency``), at
    most that many requests are in flight from the clients: one that arrives while all slots
    are taken waits at the client, first come first served, and is sent (its record's
    ``arrival_s``) when a slot frees, ``client_think_s`` after the answer that held it.
    """

    def __init__(
        self,
        requests: Sequence[Request],
        scheduler: Scheduler,
        latency_model: IterationTimeModel,
        *,
        max_model_len: int,
        slo: SLO,
        sample_interval_s: float = 1.0,
        kv_capacity_tokens: int,
        frontend_overhead_s: float = 0.0,
        num_replicas: int = 1,
        make_engine: EngineFactory | None = None,
        router: Router | None = None,
        autoscaler: AutoscalerConfig | None = None,
        disaggregation: DisaggConfig | None = None,
        hardware: HardwareOf | None = None,
        max_waiting_requests: int | None = None,
        max_simulated_s: float | None = None,
    ) -> None:
        """``scheduler`` and ``latency_model`` are replica 0's engine; with ``num_replicas`` > 1,
        ``make_engine(i)`` makes the others' and ``router`` spreads requests over them.

        An overloaded run stops when more than ``max_waiting_requests`` wait over the fleet or
        the clock passes ``max_simulated_s`` (default: ten times the last arrival, plus an
        hour); requests not finished then end ``cancelled``."""
        if num_replicas > 1 and make_engine is None:
            raise ValueError("num_replicas > 1 needs make_engine to build the other replicas")
        # Synthetic requests stay as columns, in id order; others are sorted by id.
        self.requests: Sequence[Request] = (
            requests
            if isinstance(requests, SyntheticRequests)
            else sorted(requests, key=lambda r: r.request_id)
        )
        self.scheduler = scheduler
        self.latency_model = latency_model
        self.max_model_len = max_model_len
        self.slo = slo
        self.sample_interval_s = sample_interval_s
        self.kv_capacity_tokens = kv_capacity_tokens
        self.frontend_overhead_s = frontend_overhead_s
        self.num_replicas = num_replicas
        self.router = router or Router("round_robin", np.random.default_rng(0))
        self.autoscaler_config = autoscaler
        self.disaggregation = disaggregation
        self.hardware = hardware
        self.max_waiting_requests = max_waiting_requests
        self.max_simulated_s = max_simulated_s
        self.max_concurrency: int | None = None
        self.client_think_s = 0.0
        self.percentiles: tuple[float, ...] = PERCENTILES
        first = (scheduler, latency_model)

        def engines(i: int) -> tuple[Scheduler, IterationTimeModel]:
            if i == 0:
                return first
            assert make_engine is not None
            return make_engine(i)

        self.make_engine = engines
        # After a run that kept them: every request's record, by request id.
        self.records: list[Record] = []
        self.fleet: Fleet | DisaggregatedFleet | None = None
        self._ran = False

    def make_fleet(
        self, env: simpy.Environment, on_finish: Callable[[Record], None]
    ) -> Fleet | DisaggregatedFleet:
        """The replicas (one pool behind the router, or a prefill and a decode pool) in
        ``env``, reporting each finished request to ``on_finish``."""
        fleet: Fleet | DisaggregatedFleet
        if self.disaggregation is not None:
            fleet = DisaggregatedFleet(
                env, self.disaggregation, max_model_len=self.max_model_len, on_finish=on_finish
            )
        else:
            fleet = Fleet(
                env,
                self.make_engine,
                self.router,
                num_replicas=self.num_replicas,
                max_model_len=self.max_model_len,
                on_finish=on_finish,
                hardware=self.hardware,
            )
        if self.scheduler.options.fast_forward:
            # Requests no other request can share blocks with skip the prefix-cache index.
            pools = (
                (fleet.prefill, fleet.decode) if isinstance(fleet, DisaggregatedFleet) else (fleet,)
            )
            requests = self.requests
            if isinstance(requests, SyntheticRequests):
                shared, keyed = requests.shared_first_sources(), ALL_SHARED_FIRST
            else:
                shared, keyed = shared_first_sources(requests), keyed_prefix_requests(requests)
            for pool in pools:
                pool.set_shared_sources(shared, keyed)
        return fleet

    def run(
        self,
        progress: Callable[[int, int], None] | None = None,
        *,
        stream: bool = False,
        out_dir: str | Path | None = None,
        fmt: Literal["parquet", "csv"] = "parquet",
    ) -> SimResult:
        """Simulate until every request has a status. A Simulation runs once.

        With ``stream``, records are not kept: they go to ``out_dir``'s ``records.<fmt>`` in
        chunks as requests end (nowhere without ``out_dir``), and the summary's percentiles
        come from them (exact up to a million values, a t-digest past that), so memory does
        not grow with the number of requests (:mod:`sim.report.record_sink`).

        With ``out_dir``, every time-series sample goes to its ``timeseries.<fmt>`` as it is
        taken, at the configured interval however long the run; the result keeps at most
        MAX_KEPT rows of it (:class:`~sim.fleet.timeseries.SampledSeries`)."""
        if self._ran:
            raise RuntimeError("a Simulation runs once; build() a new one to run again")
        self._ran = True
        started = time.perf_counter()
        state = _Run(self, progress)
        self.fleet = state.fleet
        series_writer = None
        if out_dir is not None:
            series_writer = TableWriter(Path(out_dir) / f"timeseries.{fmt}", fmt)
            state.fleet.series.writer = series_writer

        def close_series() -> Path | None:
            """Write the samples not yet written and finish the file (None: no file)."""
            if series_writer is None:
                return None
            state.fleet.series.flush()
            return series_writer.close()

        itl = Values(sketch.EXACT_LIMIT if stream else None)
        if stream:
            state.finished = StreamedRecords(
                self.slo, out_dir, fmt, on_chunk=lambda: _drain_itl(state.fleet.replicas, itl)
            )
        try:
            state.execute()
        except BaseException:
            # Interrupted (Ctrl-C, a failing callback): the files written so far end cleanly
            # (Parquet needs its footer), with every sample and finished record they have.
            close_series()
            if isinstance(state.finished, StreamedRecords):
                state.finished.close()
            raise
        wall_s = time.perf_counter() - started
        if progress is not None:
            progress(state.num_finished, state.num_requests)
        result = self._result(state, wall_s, itl)
        result.timeseries_path = close_series()
        return result

    def _result(self, state: _Run, wall_s: float, itl: Values) -> SimResult:
        """Records, time series and summary of a finished run."""
        fleet, env = state.fleet, state.env
        replicas = fleet.replicas
        totals = fleet.totals()
        frame = token_times = records_path = None
        finished = state.finished
        if isinstance(finished, StreamedRecords):
            written = finished.close()
            records_path = written[0] if written else None
            stats = finished.stats
        else:
            frame, token_times = finished.tables()
            self.records = finished.records
            stats = RecordStats(self.slo, exact_limit=None)
            stats.add(frame)
            _drain_itl(replicas, itl, clear=False)
        facts = RunFacts(
            prefix_cache=PrefixCacheCounts(
                queries_tokens=totals.queries_tokens,
                hits_tokens=totals.hits_tokens,
                preempted_queries_tokens=sum(r.kv.preempted_queries_tokens for r in replicas),
                preempted_hits_tokens=sum(r.kv.preempted_hits_tokens for r in replicas),
            ),
            num_preemptions=sum(r.scheduler.num_preemptions for r in replicas),
            kv_capacity_tokens=self.kv_capacity_tokens,
            busy_s=totals.busy_s / len(replicas),
            wall_s=wall_s,
            simulated_s=float(env.now),
            num_events=sum(r.num_steps for r in replicas) + state.num_requests + fleet.series.count,
        )
        summary = stats.summary(itl=itl, facts=facts, percentiles=self.percentiles)
        summary["sim"]["fast_forwarded_steps"] = sum(r.num_fast_forwarded_steps for r in replicas)
        output_tokens = stats.output_tokens
        summary["cost"] = cost_summary(replicas, float(env.now), output_tokens)
        gpu_s = summary["cost"]["gpu_hours"] * 3600
        # Per GPU-second of the fleet's lifetime (start-up included), as the cost bills it.
        summary["throughput"]["output_tokens_per_s_per_gpu"] = (
            output_tokens / gpu_s if gpu_s > 0 else None
        )
        section = fleet_summary(fleet, state.scaler, float(env.now))
        if section is not None:
            summary["fleet"] = section
        timeseries = fleet.series.frame()
        envelope = _envelope_section(replicas)
        if envelope is not None:
            summary["calibration_envelope"] = envelope
        arrivals = (stats.num_arrivals, stats.first_arrival_s, stats.last_arrival_s)
        summary["stability"] = stability(
            arrivals, stats.mean_output_tokens, timeseries, state.stop_reason
        )
        if not summary["stability"]["stable"]:
            summary["slo"]["met"] = False  # percentiles of a growing queue mean nothing
        return SimResult(frame, timeseries, summary, token_times, records_path)


def _drain_itl(replicas: Sequence[Any], into: Values, *, clear: bool = True) -> None:
    """Add the replicas' run-length encoded inter-token latencies to ``into``, and (``clear``)
    empty them."""
    for replica in replicas:
        scheduler = replica.scheduler
        if len(scheduler.itl_values):
            into.add(
                np.array(scheduler.itl_values, dtype=np.float64),
                np.array(scheduler.itl_counts, dtype=np.int64),
            )
            if clear:
                del scheduler.itl_values[:]
                del scheduler.itl_counts[:]


def _envelope_section(replicas: Sequence[Any]) -> dict[str, Any] | None:
    """Where the run's steps went beyond what a calibration profile measured (None without a
    profile): the largest step simulated and measured, and a warning when it is outside."""
    models = {id(r.latency_model): r.latency_model for r in replicas}.values()
    watched = [m for m in models if isinstance(m, CalibratedModel) and m.envelope]
    if not watched:
        return None
    outside: dict[str, tuple[float, float]] = {}
    for model in watched:
        for name, (seen, measured) in model.outside_envelope().items():
            if name not in outside or seen > outside[name][0]:
                outside[name] = (seen, measured)
    if outside:
        detail = ", ".join(
            f"{name} up to {seen:,.0f} (measured up to {measured:,.0f})"
            for name, (seen, measured) in outside.items()
        )
        warnings.warn(
            f"latency.profile: the run's steps leave the calibrated envelope: {detail}; the "
            "profile extrapolates there: calibrate with larger batches or contexts",
            stacklevel=4,
        )
    return {
        "inside": not outside,
        "outside": {name: {"simulated": a, "measured": b} for name, (a, b) in outside.items()},
    }


class _Run:
    """The state of one run: the SimPy environment, the fleet, a record per request, and the
    processes that release requests (roots at their arrival, later turns a think time after
    their parent), sample the fleet and stop the run when it is overloaded."""

    def __init__(self, simulation: Simulation, progress: Callable[[int, int], None] | None) -> None:
        self.simulation = simulation
        self.progress = progress
        self.env = env = simpy.Environment()
        requests = simulation.requests
        self.num_requests = len(requests)
        # A record is made when its request is sent; until it ends it is in flight.
        self.finished: KeptRecords | StreamedRecords = KeptRecords()
        self.in_flight: dict[int, Record] = {}
        self.roots: Sequence[Request]
        if isinstance(requests, SyntheticRequests):
            self.children: dict[int, list[Request]] = {}
            self.roots = requests  # every one a root, in arrival order
            self.last_root_s = requests.last_arrival_s
        else:
            self.children = later_turns(requests)
            self.roots = sorted((r for r in requests if r.parent_id < 0), key=lambda r: r.arrival_s)
            self.last_root_s = max((r.arrival_s for r in self.roots), default=0.0)
        self.next_root = 0  # roots before it have been sent (or wait for a client slot)
        self.thinking: dict[int, Request] = {}  # later turns released, not yet sent
        self.all_done = env.event()
        self.num_finished = self.num_ok = 0
        self.progress_every = max(1, self.num_requests // 200)
        self.frontend_s = simulation.frontend_overhead_s
        self.fleet = simulation.make_fleet(env, self.on_finish)
        self.scaler: Autoscaler | None = None
        if simulation.autoscaler_config is not None:
            assert isinstance(self.fleet, Fleet)
            self.scaler = Autoscaler(env, self.fleet, simulation.autoscaler_config)
            self.scaler.start()
        self.stopped = env.event()
        self.stop_reason = ""
        # The closed loop's client slots: free ones, and the requests waiting for one.
        self.slots = simulation.max_concurrency
        self.held: deque[Request] = deque()

    # -- requests in and out -----------------------------------------------------------------
    def arrivals(self) -> Generator[simpy.Event, Any, None]:
        """Submit every root request at its arrival time (plus the front end's delay)."""
        if self.slots is not None:
            yield from self.gated_arrivals()
            return
        env, fleet, frontend = self.env, self.fleet, self.frontend_s
        # The server's front end holds every request the same time before the engine sees
        # it, so shifting all arrivals keeps their order.
        for request in self.roots:
            delay = request.arrival_s + frontend - env.now
            if delay > 0:
                yield env.timeout(delay)
            self.next_root += 1
            record = self.record(request)
            if env.now - frontend < record.arrival_s:
                # ``now + (t - now)`` can round one ulp below ``t``; a request is never
                # scheduled before it arrived, so the record takes the clock's time.
                record.arrival_s = env.now - frontend
            fleet.submit(request, record)

    def gated_arrivals(self) -> Generator[simpy.Event, Any, None]:
        """Closed loop: every root request reaches the client at its arrival time."""
        env = self.env
        for request in self.roots:
            delay = request.arrival_s - env.now
            if delay > 0:
                yield env.timeout(delay)
            self.next_root += 1
            self.ready(request)

    def ready(self, request: Request) -> None:
        """A request the client would send now: sent if a slot is free, else held (FIFO)."""
        assert self.slots is not None
        if self.slots > 0:
            self.slots -= 1
            self.env.process(self.send(request, self.record(request)))
        else:
            self.held.append(request)

    def send(self, request: Request, record: Record) -> Generator[simpy.Event, Any, None]:
        """Send a request that holds a slot: it arrives now, the engine sees it after the front
        end's delay."""
        record.arrival_s = self.env.now
        if self.frontend_s:
            yield self.env.timeout(self.frontend_s)
        self.fleet.submit(request, record)

    def free_slot(self, lag_s: float) -> Generator[simpy.Event, Any, None]:
        """An answer arrived (``lag_s`` after its last step: the front end's streaming
        backlog): after the user's think time its slot takes the next request."""
        assert self.slots is not None
        if self.simulation.client_think_s + lag_s:
            yield self.env.timeout(self.simulation.client_think_s + lag_s)
        if self.held:
            request = self.held.popleft()
            self.env.process(self.send(request, self.record(request)))
        else:
            self.slots += 1

    def release(self, request: Request, lag_s: float) -> Generator[simpy.Event, Any, None]:
        """A later turn: it arrives a think time after its parent's answer reached the client
        (``lag_s`` after the parent's last step)."""
        env = self.env
        yield env.timeout(request.think_time_s + lag_s)
        del self.thinking[request.request_id]
        if self.slots is not None:
            self.ready(request)
            return
        record = self.record(request)
        record.arrival_s = env.now
        if self.frontend_s:
            yield env.timeout(self.frontend_s)
        self.fleet.submit(request, record)

    def record(self, request: Request) -> Record:
        """A new record for a request being sent (its arrival as the workload has it), in
        flight until it ends."""
        record = record_of(request)
        self.in_flight[request.request_id] = record
        return record

    def on_finish(self, record: Record) -> None:
        """Count a request that has its status; release its session's next turns."""
        del self.in_flight[record.request_id]
        self.finished.add(record)
        self.num_finished += 1
        self.num_ok += record.status == RequestStatus.OK
        if self.scaler is not None:
            self.scaler.observe(record)
        # The answer reaches the client when the front end has streamed its last token, which
        # may be after the step that computed it (Replica.delivered_s).
        lag_s = record.finish_s - self.env.now
        lag_s = lag_s if lag_s > 0 else 0.0  # also NaN: a request that never ran
        if self.slots is not None:
            self.env.process(self.free_slot(lag_s))
        for child in self.children.pop(record.request_id, ()):
            self.thinking[child.request_id] = child
            self.env.process(self.release(child, lag_s))
        total = self.num_requests
        if self.progress is not None and self.num_finished % self.progress_every == 0:
            self.progress(self.num_finished, total)
        if self.num_finished == total:
            self.all_done.succeed()

    # -- sampling and bounds -----------------------------------------------------------------
    def stop(self, reason: str) -> None:
        """End an overloaded run (the first reason given is the one reported)."""
        if not self.stopped.triggered:
            self.stop_reason = reason
            self.stopped.succeed()

    def sample_interval_s(self) -> float:
        """The configured interval; in a run that writes no time-series file, stretched so the
        arrivals span at most MAX_SAMPLES (it would keep no more rows)."""
        interval_s = self.simulation.sample_interval_s
        last_root = self.last_root_s
        if self.fleet.series.writer is None and last_root / interval_s > MAX_SAMPLES:
            # A trace spanning months sampled every second would be millions of idle rows.
            stretched = last_root / MAX_SAMPLES
            warnings.warn(
                f"output.sample_interval_s: {interval_s:g} s over "
                f"{last_root:,.0f} s of arrivals would be more than {MAX_SAMPLES:,} samples; "
                f"sampling every {stretched:,.3g} s instead (a run with an output directory "
                "writes every sample)",
                stacklevel=4,
            )
            return stretched
        return interval_s

    def sampling(self, interval_s: float) -> Generator[simpy.Event, Any, None]:
        """Sample the fleet every ``interval_s``; stop the run if too many requests wait."""
        env, fleet, limit = self.env, self.fleet, self.simulation.max_waiting_requests
        while True:
            yield env.timeout(interval_s)
            fleet.sample(env.now, self.num_finished, self.num_ok)
            waiting = int(fleet.series.last.num_requests_waiting)
            if limit is not None and waiting > limit:
                self.stop(
                    f"{waiting:,} requests waiting (simulator.max_waiting_requests={limit:,})"
                )

    def deadline(self, at_s: float) -> Generator[simpy.Event, Any, None]:
        """Stop the run when the clock reaches ``at_s``."""
        yield self.env.timeout(at_s)
        self.stop(f"simulated time reached {at_s:,.0f} s (simulator.max_simulated_s)")

    # -- the run -----------------------------------------------------------------------------
    def execute(self) -> None:
        """Run until every request has a status or a bound stops the run; requests not
        finished then end ``cancelled`` with the reason."""
        interval_s = self.sample_interval_s()
        env, fleet = self.env, self.fleet
        fleet.sample(0.0, 0, 0)  # a run of no request too: its reports read the fleet at 0
        if not self.num_requests:
            return
        env.process(self.arrivals())
        env.process(self.sampling(interval_s))
        limit_s = self.simulation.max_simulated_s
        if limit_s is None and self.slots is None:
            # An overloaded open loop queues without end; a closed loop holds at most its
            # users' requests, so only a deadline the user gave stops it.
            limit_s = 10 * (self.last_root_s + self.frontend_s) + 3600.0
        if limit_s is not None:
            env.process(self.deadline(limit_s))
        # A run allocates many small objects and few cycles: collect young objects less
        # often (a few % of wall time), as before once the run is over.
        threshold = gc.get_threshold()
        gc.set_threshold(50_000, 20, 100)
        try:
            env.run(until=self.all_done | self.stopped)
        finally:
            gc.set_threshold(*threshold)
        if self.stop_reason:
            self.cancel_the_rest()
        if fleet.series.last.time_s < env.now:
            fleet.sample(env.now, self.num_finished, self.num_ok)  # the final partial interval
        # What released requests is done with: drop its indexes before the records become a
        # table (a big run's peak memory is there).
        self.children, self.roots = {}, []

    def cancel_the_rest(self) -> None:
        """A stopped run: every request without a status ends ``cancelled`` with the reason —
        those in flight, and those never sent (roots not reached, requests waiting for a
        client slot, later turns in their think time or whose parent never ended), which keep
        the workload's arrival time."""
        error = f"not finished when the run stopped: {self.stop_reason}"
        roots = self.roots
        unsent = itertools.chain(
            self.held,
            self.thinking.values(),
            (r for turns in self.children.values() for r in turns),
            (roots[i] for i in range(self.next_root, len(roots))),
        )
        for record in itertools.chain(
            list(self.in_flight.values()), (self.record(r) for r in unsent)
        ):
            record.status = RequestStatus.CANCELLED
            record.error = error
            del self.in_flight[record.request_id]
            self.finished.add(record)
