"""A scenario's ``workload`` section → its requests: the arrival process, length distributions
and prefix structure it names, or the trace it replays."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NoReturn

import numpy as np

from sim.build.seeds import scenario_seeds
from sim.engine.request import Request
from sim.scenario import (
    ArrivalSpec,
    ConstantArrivalSpec,
    GammaArrivalSpec,
    LengthSpec,
    MultiTurnSpec,
    PoissonArrivalSpec,
    Scenario,
    SharedPrefixSpec,
    WorkloadSpec,
)
from sim.workload import arrivals as arr
from sim.workload import lengths as lens
from sim.workload.generate import (
    MultiTurn,
    PrefixStructure,
    SharedPrefix,
    content_salt,
    requests_from_trace,
    synthetic_requests,
    with_priorities,
)
from sim.workload.traces import TraceFormatError, read_trace


def make_arrivals(spec: ArrivalSpec) -> arr.ArrivalProcess:
    """The arrival process a scenario's ``workload.arrival`` describes."""
    renewal = PoissonArrivalSpec | GammaArrivalSpec | ConstantArrivalSpec
    if isinstance(spec, renewal) and math.isinf(spec.rate):
        return arr.AtOnce()
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


def _lengths_of(field: str, spec: LengthSpec) -> lens.LengthDistribution:
    """:func:`make_lengths`, its errors (an empirical table's ``path: ...``) under ``field``."""
    try:
        return make_lengths(spec)
    except ValueError as exc:
        raise ValueError(f"{field}.{exc}") from None


def make_prefix(workload: WorkloadSpec) -> PrefixStructure:
    """The prefix/session structure of a synthetic workload."""
    prefix = workload.prefix
    if isinstance(prefix, SharedPrefixSpec):
        return SharedPrefix(prefix.num_groups, prefix.prefix_tokens, prefix.share)
    if isinstance(prefix, MultiTurnSpec):
        return MultiTurn(
            _lengths_of("workload.prefix.turns", prefix.turns),
            prefix.think_time_s,
            prefix.system_prompt_tokens,
        )
    return None


def build_requests(workload: WorkloadSpec, seed_sequence: np.random.SeedSequence) -> list[Request]:
    """The scenario's requests, sorted by arrival. Same seed → same requests. A workload
    without any (no arrival within ``duration_s``) is refused, as an empty trace is."""
    requests = _as_list(_unprioritised_requests(workload, seed_sequence))
    if not requests:
        _no_request(workload)
    if workload.priority is None:
        return requests
    classes = workload.priority.classes
    if any(r.priority for r in requests):
        raise ValueError(
            "workload.priority: the trace carries its own priorities; remove workload.priority "
            "or the trace's priority column"
        )
    priorities = tuple(c.priority for c in classes)
    shares = tuple(c.share for c in classes)
    return with_priorities(requests, priorities, shares, seed_sequence)


def request_source(
    workload: WorkloadSpec, seed_sequence: np.random.SeedSequence
) -> Sequence[Request]:
    """:func:`build_requests` for a simulation: the same requests, but a synthetic workload
    without sessions or priority classes stays as columns (:class:`SyntheticRequests`), its
    requests built as the run reaches them."""
    if workload.priority is not None:
        return build_requests(workload, seed_sequence)
    requests = _unprioritised_requests(workload, seed_sequence)
    if not len(requests):
        _no_request(workload)
    return requests


def _as_list(requests: Sequence[Request]) -> list[Request]:
    return requests if isinstance(requests, list) else list(requests)


def _no_request(workload: WorkloadSpec) -> NoReturn:
    # Only a time horizon can leave none: num_requests >= 1, and a trace holds a request.
    assert workload.duration_s is not None
    raise ValueError(
        f"workload.duration_s: no request arrives within {workload.duration_s:g} s; "
        "lengthen duration_s or raise the arrival rate"
    )


def _unprioritised_requests(
    workload: WorkloadSpec, seed_sequence: np.random.SeedSequence
) -> Sequence[Request]:
    """A trace's requests, or a synthetic workload's (as columns without sessions)."""
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
        except ValueError as exc:  # a format read_trace does not know
            raise ValueError(f"workload.trace.format: {exc}") from None
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
    return synthetic_requests(
        seed_sequence,
        make_arrivals(workload.arrival),
        _lengths_of("workload.prompt_tokens", workload.prompt_tokens),
        _lengths_of("workload.output_tokens", workload.output_tokens),
        make_prefix(workload),
        num_requests=workload.num_requests,
        duration_s=workload.duration_s,
    )


def scenario_requests(scenario: Scenario) -> list[Request]:
    """The scenario's requests, exactly as its simulation sees them (live replay sends these)."""
    return build_requests(scenario.workload, scenario_seeds(scenario)[0])
