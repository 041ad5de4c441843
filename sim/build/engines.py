"""A scenario's model, GPU, ``engine`` and ``latency`` sections → replica engines: the memory
plan and KV cache, the scheduler, the iteration-time model (roofline, profile, or a fixed or
random step) and the factory that makes replica ``i``'s engine."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from sim.catalog.architecture import ModelArch
from sim.catalog.hardware import GPU, is_cpu_backend
from sim.engine.coefficients import CalibratedCoefficients
from sim.engine.kv_cache import KVCacheManager
from sim.engine.latency import (
    CalibratedModel,
    ConstantStepModel,
    ExponentialStepModel,
    IterationTimeModel,
    RooflineModel,
)
from sim.engine.memory import MemoryPlan, plan_memory
from sim.engine.profile import calibrated_envelope, check_profile, load_profile
from sim.engine.scheduler import (
    ContinuousBatchScheduler,
    ReplicaOptions,
    Scheduler,
    SchedulerConfig,
)
from sim.engine.static_batch import StaticBatchScheduler
from sim.fleet.pool import EngineFactory, ReplicaHardware
from sim.scenario import (
    ConstantLatencySpec,
    ExponentialLatencySpec,
    PoolSpec,
    ProfileLatencySpec,
    RooflineLatencySpec,
    Scenario,
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
        model_ = CalibratedModel(coefficients, calibrated_envelope(profile))
        return model_, coefficients.frontend_overhead_s
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
        expert_parallel=scenario.engine.enable_expert_parallel,
    )
    return roofline, spec.frontend_overhead_s


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


#: The first vLLM release that schedules asynchronously by default (v0.14.0 release notes,
#: https://github.com/vllm-project/vllm/releases/tag/v0.14.0: "Async scheduling is now enabled
#: by default ... Excludes some not-yet-supported configurations: pipeline parallel, CPU
#: backend, non-MTP/Eagle spec decoding").
ASYNC_SCHEDULING_DEFAULT_SINCE = (0, 14)


def _version(text: str) -> tuple[int, ...] | None:
    """``"0.15.1"`` → ``(0, 15, 1)``; None when it does not start with numbers."""
    parts = []
    for piece in text.strip().lstrip("v").split("."):
        digits = "".join(itertools.takewhile(str.isdigit, piece))
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


def resolve_async_scheduling(scenario: Scenario, hardware_name: str) -> bool:
    """Whether the replica schedules asynchronously: the engine's ``async_scheduling`` when
    set, else vLLM's default for the deployment (on a GPU, from vLLM 0.14, or when the version
    is not given; never under pipeline parallelism, on the CPU backend or for the constant and
    exponential step models, which check the engine against queueing theory)."""
    engine = scenario.engine
    if engine.pipeline_parallel_size > 1 or engine.batching != "continuous":
        return False
    if engine.async_scheduling is not None:
        return engine.async_scheduling
    if isinstance(scenario.latency, (ConstantLatencySpec, ExponentialLatencySpec)):
        return False
    if is_cpu_backend(hardware_name):
        return False
    version = _version(engine.vllm_version) if engine.vllm_version else None
    return version is None or version >= ASYNC_SCHEDULING_DEFAULT_SINCE


def shared_kv_reads(hardware_name: str) -> str:
    """How the backend reads KV that several requests share: the CPU's caches keep any shared
    block between its readers; on GPUs only cascade attention reads a prefix once."""
    return "cached" if is_cpu_backend(hardware_name) else "cascade"


def make_scheduler(
    scenario: Scenario,
    kv: KVCacheManager,
    async_scheduling: bool = False,
    shared_reads: str = "cascade",
) -> Scheduler:
    """The batching policy a scenario's engine section selects."""
    engine = scenario.engine
    config = SchedulerConfig(
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        enable_chunked_prefill=engine.enable_chunked_prefill,
        policy=engine.scheduling_policy,
    )
    options = ReplicaOptions(
        pipeline_parallel_size=engine.pipeline_parallel_size,
        record_token_times=scenario.output.record_token_times,
        fast_forward=scenario.simulator.fast_forward,
        async_scheduling=async_scheduling,
        shared_kv_reads=shared_reads,
    )
    match engine.batching:
        case "continuous":
            return ContinuousBatchScheduler(config, kv, options)
        case "static":
            return StaticBatchScheduler(config, kv, batch_window_s=0.0, options=options)
        case "dynamic":
            return StaticBatchScheduler(
                config, kv, batch_window_s=engine.batch_window_s, options=options
            )
    raise AssertionError(engine.batching)


@dataclass
class Engines:
    """One pool's engine factory and what it was planned with."""

    make_engine: EngineFactory
    plan: MemoryPlan
    max_model_len: int
    frontend_overhead_s: float
    hardware: ReplicaHardware


def make_engines(
    scenario: Scenario,
    latency_seed: np.random.SeedSequence,
    coefficients: CalibratedCoefficients | None,
    field: str = "engine",
) -> Engines:
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
    hardware_name = gpu.name
    if isinstance(scenario.latency, ProfileLatencySpec):
        hardware_name = load_profile(scenario.latency.path).hardware
    async_scheduling = resolve_async_scheduling(scenario, hardware_name)
    shared_reads = shared_kv_reads(hardware_name)

    def make_engine(i: int) -> tuple[Scheduler, IterationTimeModel]:
        kv = KVCacheManager(plan.num_blocks, engine.block_size, caching)
        latency_model = shared
        if per_replica and i > 0:
            rng = np.random.default_rng(replica_seed(i))
            latency_model, _ = make_latency_model(scenario, model, gpu, rng)
        return make_scheduler(scenario, kv, async_scheduling, shared_reads), latency_model

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
    return Engines(make_engine, plan, max_model_len, frontend_overhead_s, hardware)


def pool_scenario(scenario: Scenario, pool: PoolSpec) -> Scenario:
    """The scenario as one disaggregated pool sees it: its own GPU and TP where it sets them."""
    return scenario.on_pool(pool.gpu, pool.tensor_parallel_size)
