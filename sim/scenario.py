"""The scenario file: a YAML document validated with pydantic (the boundary of the simulator).

Engine knobs carry vLLM's names and meanings, so a chosen configuration pastes into ``vllm
serve``. Every problem in a file is reported as one line naming the field, e.g.
``workload.arrival.rate: must be > 0, got -3``; unknown keys are errors with a "did you mean"
hint. :func:`load_scenario` raises :class:`ScenarioError` holding those lines.
"""

from __future__ import annotations

import difflib
import warnings
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from sim.catalog.hardware import GPU, get_gpu
from sim.catalog.models import ModelArch, get_model, load_hf_config
from sim.engine.latency import QuantizationWarning, RooflineParams, compute_dtype
from sim.engine.memory import kv_dtype_for
from sim.workload.arrivals import PiecewiseRate
from sim.workload.generate import MAX_REQUESTS
from sim.workload.lengths import LogNormalLength


class ScenarioError(ValueError):
    """Invalid scenario: ``problems`` holds one line per problem, each naming its field."""

    def __init__(self, problems: list[str], source: str = "scenario") -> None:
        self.problems = problems
        self.source = source
        super().__init__(f"{source}: " + "; ".join(problems))

    def __str__(self) -> str:
        header = f"invalid {self.source}:" if self.source else "invalid scenario:"
        return "\n".join([header, *(f"  {p}" for p in self.problems)])


class Spec(BaseModel):
    """Base for scenario sections: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


PositiveFloat = Annotated[float, Field(gt=0)]
PositiveInt = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(gt=0, le=1)]
_ROOFLINE = RooflineParams()


# -- arrivals -------------------------------------------------------------------------------
class PoissonArrivalSpec(Spec):
    """Poisson arrivals at ``rate`` requests per second (exact exponential gaps)."""

    type: Literal["poisson"]
    rate: PositiveFloat


class GammaArrivalSpec(Spec):
    """Renewal arrivals with gamma gaps: mean rate ``rate``, coefficient of variation ``cv``."""

    type: Literal["gamma"]
    rate: PositiveFloat
    cv: Annotated[float, Field(ge=0.01, le=100)]


class ConstantArrivalSpec(Spec):
    """Evenly spaced arrivals."""

    type: Literal["constant"]
    rate: PositiveFloat


class OnOffArrivalSpec(Spec):
    """Bursts: Poisson at ``on_rate`` for ``on_s``, then ``off_rate`` for ``off_s``, repeating."""

    type: Literal["on_off"]
    on_rate: PositiveFloat
    on_s: PositiveFloat
    off_s: PositiveFloat
    off_rate: Annotated[float, Field(ge=0)] = 0.0


class PiecewiseArrivalSpec(Spec):
    """A rate schedule ``[[time_s, rate], ...]`` from time 0: steps, ramps, optionally periodic."""

    type: Literal["piecewise"]
    points: Annotated[list[tuple[float, float]], Field(min_length=1)]
    interpolation: Literal["step", "linear"] = "step"
    period_s: PositiveFloat | None = None

    @model_validator(mode="after")
    def _valid_schedule(self) -> PiecewiseArrivalSpec:
        PiecewiseRate(tuple(self.points), self.interpolation, self.period_s)
        return self


class DiurnalArrivalSpec(Spec):
    """A sinusoidal daily cycle around ``mean_rate`` peaking at ``peak_s``."""

    type: Literal["diurnal"]
    mean_rate: PositiveFloat
    amplitude: Annotated[float, Field(ge=0, le=1)]
    period_s: PositiveFloat = 86400.0
    peak_s: float = 0.0


ArrivalSpec = Annotated[
    PoissonArrivalSpec
    | GammaArrivalSpec
    | ConstantArrivalSpec
    | OnOffArrivalSpec
    | PiecewiseArrivalSpec
    | DiurnalArrivalSpec,
    Field(discriminator="type"),
]


# -- lengths --------------------------------------------------------------------------------
class _Clip(Spec):
    min_tokens: PositiveInt = 1
    max_tokens: PositiveInt | None = None

    @model_validator(mode="after")
    def _ordered(self) -> _Clip:
        if self.max_tokens is not None and self.max_tokens < self.min_tokens:
            raise ValueError(
                f"max_tokens ({self.max_tokens}) must be >= min_tokens ({self.min_tokens})"
            )
        return self


class ConstantLengthSpec(Spec):
    """Every request has ``value`` tokens."""

    type: Literal["constant"]
    value: PositiveInt


class UniformLengthSpec(Spec):
    """Integers uniform in ``[low, high]``."""

    type: Literal["uniform"]
    low: PositiveInt
    high: PositiveInt

    @model_validator(mode="after")
    def _ordered(self) -> UniformLengthSpec:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


class LogNormalLengthSpec(_Clip):
    """Lognormal lengths, by ``mean`` and ``p90`` or by ``mu`` and ``sigma``, then clipped."""

    type: Literal["lognormal"]
    mean: PositiveFloat | None = None
    p90: PositiveFloat | None = None
    mu: float | None = None
    sigma: PositiveFloat | None = None

    @model_validator(mode="after")
    def _one_parametrisation(self) -> LogNormalLengthSpec:
        by_moments = self.mean is not None and self.p90 is not None
        by_params = self.mu is not None and self.sigma is not None
        if by_moments == by_params:
            raise ValueError("give either mean and p90, or mu and sigma")
        if self.mean is not None and self.p90 is not None:
            LogNormalLength.from_mean_p90(self.mean, self.p90)  # raises if no lognormal fits
        return self


class EmpiricalLengthSpec(_Clip):
    """Lengths resampled from a column of a CSV file (e.g. a ShareGPT length table)."""

    type: Literal["empirical"]
    path: str
    column: str


LengthSpec = Annotated[
    ConstantLengthSpec | UniformLengthSpec | LogNormalLengthSpec | EmpiricalLengthSpec,
    Field(discriminator="type"),
]


# -- prefix structure -----------------------------------------------------------------------
class NoPrefixSpec(Spec):
    """Every prompt is unique."""

    type: Literal["none"]


class SharedPrefixSpec(Spec):
    """``num_groups`` system prompts of ``prefix_tokens``; ``share`` of requests start with one."""

    type: Literal["shared"]
    num_groups: PositiveInt
    prefix_tokens: PositiveInt
    share: Annotated[float, Field(ge=0, le=1)] = 1.0


class MultiTurnSpec(Spec):
    """Sessions whose turns extend the conversation; arrivals are session starts."""

    type: Literal["multi_turn"]
    turns: LengthSpec
    think_time_s: Annotated[float, Field(ge=0)]
    system_prompt_tokens: Annotated[int, Field(ge=0)] = 0


PrefixSpec = Annotated[NoPrefixSpec | SharedPrefixSpec | MultiTurnSpec, Field(discriminator="type")]


class TraceSpec(Spec):
    """Replay a trace file: its arrivals (scaled by ``time_scale``), lengths and prefixes."""

    path: str
    format: str = "auto"
    time_scale: PositiveFloat = 1.0


class WorkloadSpec(Spec):
    """The request stream: arrivals, lengths, prefix structure, or a trace; and how many."""

    arrival: ArrivalSpec | None = None
    prompt_tokens: LengthSpec | None = None
    output_tokens: LengthSpec | None = None
    prefix: PrefixSpec = NoPrefixSpec(type="none")
    trace: TraceSpec | None = None
    num_requests: Annotated[int, Field(ge=1, le=MAX_REQUESTS)] | None = None
    duration_s: PositiveFloat | None = None

    @model_validator(mode="after")
    def _complete(self) -> WorkloadSpec:
        if self.trace is not None:
            ignored = [
                name
                for name in ("prompt_tokens", "output_tokens")
                if getattr(self, name) is not None
            ]
            if not isinstance(self.prefix, NoPrefixSpec):
                ignored.append("prefix")
            if ignored:
                raise ValueError(
                    f"a trace brings its own lengths and prefixes; remove {', '.join(ignored)}"
                )
        else:
            missing = [
                name
                for name in ("arrival", "prompt_tokens", "output_tokens")
                if getattr(self, name) is None
            ]
            if missing:
                raise ValueError(f"needs {', '.join(missing)} (or a trace)")
            if self.num_requests is None and self.duration_s is None:
                raise ValueError("give num_requests or duration_s (or both: whichever ends first)")
            if self.num_requests is None and self.arrival is not None:
                assert self.duration_s is not None
                bound = _peak_rate(self.arrival) * self.duration_s
                if bound > MAX_REQUESTS:
                    raise ValueError(
                        f"duration_s: {self.duration_s:g} s at up to {_peak_rate(self.arrival):g} "
                        f"req/s could be ~{bound:,.0f} requests, above the {MAX_REQUESTS:,} a "
                        "run holds; shorten duration_s or add num_requests (whichever ends first)"
                    )
        return self


def _file_problem(field: str, noun: str, path: str) -> list[str]:
    """A one-line problem if ``path`` is not a file ([] if it is)."""
    if Path(path).is_dir():
        return [f"{field}: {path} is a directory; give the {noun}'s own file"]
    if not Path(path).is_file():
        return [f"{field}: {noun} not found: {path}"]
    return []


def _peak_rate(spec: ArrivalSpec) -> float:
    """The highest rate the arrival process reaches (requests per second)."""
    match spec:
        case PoissonArrivalSpec() | GammaArrivalSpec() | ConstantArrivalSpec():
            return spec.rate
        case OnOffArrivalSpec():
            return max(spec.on_rate, spec.off_rate)
        case PiecewiseArrivalSpec():
            return max(rate for _, rate in spec.points)
        case DiurnalArrivalSpec():
            return spec.mean_rate * (1 + spec.amplitude)
    raise AssertionError(spec)


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
    hourly_cost_usd: PositiveFloat | None = None

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
        )


class HFConfigModelSpec(Spec):
    """A model described by a local Hugging Face ``config.json``."""

    hf_config: str


class CustomModelSpec(Spec):
    """A dense decoder given by its dimensions."""

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


class EngineSpec(Spec):
    """vLLM engine knobs, under vLLM's names. Defaults follow vLLM v1's defaults."""

    max_num_seqs: PositiveInt = 256
    max_num_batched_tokens: PositiveInt = 8192
    block_size: Literal[1, 8, 16, 32, 64, 128] = 16
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    max_model_len: PositiveInt | None = None  # None: the model's max_position_embeddings
    tensor_parallel_size: Literal[1, 2, 4, 8, 16] = 1
    # Layers split into this many stages, one batch in flight per stage (continuous batching).
    pipeline_parallel_size: Annotated[int, Field(ge=1, le=64)] = 1
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    batching: Literal["continuous", "static", "dynamic"] = "continuous"
    vllm_version: str | None = None  # the deployment's vLLM version, checked against profiles
    batch_window_s: Annotated[float, Field(ge=0)] = 0.05  # dynamic batching only


class RooflineLatencySpec(Spec):
    """First-principles step times; efficiencies are fractions of peak (see RooflineParams)."""

    type: Literal["roofline"] = "roofline"
    compute_efficiency: Fraction = _ROOFLINE.compute_efficiency
    attention_compute_efficiency: Fraction = _ROOFLINE.attention_compute_efficiency
    bandwidth_efficiency: Fraction = _ROOFLINE.bandwidth_efficiency
    step_overhead_s: Annotated[float, Field(ge=0)] = _ROOFLINE.step_overhead_s
    flash_attention: bool = _ROOFLINE.flash_attention

    def params(self) -> RooflineParams:
        """The roofline model's parameters."""
        return RooflineParams(**self.model_dump(exclude={"type"}))


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


class CostSpec(Spec):
    """Prices per GPU-hour, by GPU (catalogue name, alias, or a custom GPU's name). GPUs not
    listed use the catalogue's cited default where it has one (H100 SXM, A100 80GB SXM)."""

    gpu_hour_usd: dict[str, PositiveFloat] = {}


class SLOSpec(Spec):
    """Latency targets, each to be met at ``percentile``."""

    ttft_s: PositiveFloat = 0.5
    tpot_s: PositiveFloat = 0.05
    percentile: Annotated[float, Field(gt=0, le=100)] = 90.0


class OutputSpec(Spec):
    """What the run records besides per-request records."""

    sample_interval_s: Annotated[float, Field(ge=0.001)] = 1.0
    record_token_times: bool = False
    # With --out: also metrics.om, the time series under vLLM's Prometheus names (OpenMetrics
    # with timestamps, for promtool tsdb create-blocks-from openmetrics).
    prometheus: bool = False


class SimulatorSpec(Spec):
    """How the simulator computes, not what it simulates: results do not depend on it."""

    # Advance runs of decode steps as one event (sim/replica.py); false: one event per step.
    fast_forward: bool = True
    # Bounds that stop an overloaded run (its unfinished requests end "cancelled" and the
    # summary says it was unstable): requests waiting over the whole fleet, and simulated
    # seconds (None: ten times the workload's arrival span plus an hour).
    max_waiting_requests: PositiveInt = 100_000
    max_simulated_s: PositiveFloat | None = None


Dtype = Literal["bf16", "fp16", "fp8", "int8", "int4"]


class Scenario(Spec):
    """Everything a simulation needs."""

    name: str = "scenario"
    seed: Annotated[int, Field(ge=0)] = 0
    model: str | HFConfigModelSpec | CustomModelSpec
    gpu: str | CustomGPUSpec
    dtype: Dtype = "bf16"
    # How quantized weights compute (sim/latency.py QUANTIZATION_METHODS).
    quantization: Literal["auto", "weight_only", "w8a8", "bitsandbytes"] = "auto"
    kv_cache_dtype: Literal["auto", "bf16", "fp16", "fp8"] = "auto"
    engine: EngineSpec = EngineSpec()
    fleet: FleetSpec = FleetSpec()
    workload: WorkloadSpec
    latency: LatencySpec = RooflineLatencySpec()
    slo: SLOSpec = SLOSpec()
    cost: CostSpec = CostSpec()
    output: OutputSpec = OutputSpec()
    simulator: SimulatorSpec = SimulatorSpec()

    @model_validator(mode="before")
    @classmethod
    def _profile_shorthand(cls, data: Any) -> Any:
        latency = data.get("latency") if isinstance(data, dict) else None
        if isinstance(latency, dict) and set(latency) == {"profile"}:
            data = {**data, "latency": {"type": "profile", "path": latency["profile"]}}
        return data

    def resolve_model(self) -> ModelArch:
        """The model architecture (catalogue, local config.json, or custom dimensions)."""
        if isinstance(self.model, str):
            return get_model(self.model)
        if isinstance(self.model, HFConfigModelSpec):
            return load_hf_config(self.model.hf_config)
        return ModelArch(**self.model.model_dump())

    def resolve_gpu(self) -> GPU:
        """The GPU (catalogue or custom)."""
        return get_gpu(self.gpu) if isinstance(self.gpu, str) else self.gpu.build()

    def gpu_hour_usd(self) -> float | None:
        """The price per hour of one of this scenario's GPUs: ``cost.gpu_hour_usd`` if it names
        the GPU, else the GPU's own (catalogue default or custom ``hourly_cost_usd``)."""
        gpu = self.resolve_gpu()
        for key, price in self.cost.gpu_hour_usd.items():
            try:
                name = get_gpu(key).name
            except ValueError:
                name = key
            if name == gpu.name:
                return price
        return gpu.hourly_cost_usd

    @property
    def kv_dtype(self) -> str:
        """The KV cache's element type (``auto``: 16-bit for 16-bit and quantized weights)."""
        return kv_dtype_for(self.dtype, self.kv_cache_dtype)


# -- error reporting ------------------------------------------------------------------------
def _number(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _describe(error: ErrorDetails) -> str:
    kind = error["type"]
    ctx = error.get("ctx", {})
    given = error.get("input")
    if kind == "greater_than":
        return f"must be > {_number(ctx['gt'])}, got {given!r}"
    if kind == "greater_than_equal":
        return f"must be >= {_number(ctx['ge'])}, got {given!r}"
    if kind == "less_than_equal":
        return f"must be <= {_number(ctx['le'])}, got {given!r}"
    if kind == "less_than":
        return f"must be < {_number(ctx['lt'])}, got {given!r}"
    if kind == "missing":
        return "required field is missing"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}, got {given!r}"
    if kind == "union_tag_invalid":
        return f"unknown type {ctx.get('tag')!r}; expected one of {ctx.get('expected_tags')}"
    if kind == "union_tag_not_found":
        return f"needs a 'type' key, one of the types of this section ({ctx.get('discriminator')})"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return f"{error['msg'][0].lower()}{error['msg'][1:]}, got {given!r}"


def _clean_location(loc: tuple[Any, ...], data: Any) -> tuple[list[str], Any]:
    """Drop pydantic's union-member tags from a location, following the input data."""
    parts: list[str] = []
    node = data
    for item in loc:
        tag = isinstance(node, dict) and isinstance(item, str) and item not in node
        if tag and _is_union_tag(str(item), node):
            continue
        parts.append(str(item))
        if isinstance(node, dict):
            node = node.get(item)
        elif isinstance(node, list) and isinstance(item, int) and item < len(node):
            node = node[item]
        else:
            node = None
    return parts, node


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "tuple"}


def _is_union_tag(item: str, node: dict[str, Any]) -> bool:
    """Pydantic names the union member it tried ("poisson", "str", "CustomGPUSpec", …)."""
    return (
        node.get("type") == item
        or item in _TYPE_TAGS
        or item[:1].isupper()
        or not item.isidentifier()
    )


def _all_member_fields(path: list[str], data: Any) -> list[str]:
    """Fields of the union member selected by the input's ``type`` (or of the plain model)."""
    model: Any = Scenario
    node = data
    for part in path:
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return []
        node = node.get(part) if isinstance(node, dict) else None
        model = _member_for(fields[part].annotation, node)
    return list(getattr(model, "model_fields", {}))


def _member_for(annotation: Any, node: Any) -> Any:
    members = _models_in(annotation)
    if isinstance(node, dict) and "type" in node:
        for member in members:
            type_field = member.model_fields.get("type")
            if type_field is not None and node["type"] in getattr(
                type_field.annotation, "__args__", ()
            ):
                return member
    if isinstance(node, dict):
        # Pick the member whose fields cover most of the given keys.
        return max(members, key=lambda m: len(set(node) & set(m.model_fields)), default=None)
    return members[0] if members else None


def _models_in(annotation: Any) -> list[Any]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[Any] = []
    for arg in getattr(annotation, "__args__", ()):
        found.extend(_models_in(arg))
    return found


def format_errors(exc: ValidationError, data: Any) -> list[str]:
    """One line per problem, ``dotted.path: what is wrong, got X``, without pydantic noise."""
    lines: list[str] = []
    seen: set[str] = set()
    errors = exc.errors()
    # A union like ``model: str | {...}`` fails once per member; report the useful member only.
    for error in errors:
        parts, _ = _clean_location(tuple(error["loc"]), data)
        if error["type"] == "extra_forbidden":
            key = parts[-1]
            valid = _all_member_fields(parts[:-1], data)
            hint = difflib.get_close_matches(key, valid, n=1)
            suggestion = f"; did you mean '{hint[0]}'?" if hint else ""
            choices = f" (valid keys: {', '.join(valid)})" if valid and not hint else ""
            line = f"{'.'.join(parts)}: unknown key{suggestion}{choices}"
        elif error["type"] in ("string_type", "model_type", "dict_type") and _is_union_noise(
            error, errors
        ):
            continue
        else:
            message = _describe(error)
            # Domain objects name their own field ("p90: ..."); fold it into the path.
            field, _, rest = message.partition(": ")
            if rest and field in _all_member_fields(parts, data):
                parts, message = [*parts, field], rest
            line = f"{'.'.join(parts) or '(top level)'}: {message}"
        if line not in seen:
            seen.add(line)
            lines.append(line)
    return lines


def _is_union_noise(error: ErrorDetails, errors: list[ErrorDetails]) -> bool:
    """A 'wrong type for one union member' error when other members report the real problem."""
    noise = ("string_type", "model_type", "dict_type")
    return len(errors) > 1 and any(e["type"] not in noise for e in errors)


def parse_scenario(data: Any, source: str = "scenario") -> Scenario:
    """Validate a parsed YAML/JSON document; raise :class:`ScenarioError` listing every problem."""
    if not isinstance(data, dict):
        raise ScenarioError(
            [f"(top level): expected a mapping of sections, got {type(data).__name__}"], source
        )
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(format_errors(exc, data), source) from None
    problems = check_consistency(scenario)
    if problems:
        raise ScenarioError(problems, source)
    return scenario


def check_consistency(scenario: Scenario) -> list[str]:
    """Knob combinations that validate one by one but cannot work together."""
    problems: list[str] = []
    try:
        model = scenario.resolve_model()
    except ValueError as exc:
        return [f"model: {exc}"]
    try:
        gpu = scenario.resolve_gpu()
    except ValueError as exc:
        return [f"gpu: {exc}"]
    engine = scenario.engine
    tp = engine.tensor_parallel_size
    if model.num_attention_heads % tp:
        problems.append(
            f"engine.tensor_parallel_size: {tp} does not divide the model's "
            f"{model.num_attention_heads} attention heads; use a divisor"
        )
    if engine.max_model_len and engine.max_model_len > model.max_position_embeddings:
        problems.append(
            f"engine.max_model_len: {engine.max_model_len} exceeds the model's "
            f"max_position_embeddings ({model.max_position_embeddings}); vLLM refuses it"
        )
    kv_heads = model.num_key_value_heads
    if tp % kv_heads and kv_heads % tp:
        problems.append(
            f"engine.tensor_parallel_size: {tp} and the model's {kv_heads} KV heads must divide "
            "one another"
        )
    latency = scenario.latency
    if isinstance(latency, ProfileLatencySpec):
        problems += _file_problem("latency.path", "profile", latency.path)
    trace = scenario.workload.trace
    if trace is not None:
        problems += _file_problem("workload.trace.path", "file", trace.path)
    max_model_len = engine.max_model_len or model.max_position_embeddings
    if not engine.enable_chunked_prefill and engine.max_num_batched_tokens < max_model_len:
        problems.append(
            f"engine.max_num_batched_tokens: {engine.max_num_batched_tokens} is below "
            f"max_model_len={max_model_len} with chunked prefill off, so long prompts could never "
            "be scheduled; raise it, lower engine.max_model_len, or set enable_chunked_prefill"
        )
    if engine.max_num_batched_tokens < engine.max_num_seqs:
        problems.append(
            f"engine.max_num_batched_tokens: {engine.max_num_batched_tokens} is below "
            f"max_num_seqs={engine.max_num_seqs}; vLLM requires it to be at least max_num_seqs"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", QuantizationWarning)
            compute_dtype(scenario.dtype, scenario.quantization, gpu)
    except ValueError as exc:
        problems.append(str(exc))
    return problems


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError([f"file not found: {path}"], str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError([f"cannot read {path}: {exc}"], str(path)) from None
    return parse_scenario(parse_yaml(text, str(path)), str(path))


def parse_yaml(text: str, source: str) -> Any:
    """``yaml.safe_load`` with errors reported as file:line:column."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError([f"{where}invalid YAML: {problem}"], source) from None


DEFAULT_SCENARIO_FILE = "default_scenario.yaml"


def default_scenario_text() -> str:
    """The embedded default scenario (Llama-3.1-8B on one H100 SXM, chat traffic)."""
    return resources.files("sim").joinpath(DEFAULT_SCENARIO_FILE).read_text(encoding="utf-8")


def default_scenario() -> Scenario:
    """The embedded default scenario, validated."""
    return parse_scenario(
        parse_yaml(default_scenario_text(), "default scenario"), "default scenario"
    )


def scenario_to_yaml(scenario: Scenario) -> str:
    """The scenario as YAML that :func:`load_scenario` reads back to an equal scenario."""
    return yaml.safe_dump(scenario.model_dump(mode="json", exclude_none=True), sort_keys=False)
