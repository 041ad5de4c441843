"""The ``workload:`` section: arrivals, prompt and output lengths, prefix structure, or a trace
to replay; and how many requests (or how long) to generate."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, model_validator

from sim.scenario.base import PositiveFloat, PositiveInt, Spec, TokenCount
from sim.workload.arrivals import PiecewiseRate
from sim.workload.generate import MAX_REQUESTS, MAX_TOKENS
from sim.workload.lengths import LogNormalLength

# -- arrivals -------------------------------------------------------------------------------
#: Requests per second of a renewal process; ``inf`` (YAML ``.inf`` or ``inf``) sends every
#: request at t = 0, as ``vllm bench serve --request-rate inf`` does.
Rate = Annotated[float, Field(gt=0, allow_inf_nan=True)]


class PoissonArrivalSpec(Spec):
    """Poisson arrivals at ``rate`` requests per second (exact exponential gaps)."""

    type: Literal["poisson"]
    rate: Rate


class GammaArrivalSpec(Spec):
    """Renewal arrivals with gamma gaps: mean rate ``rate``, coefficient of variation ``cv``.

    ``burstiness`` is ``vllm bench serve --burstiness`` (the gamma shape: 1 is Poisson, lower
    is burstier) and may stand in for ``cv``: ``cv = 1/√burstiness``.
    """

    type: Literal["gamma"]
    rate: Rate
    cv: Annotated[float, Field(ge=0.01, le=100)]

    @model_validator(mode="before")
    @classmethod
    def _burstiness_as_cv(cls, data: object) -> object:
        if not isinstance(data, dict) or "burstiness" not in data:
            return data
        data = dict(data)
        burstiness = data.pop("burstiness")
        if "cv" in data:
            raise ValueError("give cv or burstiness, not both (cv = 1/sqrt(burstiness))")
        if isinstance(burstiness, bool) or not isinstance(burstiness, int | float):
            raise ValueError(f"burstiness: must be a number > 0, got {burstiness!r}")
        if not 1e-4 <= burstiness <= 1e4:
            raise ValueError(
                f"burstiness: must be in [0.0001, 10000] (cv 100 … 0.01), got {burstiness}"
            )
        data["cv"] = float(burstiness) ** -0.5
        return data


class ConstantArrivalSpec(Spec):
    """Evenly spaced arrivals."""

    type: Literal["constant"]
    rate: Rate


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
    min_tokens: TokenCount = 1
    max_tokens: TokenCount | None = None

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
    value: TokenCount


class UniformLengthSpec(Spec):
    """Integers uniform in ``[low, high]``."""

    type: Literal["uniform"]
    low: TokenCount
    high: TokenCount

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
    prefix_tokens: TokenCount
    share: Annotated[float, Field(ge=0, le=1)] = 1.0


class MultiTurnSpec(Spec):
    """Sessions whose turns extend the conversation; arrivals are session starts."""

    type: Literal["multi_turn"]
    turns: LengthSpec
    think_time_s: Annotated[float, Field(ge=0)]
    system_prompt_tokens: Annotated[int, Field(ge=0, le=MAX_TOKENS)] = 0


PrefixSpec = Annotated[NoPrefixSpec | SharedPrefixSpec | MultiTurnSpec, Field(discriminator="type")]


class PriorityClassSpec(Spec):
    """One class of requests: vLLM's ``priority`` (lower is served first) and its share."""

    priority: int
    share: Annotated[float, Field(gt=0, le=1)]


class PrioritySpec(Spec):
    """Request priorities drawn per request (per session for multi-turn), by class share."""

    classes: Annotated[list[PriorityClassSpec], Field(min_length=1)]

    @model_validator(mode="after")
    def _a_distribution(self) -> PrioritySpec:
        total = sum(c.share for c in self.classes)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"classes: the shares must sum to 1, got {total:g}")
        priorities = [c.priority for c in self.classes]
        if len(set(priorities)) != len(priorities):
            raise ValueError(f"classes: each priority once, got {priorities}")
        return self


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
    # Closed loop: at most this many requests in flight from the clients (vllm bench serve
    # --max-concurrency, GuideLLM's concurrent profile). A request waits at the client, from
    # its arrival until a slot frees, and its TTFT counts from when it is sent.
    max_concurrency: PositiveInt | None = None
    # A closed-loop user's pause after an answer before its slot takes the next request.
    think_time_s: Annotated[float, Field(ge=0)] = 0.0
    # Request priorities by class (engine.scheduling_policy: priority); a trace may carry its
    # own in a ``priority`` column instead.
    priority: PrioritySpec | None = None

    @model_validator(mode="after")
    def _closed_loop(self) -> WorkloadSpec:
        if self.think_time_s > 0 and self.max_concurrency is None:
            raise ValueError(
                "think_time_s: a closed-loop user's pause between requests needs "
                "max_concurrency (the number of users); for the pause between a session's "
                "turns use prefix.think_time_s"
            )
        return self

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
                if math.isinf(_peak_rate(self.arrival)):
                    raise ValueError(
                        "arrival.rate: inf sends every request at t = 0, so duration_s cannot "
                        "bound their number; give num_requests"
                    )
                bound = _peak_rate(self.arrival) * self.duration_s
                if bound > MAX_REQUESTS:
                    raise ValueError(
                        f"duration_s: {self.duration_s:g} s at up to {_peak_rate(self.arrival):g} "
                        f"req/s could be ~{bound:,.0f} requests, above the {MAX_REQUESTS:,} a "
                        "run holds; shorten duration_s or add num_requests (whichever ends first)"
                    )
        return self


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
