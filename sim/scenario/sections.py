"""The scenario's sections other than the workload: hardware and model, engine knobs (under
vLLM's names), step-time model, fleet (router, autoscaling, pools, disaggregation), cost, SLO,
output and simulator settings."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from sim.catalog.hardware import GPU, is_cpu_backend, reported_memory_bytes
from sim.engine.latency import DEFAULT_FRONTEND_OVERHEAD_S, RooflineParams
from sim.report.summary import SLO
from sim.scenario.base import Fraction, NonNegativeInt, PositiveFloat, PositiveInt, Spec

_ROOFLINE = RooflineParams()


# -- hardware, model, engine ----------------------------------------------------------------
class CustomGPUSpec(Spec):
    """A GPU not in the catalogue, in spec-sheet units."""

    name: str
    memory_gb: PositiveFloat
    memory_bandwidth_tb_s: PositiveFloat
    bf16_tflops: PositiveFloat
    fp8_tflops: PositiveFloat | None = None
    int8_tops: PositiveFloat | None = None
    link_bandwidth_gb_s: PositiveFloat = 32.0
    interconnect: Literal["nvlink", "pcie"] = "pcie"  # as the default link bandwidth says
    peer_to_peer: bool = True
    # PCIe cards joined by NVLink bridges (H100 NVL: 2 at 300 GB/s one way): a TP group of up
    # to bridge_size talks over the bridge (GPU.link).
    bridge_size: NonNegativeInt = 0
    bridge_bandwidth_gb_s: PositiveFloat | None = None
    # Memory ECC keeps from CUDA (GDDR data-centre cards: 0.0625; HBM: 0).
    ecc_reserved_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.0
    # An NVSwitch that reduces in the switch (NVLink SHARP: HGX H100/H200/B200), which vLLM
    # uses for wide TP groups' all-reduces (GPU.nvlink_multicast).
    nvlink_multicast: bool = False
    hourly_cost_usd: PositiveFloat | None = None

    @model_validator(mode="after")
    def _multicast_needs_nvlink(self) -> CustomGPUSpec:
        if self.nvlink_multicast and self.interconnect != "nvlink":
            raise ValueError(
                "nvlink_multicast: an NVSwitch that reduces in the switch needs interconnect: "
                "nvlink; set interconnect: nvlink or leave nvlink_multicast out"
            )
        return self

    @model_validator(mode="after")
    def _a_bridge_has_a_bandwidth(self) -> CustomGPUSpec:
        if self.bridge_bandwidth_gb_s is not None and not self.bridge_size:
            raise ValueError(
                "bridge_size: bridge_bandwidth_gb_s is set but bridge_size is 0; set the number "
                "of cards one NVLink bridge joins (H100 NVL: 2), or leave the bandwidth out"
            )
        if self.bridge_size and self.bridge_bandwidth_gb_s is None:
            raise ValueError(
                "bridge_bandwidth_gb_s: a GPU with bridge_size needs its NVLink bridge's "
                "bandwidth per GPU, one direction, in GB/s (H100 NVL: 300)"
            )
        return self

    def build(self) -> GPU:
        """The GPU value object."""
        return GPU(
            name=self.name,
            memory_bytes=self.memory_gb * 1e9,
            memory_bandwidth_bytes_per_s=self.memory_bandwidth_tb_s * 1e12,
            bf16_flops=self.bf16_tflops * 1e12,
            fp8_flops=self.fp8_tflops * 1e12 if self.fp8_tflops else None,
            int8_ops=self.int8_tops * 1e12 if self.int8_tops else None,
            link_bandwidth_bytes_per_s=self.link_bandwidth_gb_s * 1e9,
            hourly_cost_usd=self.hourly_cost_usd,
            interconnect=self.interconnect,
            peer_to_peer=self.peer_to_peer,
            bridge_size=self.bridge_size,
            ecc_reserved_fraction=self.ecc_reserved_fraction,
            nvlink_multicast=self.nvlink_multicast,
            bridge_bandwidth_bytes_per_s=(
                self.bridge_bandwidth_gb_s * 1e9 if self.bridge_bandwidth_gb_s else None
            ),
        )


class HFConfigModelSpec(Spec):
    """A model described by a local Hugging Face ``config.json``."""

    hf_config: str


class CustomModelSpec(Spec):
    """A decoder given by its dimensions: dense, or a mixture of experts with ``num_experts``,
    with latent attention with ``kv_lora_rank`` (see sim/catalog/architecture.py ModelArch)."""

    name: str
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    num_key_value_heads: PositiveInt
    head_dim: PositiveInt
    intermediate_size: PositiveInt
    vocab_size: PositiveInt
    tie_word_embeddings: bool = False
    max_position_embeddings: PositiveInt = 8192
    qk_norm: bool = False
    num_experts: NonNegativeInt = 0
    num_experts_per_token: NonNegativeInt = 0
    moe_intermediate_size: NonNegativeInt = 0
    shared_expert_intermediate_size: NonNegativeInt = 0
    num_dense_layers: NonNegativeInt = 0
    kv_lora_rank: NonNegativeInt = 0
    q_lora_rank: NonNegativeInt = 0
    qk_rope_head_dim: NonNegativeInt = 0
    v_head_dim: NonNegativeInt = 0


#: vLLM's ``--max-num-seqs`` and ``--max-num-batched-tokens`` when a server is started without
#: them (vllm/engine/arg_utils.py, ``EngineArgs`` batch defaults for the OpenAI server, vLLM
#: 0.9 on): 1,024 and 8,192 on a GPU with at least 70 GiB that is not an A100 ("setting large
#: max_num_batched_tokens for A100 reduces throughput", vLLM PR 17885); 256 and 2,048 on other
#: GPUs; 128 and 2,048 per CPU rank on the CPU backend; ``max_num_seqs`` never above
#: ``max_num_batched_tokens``. Not modelled: later versions' further tiers and clamps (a
#: larger token default on the largest GPUs, tokens capped at max_num_seqs × max_model_len,
#: ``--performance-mode``); set both for a deployment that depends on them.
LARGE_GPU_BATCH_DEFAULTS = (1024, 8192)
GPU_BATCH_DEFAULTS = (256, 2048)
CPU_BATCH_DEFAULTS = (128, 2048)
LARGE_GPU_BYTES = 70 * 2**30


def vllm_batch_defaults(gpu: GPU, world_size: int = 1) -> tuple[int, int]:
    """``(max_num_seqs, max_num_batched_tokens)`` as vLLM picks them for ``gpu`` (``world_size``:
    TP × PP, which scales the CPU backend's)."""
    if is_cpu_backend(gpu.name):
        seqs, tokens = (value * world_size for value in CPU_BATCH_DEFAULTS)
    elif reported_memory_bytes(gpu) >= LARGE_GPU_BYTES and "a100" not in gpu.name.lower():
        seqs, tokens = LARGE_GPU_BATCH_DEFAULTS
    else:
        seqs, tokens = GPU_BATCH_DEFAULTS
    return min(seqs, tokens), tokens


class EngineSpec(Spec):
    """vLLM engine knobs, under vLLM's names. Defaults follow vLLM v1's defaults; the two batch
    limits, which vLLM sets by the GPU, are filled in by the scenario (vllm_batch_defaults)
    when left out."""

    max_num_seqs: PositiveInt = GPU_BATCH_DEFAULTS[0]
    max_num_batched_tokens: PositiveInt = GPU_BATCH_DEFAULTS[1]
    block_size: Literal[1, 8, 16, 32, 64, 128] = 16
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    max_model_len: PositiveInt | None = None  # None: the model's max_position_embeddings
    tensor_parallel_size: Literal[1, 2, 4, 8, 16] = 1
    # Layers split into this many stages, one batch in flight per stage (continuous batching).
    pipeline_parallel_size: Annotated[int, Field(ge=1, le=64)] = 1
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    # vLLM's --enable-expert-parallel: a mixture of experts' experts spread whole over the
    # tensor-parallel GPUs instead of sliced (no effect on a dense model).
    enable_expert_parallel: bool = False
    batching: Literal["continuous", "static", "dynamic"] = "continuous"
    vllm_version: str | None = None  # the deployment's vLLM version, checked against profiles
    # vLLM's --async-scheduling. None: vLLM's default for this deployment (on from vLLM 0.14 on
    # GPUs; off under pipeline parallelism, on the CPU backend and for queueing-theory step
    # models); see sim/build/engines.py resolve_async_scheduling.
    async_scheduling: bool | None = None
    batch_window_s: Annotated[float, Field(ge=0)] = 0.05  # dynamic batching only


# -- step times -----------------------------------------------------------------------------
class RooflineLatencySpec(Spec):
    """First-principles step times; efficiencies are fractions of peak (see RooflineParams)."""

    type: Literal["roofline"] = "roofline"
    compute_efficiency: Fraction = _ROOFLINE.compute_efficiency
    attention_compute_efficiency: Fraction | None = None  # None: the GPU's measured one
    # None: the GPU's measured figures, else the roofline's defaults (RooflineParams).
    bandwidth_efficiency: Fraction | None = None
    gemm_latency_s: Annotated[float, Field(ge=0)] | None = None
    attention_bandwidth_efficiency: Fraction = _ROOFLINE.attention_bandwidth_efficiency
    layer_elementwise_s: Annotated[float, Field(ge=0)] = _ROOFLINE.layer_elementwise_s
    elementwise_bandwidth_efficiency: Fraction = _ROOFLINE.elementwise_bandwidth_efficiency
    step_overhead_s: Annotated[float, Field(ge=0)] = _ROOFLINE.step_overhead_s
    flash_attention: bool = _ROOFLINE.flash_attention
    # How a MoE layer's expert GEMMs blend weight streaming and arithmetic (p-norm; large: the
    # max, as a dense GEMM; 1: their sum). See sim/engine/latency.py MOE_OVERLAP_EXPONENT.
    moe_overlap_exponent: Annotated[float, Field(ge=1)] = _ROOFLINE.moe_overlap_exponent
    # Not a step's time: what the server's front end adds to every request (see
    # sim/engine/latency.py DEFAULT_FRONTEND_OVERHEAD_S).
    frontend_overhead_s: Annotated[float, Field(ge=0)] = DEFAULT_FRONTEND_OVERHEAD_S
    # Host seconds the front end spends per streamed token (one thread per replica; see
    # sim/engine/coefficients.py). 0: tokens reach the client as their step ends.
    per_streamed_token_s: Annotated[float, Field(ge=0)] = _ROOFLINE.per_streamed_token_s

    def params(self) -> RooflineParams:
        """The roofline model's parameters."""
        return RooflineParams(**self.model_dump(exclude={"type", "frontend_overhead_s"}))


class ConstantLatencySpec(Spec):
    """Every step takes ``step_s`` (for queueing-theory checks)."""

    type: Literal["constant"]
    step_s: PositiveFloat


class ExponentialLatencySpec(Spec):
    """Exponential step times with mean ``mean_s`` (for queueing-theory checks)."""

    type: Literal["exponential"]
    mean_s: PositiveFloat


class ProfileLatencySpec(Spec):
    """Step times from a calibration profile written by ``servesim calibrate``.

    ``latency: {profile: PATH}`` is accepted as a shorthand.
    """

    type: Literal["profile"]
    path: str


LatencySpec = Annotated[
    RooflineLatencySpec | ConstantLatencySpec | ExponentialLatencySpec | ProfileLatencySpec,
    Field(discriminator="type"),
]


# -- fleet ----------------------------------------------------------------------------------
class RouterSpec(Spec):
    """How requests are spread over replicas (see sim/router.py for each policy)."""

    policy: Literal["round_robin", "random", "least_outstanding", "least_kv", "prefix_affinity"] = (
        "round_robin"
    )
    # prefix_affinity: a replica is full above both load_bound × the mean outstanding requests
    # and the mean plus load_slack.
    load_bound: Annotated[float, Field(ge=1.0)] = 1.25
    load_slack: Annotated[int, Field(ge=0)] = 8
    # prefix_affinity: follow a cached prefix only when it covers this much of the prompt.
    min_match: Annotated[float, Field(ge=0, le=1)] = 0.5


class ScalingPolicySpec(Spec):
    """At most ``value`` pods, or ``value`` per cent of the replicas, per ``period_s``."""

    type: Literal["pods", "percent"]
    value: PositiveFloat
    period_s: PositiveFloat = 15.0


class ScalingRulesSpec(Spec):
    """One direction of an HPA ``behavior``: window, policies, and which policy wins."""

    stabilization_window_s: Annotated[float, Field(ge=0)]
    policies: list[ScalingPolicySpec]
    select: Literal["max", "min", "disabled"] = "max"


class AutoscalingSpec(Spec):
    """A Kubernetes HorizontalPodAutoscaler on the fleet (sim/autoscaler.py). Defaults are
    Kubernetes' own; ``container_start_s`` and ``weight_load_gb_s`` set a new replica's
    start-up (container and engine start, then each GPU reading its share of the weights)."""

    min_replicas: PositiveInt = 1
    max_replicas: Annotated[int, Field(ge=1, le=4096)] = 10
    metric: Literal["ttft_ms", "waiting_per_replica", "running_per_replica", "kv_usage"] = "ttft_ms"
    target: PositiveFloat
    percentile: Annotated[float, Field(gt=0, le=100)] = 90.0
    window_s: PositiveFloat = 60.0
    sync_period_s: PositiveFloat = 15.0
    tolerance: Annotated[float, Field(ge=0, lt=1)] = 0.1
    scale_up: ScalingRulesSpec = ScalingRulesSpec(
        stabilization_window_s=0.0,
        policies=[
            ScalingPolicySpec(type="pods", value=4, period_s=15),
            ScalingPolicySpec(type="percent", value=100, period_s=15),
        ],
    )
    scale_down: ScalingRulesSpec = ScalingRulesSpec(
        stabilization_window_s=300.0,
        policies=[ScalingPolicySpec(type="percent", value=100, period_s=15)],
    )
    container_start_s: Annotated[float, Field(ge=0)] = 30.0
    weight_load_gb_s: PositiveFloat = 2.0

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})"
            )
        return self


class PoolSpec(Spec):
    """One pool of a disaggregated fleet: its size, and its own GPU and TP where they differ."""

    replicas: Annotated[int, Field(ge=1, le=4096)]
    gpu: str | CustomGPUSpec | None = None
    tensor_parallel_size: Annotated[int, Field(ge=1, le=64)] | None = None


class DisaggregationSpec(Spec):
    """Prefill/decode disaggregation (sim/disagg.py): ``prefill`` and ``decode`` pools and the
    link the KV cache crosses between them. The default link is one 200 Gb/s RDMA NIC per GPU
    (25 GB/s) with 0.5 ms set-up; set yours."""

    prefill: PoolSpec
    decode: PoolSpec
    link_bandwidth_gb_s: PositiveFloat = 25.0
    link_latency_s: Annotated[float, Field(ge=0)] = 0.0005
    decode_router: Literal["round_robin", "random", "least_outstanding", "least_kv"] = (
        "least_outstanding"
    )


class FleetSpec(Spec):
    """Identical replicas of the engine behind one router, optionally autoscaled; or ``pools``
    of different GPUs/TP behind the one router; or, with ``disaggregation``, separate prefill
    and decode pools (``replicas`` is unused with either)."""

    replicas: Annotated[int, Field(ge=1, le=4096)] = 1
    router: RouterSpec = RouterSpec()
    autoscaling: AutoscalingSpec | None = None
    disaggregation: DisaggregationSpec | None = None
    pools: Annotated[list[PoolSpec], Field(min_length=1, max_length=64)] | None = None

    @model_validator(mode="after")
    def _start_within_bounds(self) -> FleetSpec:
        if self.autoscaling is not None and self.disaggregation is not None:
            raise ValueError(
                "autoscaling a disaggregated fleet is not modelled yet; remove autoscaling or "
                "disaggregation"
            )
        if self.pools is not None and (self.autoscaling or self.disaggregation):
            raise ValueError(
                "pools: mixed pools behind one router cannot be combined with autoscaling or "
                "disaggregation yet; use one of them"
            )
        scaling = self.autoscaling
        if scaling and not scaling.min_replicas <= self.replicas <= scaling.max_replicas:
            raise ValueError(
                f"replicas ({self.replicas}) must be within autoscaling.min_replicas "
                f"({scaling.min_replicas}) and max_replicas ({scaling.max_replicas})"
            )
        return self


# -- cost, SLO, output, simulator -----------------------------------------------------------
class CostSpec(Spec):
    """Prices per GPU-hour, by GPU (catalogue name, alias, or a custom GPU's name). GPUs not
    listed use the catalogue's cited default where it has one (H100 SXM, A100 80GB SXM)."""

    # pydantic copies a mutable default per instance (ruff cannot see Spec is a pydantic model).
    gpu_hour_usd: dict[str, PositiveFloat] = {}  # noqa: RUF012


class SLOSpec(Spec):
    """Latency targets, each to be met at ``percentile``."""

    ttft_s: PositiveFloat = 0.5
    tpot_s: PositiveFloat = 0.05
    percentile: Annotated[float, Field(gt=0, le=100)] = 90.0
    e2e_s: PositiveFloat | None = None  # end to end (first byte sent to last token), optional

    def target(self) -> SLO:
        """The report's SLO value object."""
        return SLO(self.ttft_s, self.tpot_s, self.percentile, self.e2e_s)


class OutputSpec(Spec):
    """What the run records besides per-request records."""

    sample_interval_s: Annotated[float, Field(ge=0.001)] = 1.0
    record_token_times: bool = False
    # With --out: also metrics.om, the time series under vLLM's Prometheus names (OpenMetrics
    # with timestamps, for promtool tsdb create-blocks-from openmetrics).
    prometheus: bool = False
    # Latency percentiles every summary reports, besides 50, 90, 95 and 99 (e.g. [99.9]).
    percentiles: list[Annotated[float, Field(gt=0, lt=100)]] | None = None


class SimulatorSpec(Spec):
    """How the simulator computes, not what it simulates: results do not depend on it."""

    # Advance runs of decode steps as one event (sim/replica.py); false: one event per step.
    fast_forward: bool = True
    # Bounds that stop an overloaded run (its unfinished requests end "cancelled" and the
    # summary says it was unstable): requests waiting over the whole fleet, and simulated
    # seconds (None: ten times the workload's arrival span plus an hour).
    max_waiting_requests: PositiveInt = 100_000
    max_simulated_s: PositiveFloat | None = None
