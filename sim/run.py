"""Scenario → simulation → result. The only place that turns a scenario into objects, and the
only place (with the CLI) that writes files.

``build(scenario)`` returns a :class:`Simulation`; ``Simulation.run()`` returns a
:class:`SimResult` with per-request records, a time series and the summary.
"""

from __future__ import annotations

import gc
import json
import time
import warnings
from collections.abc import Callable, Generator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import simpy

from sim.catalog.hardware import GPU
from sim.catalog.models import ModelArch
from sim.engine.kv_cache import KVCacheManager
from sim.engine.latency import (
    CalibratedCoefficients,
    CalibratedModel,
    ConstantStepModel,
    ExponentialStepModel,
    IterationTimeModel,
    MemoryPlan,
    RooflineModel,
    plan_memory,
)
from sim.engine.request import Record, Request, RequestStatus, later_turns
from sim.engine.scheduler import (
    ContinuousBatchScheduler,
    Scheduler,
    SchedulerConfig,
    StaticBatchScheduler,
)
from sim.fleet.autoscaler import (
    Autoscaler,
    AutoscalerConfig,
    ScalingPolicy,
    ScalingRules,
    startup_seconds,
)
from sim.fleet.disagg import DisaggConfig, DisaggregatedFleet
from sim.fleet.pool import EngineFactory, Fleet, FleetReplica, HardwareOf, ReplicaHardware
from sim.fleet.router import Router
from sim.report.summary import (
    SLO,
    TIMESERIES_COLUMNS,
    PrefixCacheCounts,
    records_frame,
    stability,
    summarize,
    token_times_frame,
)
from sim.scenario import (
    ArrivalSpec,
    ConstantLatencySpec,
    DisaggregationSpec,
    ExponentialLatencySpec,
    LengthSpec,
    MultiTurnSpec,
    PoolSpec,
    ProfileLatencySpec,
    RooflineLatencySpec,
    RouterSpec,
    ScalingRulesSpec,
    Scenario,
    ScenarioError,
    SharedPrefixSpec,
    WorkloadSpec,
    parse_scenario,
)
from sim.workload import arrivals as arr
from sim.workload import lengths as lens
from sim.workload.generate import (
    MultiTurn,
    PrefixStructure,
    SharedPrefix,
    content_salt,
    generate_requests,
    requests_from_trace,
)
from sim.workload.traces import TraceFormatError, read_trace


# -- scenario sections → domain objects -----------------------------------------------------
def make_arrivals(spec: ArrivalSpec) -> arr.ArrivalProcess:
    """The arrival process a scenario's ``workload.arrival`` describes."""
    match spec.type:
        case "poisson":
            return arr.Poisson(rate=spec.rate)
        case "gamma":
            return arr.GammaArrivals(rate=spec.rate, cv=spec.cv)
        case "constant":
            return arr.Constant(rate=spec.rate)
        case "on_off":
            return arr.OnOff(
                on_rate=spec.on_rate, on_s=spec.on_s, off_s=spec.off_s, off_rate=spec.off_rate
            )
        case "piecewise":
            return arr.PiecewiseRate(
                points=tuple(spec.points), interpolation=spec.interpolation, period_s=spec.period_s
            )
        case "diurnal":
            return arr.Diurnal(
                mean_rate=spec.mean_rate,
                amplitude=spec.amplitude,
                period_s=spec.period_s,
                peak_s=spec.peak_s,
            )
    raise AssertionError(spec)


def make_lengths(spec: LengthSpec) -> lens.LengthDistribution:
    """The length distribution a scenario's length section describes."""
    match spec.type:
        case "constant":
            return lens.ConstantLength(spec.value)
        case "uniform":
            return lens.UniformLength(spec.low, spec.high)
        case "lognormal":
            if spec.mean is not None and spec.p90 is not None:
                return lens.LogNormalLength.from_mean_p90(
                    spec.mean, spec.p90, min_tokens=spec.min_tokens, max_tokens=spec.max_tokens
                )
            assert spec.mu is not None and spec.sigma is not None
            return lens.LogNormalLength(
                spec.mu, spec.sigma, min_tokens=spec.min_tokens, max_tokens=spec.max_tokens
            )
        case "empirical":
            inner = lens.EmpiricalLength.from_file(spec.path, spec.column)
            return lens.Clipped(inner, min_tokens=spec.min_tokens, max_tokens=spec.max_tokens)
    raise AssertionError(spec)


def make_prefix(workload: WorkloadSpec) -> PrefixStructure:
    """The prefix/session structure of a synthetic workload."""
    prefix = workload.prefix
    if isinstance(prefix, SharedPrefixSpec):
        return SharedPrefix(prefix.num_groups, prefix.prefix_tokens, prefix.share)
    if isinstance(prefix, MultiTurnSpec):
        return MultiTurn(
            make_lengths(prefix.turns), prefix.think_time_s, prefix.system_prompt_tokens
        )
    return None


def build_requests(workload: WorkloadSpec, seed_sequence: np.random.SeedSequence) -> list[Request]:
    """The scenario's requests, sorted by arrival. Same seed → same requests."""
    if workload.trace is not None:
        path = workload.trace.path
        try:
            # Without a time horizon only the first num_requests lines are needed: a huge
            # trace is read no further (its first requests in file order, then sorted).
            limit = workload.num_requests if workload.duration_s is None else None
            trace = read_trace(path, workload.trace.format, max_requests=limit)
        except OSError as exc:
            raise ValueError(f"workload.trace.path: cannot read {path}: {exc.strerror}") from None
        except TraceFormatError as exc:
            raise ValueError(f"workload.trace: {exc}") from None
        times = None
        if trace.arrival_s is None:
            if workload.arrival is None:
                raise ValueError(
                    f"workload.arrival: trace {path} has no timestamps; give an arrival process"
                )
            rng = np.random.default_rng(seed_sequence)
            times = make_arrivals(workload.arrival).times(rng, num_requests=len(trace))
        elif workload.arrival is not None:
            raise ValueError(
                f"workload.arrival: trace {path} has its own timestamps; remove arrival "
                "(use workload.trace.time_scale to replay it faster or slower)"
            )
        requests = requests_from_trace(
            trace,
            time_scale=workload.trace.time_scale,
            arrival_times_s=times,
            salt=content_salt(seed_sequence),
        )
        if workload.duration_s is not None:
            requests = [r for r in requests if r.arrival_s < workload.duration_s]
        if workload.num_requests is not None:
            requests = requests[: workload.num_requests]
        return requests
    assert workload.arrival and workload.prompt_tokens and workload.output_tokens
    return generate_requests(
        seed_sequence,
        make_arrivals(workload.arrival),
        make_lengths(workload.prompt_tokens),
        make_lengths(workload.output_tokens),
        make_prefix(workload),
        num_requests=workload.num_requests,
        duration_s=workload.duration_s,
    )


def make_latency_model(
    scenario: Scenario, model: ModelArch, gpu: GPU, rng: np.random.Generator
) -> tuple[IterationTimeModel, float]:
    """The iteration-time model a scenario's ``latency`` section describes, and the server
    front-end overhead each request sees (non-zero only for calibrated profiles).
    """
    spec = scenario.latency
    if isinstance(spec, ConstantLatencySpec):
        return ConstantStepModel(spec.step_s), 0.0
    if isinstance(spec, ExponentialLatencySpec):
        return ExponentialStepModel(spec.mean_s, rng), 0.0
    if isinstance(spec, ProfileLatencySpec):
        # calibration depends on sim, not the other way round, except for reading profiles here.
        from calibration.profile import check_profile, load_profile

        profile = load_profile(spec.path)
        check_profile(
            profile,
            model=model.name,
            hardware=gpu.name,
            tensor_parallel_size=scenario.engine.tensor_parallel_size,
            dtype=scenario.dtype,
            engine_version=scenario.engine.vllm_version,
            source=spec.path,
        )
        coefficients = profile.coefficients
        return CalibratedModel(coefficients), coefficients.frontend_overhead_s
    assert isinstance(spec, RooflineLatencySpec)
    roofline = RooflineModel(
        model,
        gpu,
        dtype=scenario.dtype,
        kv_dtype=scenario.kv_dtype,
        tensor_parallel_size=scenario.engine.tensor_parallel_size,
        params=spec.params(),
        quantization=scenario.quantization,
        pipeline_parallel_size=scenario.engine.pipeline_parallel_size,
    )
    return roofline, 0.0


def memory_plan(scenario: Scenario, model: ModelArch, gpu: GPU) -> MemoryPlan:
    """How the scenario's replica splits GPU memory, and its KV blocks."""
    engine = scenario.engine
    try:
        return plan_memory(
            model,
            gpu,
            dtype=scenario.dtype,
            kv_dtype=scenario.kv_dtype,
            tensor_parallel_size=engine.tensor_parallel_size,
            pipeline_parallel_size=engine.pipeline_parallel_size,
            gpu_memory_utilization=engine.gpu_memory_utilization,
            max_num_batched_tokens=engine.max_num_batched_tokens,
            block_size=engine.block_size,
        )
    except ValueError as exc:
        raise ValueError(f"gpu: {exc}") from None


def make_scheduler(scenario: Scenario, kv: KVCacheManager) -> Scheduler:
    """The batching policy a scenario's engine section selects."""
    engine = scenario.engine
    config = SchedulerConfig(
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        enable_chunked_prefill=engine.enable_chunked_prefill,
        policy=engine.scheduling_policy,
        record_token_times=scenario.output.record_token_times,
        pipeline_parallel_size=engine.pipeline_parallel_size,
        fast_forward=scenario.simulator.fast_forward,
    )
    match engine.batching:
        case "continuous":
            return ContinuousBatchScheduler(config, kv)
        case "static":
            return StaticBatchScheduler(config, kv, batch_window_s=0.0)
        case "dynamic":
            return StaticBatchScheduler(config, kv, batch_window_s=engine.batch_window_s)
    raise AssertionError(engine.batching)


# -- the simulation -------------------------------------------------------------------------
@dataclass
class SimResult:
    """What a run produced."""

    records: pd.DataFrame
    timeseries: pd.DataFrame
    summary: dict[str, Any]
    token_times: pd.DataFrame | None = None

    def write(self, out_dir: str | Path, fmt: Literal["parquet", "csv"] = "parquet") -> list[Path]:
        """Write records, time series (Parquet or CSV) and ``summary.json``; return the paths."""
        tables = {"records": self.records, "timeseries": self.timeseries}
        if self.token_times is not None:
            tables["token_times"] = self.token_times
        return write_outputs(out_dir, tables, {"summary": self.summary}, fmt)


def write_outputs(
    out_dir: str | Path,
    tables: dict[str, pd.DataFrame],
    documents: dict[str, Any],
    fmt: Literal["parquet", "csv"] = "parquet",
) -> list[Path]:
    """Tables as ``NAME.parquet`` (or ``.csv``) and documents as ``NAME.json``; the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in tables.items():
        path = out / f"{name}.{fmt}"
        if fmt == "parquet":
            frame.to_parquet(path, index=False)
        else:
            frame.to_csv(path, index=False)
        written.append(path)
    for name, document in documents.items():
        path = out / f"{name}.json"
        path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        written.append(path)
    return written


#: The most time-series rows a run samples over its arrivals (the interval grows to fit).
MAX_SAMPLES = 200_000


class Simulation:
    """One replica under a workload, ready to run once.

    Requests without a parent arrive at their ``arrival_s``; a later turn of a session is
    released ``think_time_s`` after its parent finishes (whatever the parent's status).
    """

    def __init__(
        self,
        requests: list[Request],
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
        self.requests = sorted(requests, key=lambda r: r.request_id)
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
        first = (scheduler, latency_model)

        def engines(i: int) -> tuple[Scheduler, IterationTimeModel]:
            if i == 0:
                return first
            assert make_engine is not None
            return make_engine(i)

        self.make_engine = engines
        self.records: list[Record] = []
        self.fleet: Fleet | DisaggregatedFleet | None = None
        self._ran = False

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimResult:
        """Simulate until every request has a status. A Simulation runs once."""
        if self._ran:
            raise RuntimeError("a Simulation runs once; build() a new one to run again")
        self._ran = True
        started = time.perf_counter()
        env = simpy.Environment()
        records = [
            Record(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens)
            for r in self.requests
        ]
        self.records = records
        record_of = {r.request_id: record for r, record in zip(self.requests, records, strict=True)}
        children = later_turns(self.requests)
        roots = sorted((r for r in self.requests if r.parent_id < 0), key=lambda r: r.arrival_s)
        total = len(records)
        all_done = env.event()
        finished = num_ok = 0
        progress_every = max(1, total // 200)

        frontend = self.frontend_overhead_s

        def release(request: Request) -> Generator[simpy.Event, Any, None]:
            yield env.timeout(request.think_time_s)
            record = record_of[request.request_id]
            record.arrival_s = env.now
            if frontend:
                yield env.timeout(frontend)
            fleet.submit(request, record)

        def on_finish(record: Record) -> None:
            nonlocal finished, num_ok
            finished += 1
            num_ok += record.status == RequestStatus.OK
            if scaler is not None:
                scaler.observe(record)
            for child in children.get(record.request_id, ()):
                env.process(release(child))
            if progress is not None and finished % progress_every == 0:
                progress(finished, total)
            if finished == total:
                all_done.succeed()

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
        self.fleet = fleet
        if self.scheduler.config.fast_forward:
            # Requests no other request can share blocks with skip the prefix-cache index.
            pools = (
                (fleet.prefill, fleet.decode) if isinstance(fleet, DisaggregatedFleet) else (fleet,)
            )
            for pool in pools:
                pool.set_shared_sources(self.requests)
        scaler = None
        if self.autoscaler_config is not None:
            assert isinstance(fleet, Fleet)
            scaler = Autoscaler(env, fleet, self.autoscaler_config)
            scaler.start()

        def arrivals() -> Generator[simpy.Event, Any, None]:
            # The server's front end holds every request the same time before the engine sees
            # it, so shifting all arrivals keeps their order.
            for request in roots:
                delay = request.arrival_s + frontend - env.now
                if delay > 0:
                    yield env.timeout(delay)
                fleet.submit(request, record_of[request.request_id])

        stopped = env.event()
        stop_reason = ""

        def stop(reason: str) -> None:
            nonlocal stop_reason
            if not stopped.triggered:
                stop_reason = reason
                stopped.succeed()

        interval_s = self.sample_interval_s
        last_root = max((r.arrival_s for r in roots), default=0.0)
        if last_root / interval_s > MAX_SAMPLES:
            # A trace spanning months sampled every second would be millions of idle rows.
            interval_s = last_root / MAX_SAMPLES
            warnings.warn(
                f"output.sample_interval_s: {self.sample_interval_s:g} s over "
                f"{last_root:,.0f} s of arrivals would be more than {MAX_SAMPLES:,} samples; "
                f"sampling every {interval_s:,.3g} s instead",
                stacklevel=2,
            )

        def sampling() -> Generator[simpy.Event, Any, None]:
            limit = self.max_waiting_requests
            while True:
                yield env.timeout(interval_s)
                fleet.sample(env.now, finished, num_ok)
                waiting = int(fleet.rows[-1][1])
                if limit is not None and waiting > limit:
                    stop(f"{waiting:,} requests waiting (simulator.max_waiting_requests={limit:,})")

        def deadline(at_s: float) -> Generator[simpy.Event, Any, None]:
            yield env.timeout(at_s)
            stop(f"simulated time reached {at_s:,.0f} s (simulator.max_simulated_s)")

        if total:
            fleet.sample(0.0, 0, 0)
            env.process(arrivals())
            env.process(sampling())
            env.process(deadline(self.max_simulated_s or 10 * (last_root + frontend) + 3600.0))
            # A run allocates many small objects and few cycles: collect young objects less
            # often (a few % of wall time), as before once the run is over.
            threshold = gc.get_threshold()
            gc.set_threshold(50_000, 20, 100)
            try:
                env.run(until=all_done | stopped)
            finally:
                gc.set_threshold(*threshold)
            if stop_reason:
                for record in records:
                    if record.status is None:
                        record.status = RequestStatus.CANCELLED
                        record.error = f"not finished when the run stopped: {stop_reason}"
            if fleet.rows[-1][0] < env.now:
                fleet.sample(env.now, finished, num_ok)  # the final partial interval
        wall_s = time.perf_counter() - started
        if progress is not None:
            progress(finished, total)
        frame = records_frame(records)
        replicas = fleet.replicas
        totals = fleet.totals()
        itl = np.concatenate(
            [np.frombuffer(r.scheduler.itl_values, dtype=np.float64) for r in replicas]
        )
        itl_counts = np.concatenate(
            [np.frombuffer(r.scheduler.itl_counts, dtype=np.int64) for r in replicas]
        )
        summary = summarize(
            frame,
            itl_s=itl,
            itl_counts=itl_counts,
            slo=self.slo,
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
            num_events=sum(r.num_steps for r in replicas) + total + len(fleet.rows),
        )
        summary["sim"]["fast_forwarded_steps"] = sum(r.num_fast_forwarded_steps for r in replicas)
        summary["cost"] = cost_summary(
            replicas, float(env.now), int(frame.loc[frame["status"] == "ok", "output_tokens"].sum())
        )
        if len(replicas) > 1 or scaler is not None:
            summary["fleet"] = {
                "replicas": len(replicas),
                "router": fleet.router.policy,
                "router_affinity_hits": fleet.router.num_affinity_hits,
                "router_hash_placements": fleet.router.num_hash_placements,
                "router_overflows": fleet.router.num_overflows,
                "per_replica": fleet.replica_summary(float(env.now)),
            }
        if isinstance(fleet, DisaggregatedFleet):
            transfers = np.asarray(fleet.transfer_s, dtype=np.float64)
            summary["fleet"]["disaggregation"] = {
                "prefill_replicas": len(fleet.prefill.replicas),
                "decode_replicas": len(fleet.decode.replicas),
                "kv_transfers": int(transfers.size),
                "kv_transfer_s_mean": float(transfers.mean()) if transfers.size else None,
                "kv_transfer_s_p99": (
                    float(np.percentile(transfers, 99)) if transfers.size else None
                ),
            }
        if scaler is not None:
            summary["fleet"]["autoscaling"] = {
                "metric": scaler.config.metric,
                "target": scaler.config.target,
                "startup_s": scaler.config.startup_s,
                "max_replicas_reached": max(int(row[10] + row[11]) for row in fleet.rows),
                "events": [asdict(event) for event in scaler.events],
            }
        timeseries = pd.DataFrame(fleet.rows, columns=list(TIMESERIES_COLUMNS))
        summary["stability"] = stability(frame, timeseries, stop_reason)
        if not summary["stability"]["stable"]:
            summary["slo"]["met"] = False  # percentiles of a growing queue mean nothing
        return SimResult(frame, timeseries, summary, token_times_frame(records))


def _seeds(
    scenario: Scenario,
) -> tuple[np.random.SeedSequence, np.random.SeedSequence, np.random.SeedSequence]:
    """The workload's, the latency model's and the router's seeds, spawned from the scenario's
    seed (the first two are what they were before routers existed, so results are stable)."""
    workload_seed, latency_seed, router_seed = np.random.SeedSequence(scenario.seed).spawn(3)
    return workload_seed, latency_seed, router_seed


def scenario_requests(scenario: Scenario) -> list[Request]:
    """The scenario's requests, exactly as its simulation sees them (live replay sends these)."""
    return build_requests(scenario.workload, _seeds(scenario)[0])


@dataclass
class _Engines:
    """One pool's engine factory and what it was planned with."""

    make_engine: EngineFactory
    plan: MemoryPlan
    max_model_len: int
    frontend_overhead_s: float
    hardware: ReplicaHardware


def _engines(
    scenario: Scenario,
    latency_seed: np.random.SeedSequence,
    coefficients: CalibratedCoefficients | None,
    field: str = "engine",
) -> _Engines:
    """Engines for the scenario's model on its GPU, with its engine knobs (``field`` names the
    section an impossible setup is reported under)."""
    model = scenario.resolve_model()
    gpu = scenario.resolve_gpu()
    plan = memory_plan(scenario, model, gpu)
    engine = scenario.engine
    max_model_len = engine.max_model_len or model.max_position_embeddings
    if max_model_len > plan.kv_capacity_tokens:
        raise ValueError(
            f"{field}.max_model_len: {max_model_len} tokens exceed the KV cache's "
            f"{plan.kv_capacity_tokens} tokens on {gpu.name}, so vLLM would refuse to start; "
            "lower max_model_len, raise gpu_memory_utilization or tensor_parallel_size, or use "
            "kv_cache_dtype: fp8"
        )
    # Only continuous batching reuses cached prefixes; the others would just pay for the keys.
    caching = engine.enable_prefix_caching and engine.batching == "continuous"

    def replica_seed(i: int) -> np.random.SeedSequence:
        """Replica i's step-time draws (for a random step model) come from its own stream:
        replica 0 the latency seed itself, replica i its (i-1)-th spawned child."""
        if i == 0:
            return latency_seed
        key = (*latency_seed.spawn_key, i - 1)
        return np.random.SeedSequence(latency_seed.entropy, spawn_key=key)

    # Replica 0's model; deterministic models (roofline, profile) serve every replica, so a
    # profile is read once. A random step model draws from each replica's own stream.
    shared: IterationTimeModel
    if coefficients is not None:
        shared, frontend_overhead_s = (
            CalibratedModel(coefficients),
            coefficients.frontend_overhead_s,
        )
    else:
        shared, frontend_overhead_s = make_latency_model(
            scenario, model, gpu, np.random.default_rng(replica_seed(0))
        )
    per_replica = coefficients is None and isinstance(scenario.latency, ExponentialLatencySpec)

    def make_engine(i: int) -> tuple[Scheduler, IterationTimeModel]:
        kv = KVCacheManager(plan.num_blocks, engine.block_size, caching)
        latency_model = shared
        if per_replica and i > 0:
            rng = np.random.default_rng(replica_seed(i))
            latency_model, _ = make_latency_model(scenario, model, gpu, rng)
        return make_scheduler(scenario, kv), latency_model

    if engine.pipeline_parallel_size > 1 and engine.batching != "continuous":
        raise ValueError(
            f"{field}.pipeline_parallel_size: pipelining overlaps continuous-batching steps; "
            "set batching: continuous or pipeline_parallel_size: 1"
        )
    hardware = ReplicaHardware(
        gpu=gpu.name,
        num_gpus=engine.tensor_parallel_size * engine.pipeline_parallel_size,
        gpu_hour_usd=scenario.gpu_hour_usd(),
    )
    return _Engines(make_engine, plan, max_model_len, frontend_overhead_s, hardware)


def _router(spec: RouterSpec, seed: np.random.SeedSequence) -> Router:
    return Router(
        spec.policy,
        np.random.default_rng(seed),
        load_bound=spec.load_bound,
        load_slack=spec.load_slack,
        min_match=spec.min_match,
    )


def pool_scenario(scenario: Scenario, pool: PoolSpec) -> Scenario:
    """The scenario as one disaggregated pool sees it: its own GPU and TP where it sets them."""
    engine = scenario.engine
    if pool.tensor_parallel_size is not None:
        engine = engine.model_copy(update={"tensor_parallel_size": pool.tensor_parallel_size})
    return scenario.model_copy(update={"gpu": pool.gpu or scenario.gpu, "engine": engine})


def build(
    scenario: Scenario,
    *,
    requests: list[Request] | None = None,
    coefficients: CalibratedCoefficients | None = None,
) -> Simulation:
    """Everything a scenario describes, wired together. Raises ValueError on impossible setups,
    naming the scenario field to change.

    ``requests`` replaces the scenario's workload (a replay of recorded requests) and
    ``coefficients`` its latency section (a calibrated model being fitted).
    """
    workload_seed, latency_seed, router_seed = _seeds(scenario)
    if requests is None:
        requests = build_requests(scenario.workload, workload_seed)
    slo = SLO(scenario.slo.ttft_s, scenario.slo.tpot_s, scenario.slo.percentile)
    simulation = _build(scenario, requests, slo, latency_seed, router_seed, coefficients)
    simulation.max_waiting_requests = scenario.simulator.max_waiting_requests
    simulation.max_simulated_s = scenario.simulator.max_simulated_s
    return simulation


def _build(
    scenario: Scenario,
    requests: list[Request],
    slo: SLO,
    latency_seed: np.random.SeedSequence,
    router_seed: np.random.SeedSequence,
    coefficients: CalibratedCoefficients | None,
) -> Simulation:
    disagg = scenario.fleet.disaggregation
    if disagg is not None:
        return _build_disaggregated(
            scenario, requests, slo, latency_seed, router_seed, coefficients, disagg
        )
    if scenario.fleet.pools is not None:
        return _build_pools(scenario, requests, slo, latency_seed, router_seed, coefficients)
    engines = _engines(scenario, latency_seed, coefficients)
    scheduler, latency_model = engines.make_engine(0)
    return Simulation(
        requests,
        scheduler,
        latency_model,
        frontend_overhead_s=engines.frontend_overhead_s,
        max_model_len=engines.max_model_len,
        slo=slo,
        sample_interval_s=scenario.output.sample_interval_s,
        kv_capacity_tokens=engines.plan.kv_capacity_tokens,
        num_replicas=scenario.fleet.replicas,
        make_engine=engines.make_engine,
        router=_router(scenario.fleet.router, router_seed),
        autoscaler=autoscaler_config(scenario, engines.plan),
        hardware=lambda i: engines.hardware,
    )


def _build_pools(
    scenario: Scenario,
    requests: list[Request],
    slo: SLO,
    latency_seed: np.random.SeedSequence,
    router_seed: np.random.SeedSequence,
    coefficients: CalibratedCoefficients | None,
) -> Simulation:
    """Pools of different GPUs or TP behind one router: replica i belongs to the pool whose
    range of ids holds i, in the order the pools are listed."""
    pools = scenario.fleet.pools
    assert pools is not None
    seeds = latency_seed.spawn(len(pools))
    engines = [
        _engines(pool_scenario(scenario, pool), seed, coefficients, f"fleet.pools.{j}")
        for j, (pool, seed) in enumerate(zip(pools, seeds, strict=True))
    ]
    owner = [(j, k) for j, pool in enumerate(pools) for k in range(pool.replicas)]

    def make_engine(i: int) -> tuple[Scheduler, IterationTimeModel]:
        j, k = owner[i]
        return engines[j].make_engine(k)

    scheduler, latency_model = make_engine(0)
    return Simulation(
        requests,
        scheduler,
        latency_model,
        frontend_overhead_s=engines[0].frontend_overhead_s,
        max_model_len=min(e.max_model_len for e in engines),
        slo=slo,
        sample_interval_s=scenario.output.sample_interval_s,
        kv_capacity_tokens=engines[0].plan.kv_capacity_tokens,
        num_replicas=len(owner),
        make_engine=make_engine,
        router=_router(scenario.fleet.router, router_seed),
        hardware=lambda i: engines[owner[i][0]].hardware,
    )


def _build_disaggregated(
    scenario: Scenario,
    requests: list[Request],
    slo: SLO,
    latency_seed: np.random.SeedSequence,
    router_seed: np.random.SeedSequence,
    coefficients: CalibratedCoefficients | None,
    spec: DisaggregationSpec,
) -> Simulation:
    if scenario.engine.batching != "continuous":
        raise ValueError(
            "fleet.disaggregation: needs engine.batching: continuous (a decode replica admits "
            "requests whose KV arrives mid-flight)"
        )
    prefill_seed, decode_seed = latency_seed.spawn(2)
    prefill = _engines(
        pool_scenario(scenario, spec.prefill),
        prefill_seed,
        coefficients,
        "fleet.disaggregation.prefill",
    )
    decode = _engines(
        pool_scenario(scenario, spec.decode),
        decode_seed,
        coefficients,
        "fleet.disaggregation.decode",
    )
    prefill_router_seed, decode_router_seed = router_seed.spawn(2)
    config = DisaggConfig(
        num_prefill=spec.prefill.replicas,
        num_decode=spec.decode.replicas,
        make_prefill=prefill.make_engine,
        make_decode=decode.make_engine,
        prefill_router=_router(scenario.fleet.router, prefill_router_seed),
        decode_router=Router(spec.decode_router, np.random.default_rng(decode_router_seed)),
        kv_bytes_per_token=prefill.plan.kv_bytes_per_token,
        link_bandwidth_bytes_per_s=spec.link_bandwidth_gb_s * 1e9,
        link_latency_s=spec.link_latency_s,
        prefill_hardware=lambda i: prefill.hardware,
        decode_hardware=lambda i: decode.hardware,
    )
    scheduler, latency_model = prefill.make_engine(0)
    return Simulation(
        requests,
        scheduler,
        latency_model,
        frontend_overhead_s=prefill.frontend_overhead_s,
        max_model_len=min(prefill.max_model_len, decode.max_model_len),
        slo=slo,
        sample_interval_s=scenario.output.sample_interval_s,
        kv_capacity_tokens=decode.plan.kv_capacity_tokens,
        disaggregation=config,
    )


def cost_summary(replicas: list[FleetReplica], end_s: float, output_tokens: int) -> dict[str, Any]:
    """GPU-hours and dollars of a run: each replica billed from its start (start-up included)
    to when it stopped or the run ended, at its GPUs' price; None where a price is missing."""
    gpu_hours = 0.0
    total = 0.0
    missing: set[str] = set()
    by_gpu: dict[str, float] = {}
    for replica in replicas:
        hardware = replica.hardware
        stop = replica.stopped_s if replica.stopped_s is not None else end_s
        hours = max(0.0, stop - replica.started_s) / 3600 * hardware.num_gpus
        gpu_hours += hours
        by_gpu[hardware.gpu] = by_gpu.get(hardware.gpu, 0.0) + hours
        if hardware.gpu_hour_usd is None:
            missing.add(hardware.gpu)
        else:
            total += hours * hardware.gpu_hour_usd
    known = not missing
    return {
        "gpu_hours": gpu_hours,
        "gpu_hours_by_gpu": by_gpu,
        "total_usd": total if known else None,
        "usd_per_hour": total / (end_s / 3600) if known and end_s > 0 else None,
        "usd_per_million_output_tokens": (
            total / output_tokens * 1e6 if known and output_tokens else None
        ),
        "missing_prices": sorted(missing),
    }


def autoscaler_config(scenario: Scenario, plan: MemoryPlan) -> AutoscalerConfig | None:
    """The scenario's HPA, with a start-up time from its weights per GPU."""
    spec = scenario.fleet.autoscaling
    if spec is None:
        return None

    def rules(r: ScalingRulesSpec) -> ScalingRules:
        policies = tuple(ScalingPolicy(p.type, p.value, p.period_s) for p in r.policies)
        return ScalingRules(r.stabilization_window_s, policies, r.select)

    return AutoscalerConfig(
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        metric=spec.metric,
        target=spec.target,
        startup_s=startup_seconds(spec.container_start_s, plan.weight_bytes, spec.weight_load_gb_s),
        percentile=spec.percentile,
        window_s=spec.window_s,
        sync_period_s=spec.sync_period_s,
        tolerance=spec.tolerance,
        scale_up=rules(spec.scale_up),
        scale_down=rules(spec.scale_down),
    )


def summary_or_error(data: dict[str, Any], source: str = "scenario") -> tuple[dict[str, Any], str]:
    """Validate and simulate a scenario dict: ``(summary, "")``, or ``({}, why it cannot run)``
    (its validation problems, or the impossible setup ``build`` reports)."""
    try:
        return build(parse_scenario(data, source)).run().summary, ""
    except ScenarioError as exc:
        return {}, "; ".join(exc.problems)
    except ValueError as exc:
        return {}, str(exc)


def run(scenario: Scenario) -> SimResult:
    """Build and run a scenario."""
    return build(scenario).run()
