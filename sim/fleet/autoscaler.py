"""The Kubernetes HorizontalPodAutoscaler's algorithm, driving a simulated fleet.

As documented for autoscaling/v2 (kubernetes.io, "Horizontal Pod Autoscaling"): every
``sync_period_s`` the controller reads a metric and computes

    desired = ceil(current × metric / target)

leaving the count unchanged while ``|metric / target − 1| <= tolerance`` (10 % by default).
The raw recommendation then passes through, in order:

* the stabilization window of its direction: scaling up uses the *lowest* recommendation of the
  last ``scale_up.stabilization_window_s`` (0 s by default), scaling down the *highest* of the
  last ``scale_down.stabilization_window_s`` (300 s by default), so a brief dip does not remove
  replicas;
* the rate policies of its direction: each policy allows a change of ``value`` pods, or
  ``value`` per cent of the replicas there were ``period_s`` ago, within any ``period_s``;
  ``select: max`` takes the most permissive policy (the default), ``min`` the least,
  ``disabled`` forbids scaling in that direction. Defaults as Kubernetes': up by the larger of
  4 pods or 100 % per 15 s, down by 100 % per 15 s;
* ``min_replicas`` and ``max_replicas``.

``current`` is the number of replicas asked for (ready or still starting, not draining). Metrics
(``metric.type``):

``ttft_ms``
    An External metric of type Value: the ``percentile`` of TTFT (ms) over requests whose first
    token came in the last ``window_s`` (recorded when they finish, as a histogram is scraped).
``waiting_per_replica``, ``running_per_replica``, ``kv_usage``
    Pods metrics (AverageValue): the mean over ready replicas of ``vllm:num_requests_waiting``,
    ``vllm:num_requests_running`` and ``vllm:kv_cache_usage_perc`` (0–1). As the HPA does for
    pods that are not ready yet, a scale-up counts starting replicas as reporting 0, so it does
    not overshoot while they load weights.

A new replica is routed to only after its start-up time (container start plus weights read at
``weight_load_gb_s``); a removed replica drains: it takes no new requests and finishes the ones
it has (replicas still starting are removed first, then the least loaded).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import simpy

from sim.engine.request import Record, RequestStatus
from sim.fleet.pool import Fleet, FleetReplica

MetricType = Literal["ttft_ms", "waiting_per_replica", "running_per_replica", "kv_usage"]


@dataclass(frozen=True)
class ScalingPolicy:
    """At most ``value`` pods (``type='pods'``) or per cent (``'percent'``) per ``period_s``."""

    type: Literal["pods", "percent"]
    value: float
    period_s: float


@dataclass(frozen=True)
class ScalingRules:
    """One direction's behaviour: stabilization window, rate policies and how to pick one."""

    stabilization_window_s: float
    policies: tuple[ScalingPolicy, ...]
    select: Literal["max", "min", "disabled"] = "max"


DEFAULT_SCALE_UP = ScalingRules(
    0.0, (ScalingPolicy("pods", 4, 15.0), ScalingPolicy("percent", 100, 15.0))
)
DEFAULT_SCALE_DOWN = ScalingRules(300.0, (ScalingPolicy("percent", 100, 15.0),))


@dataclass(frozen=True)
class AutoscalerConfig:
    """An HPA's spec (see the module docstring); ``startup_s`` is a new replica's start-up."""

    min_replicas: int
    max_replicas: int
    metric: MetricType
    target: float
    startup_s: float
    percentile: float = 90.0
    window_s: float = 60.0
    sync_period_s: float = 15.0
    tolerance: float = 0.1
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN


@dataclass
class ScaleEvent:
    """One change of the desired replica count, for the summary."""

    time_s: float
    metric: float
    current: int
    desired: int


@dataclass
class Autoscaler:
    """Runs the HPA loop on ``fleet`` as a SimPy process; see :meth:`observe` for TTFT."""

    env: simpy.Environment
    fleet: Fleet
    config: AutoscalerConfig
    events: list[ScaleEvent] = field(default_factory=list)
    _ttft: deque[tuple[float, float]] = field(default_factory=deque)
    _recommendations: deque[tuple[float, int]] = field(default_factory=deque)
    _changes: deque[tuple[float, int]] = field(default_factory=deque)  # (time, +added/-removed)

    def start(self) -> None:
        self.env.process(self._loop())

    def observe(self, record: Record) -> None:
        """Feed a finished request's TTFT to the ``ttft_ms`` metric."""
        if record.status == RequestStatus.OK and record.first_token_s is not None:
            self._ttft.append((record.first_token_s, record.first_token_s - record.arrival_s))

    # -- the control loop ----------------------------------------------------------------------
    def _loop(self) -> Generator[simpy.Event, Any, None]:
        while True:
            yield self.env.timeout(self.config.sync_period_s)
            self.sync()

    def _current(self) -> list[FleetReplica]:
        return [r for r in self.fleet.replicas if r.accepting]

    def metric_value(self, scale_up: bool) -> float | None:
        """The metric now; None when there is nothing to measure (no TTFT in the window)."""
        config = self.config
        now = self.env.now
        if config.metric == "ttft_ms":
            while self._ttft and self._ttft[0][0] < now - config.window_s:
                self._ttft.popleft()
            if not self._ttft:
                return None
            values = np.fromiter((t for _, t in self._ttft), dtype=np.float64)
            return float(np.percentile(values, config.percentile)) * 1e3
        ready = [r for r in self._current() if r.ready]
        starting = [r for r in self._current() if not r.ready]
        samples = [_replica_metric(config.metric, r) for r in ready]
        if scale_up:
            samples += [0.0] * len(starting)
        return sum(samples) / len(samples) if samples else None

    def sync(self) -> None:
        """One reconciliation: read the metric, recommend, stabilize, rate-limit, act."""
        config = self.config
        now = self.env.now
        current = len(self._current())
        periods = [p.period_s for p in (*config.scale_up.policies, *config.scale_down.policies)]
        horizon = max(periods, default=0.0)
        while self._changes and self._changes[0][0] <= now - horizon:
            self._changes.popleft()
        metric = self.metric_value(scale_up=False)
        if metric is None:
            return
        ratio = metric / config.target
        raw = current
        if ratio > 1 + config.tolerance:
            # Starting replicas count as reporting 0: if that undoes the need, wait for them.
            damped = self.metric_value(scale_up=True)
            damped_ratio = (damped or 0.0) / config.target
            if damped_ratio > 1 + config.tolerance:
                raw = math.ceil(current * damped_ratio)
        elif ratio < 1 - config.tolerance:
            raw = math.ceil(current * ratio)
        raw = min(max(raw, config.min_replicas), config.max_replicas)
        desired = self._stabilize(now, raw, current)
        desired = self._rate_limit(now, desired, current)
        desired = min(max(desired, config.min_replicas), config.max_replicas)
        if desired != current:
            self.events.append(ScaleEvent(now, metric, current, desired))
            self._changes.append((now, desired - current))
            self._apply(desired - current)

    def _stabilize(self, now: float, raw: int, current: int) -> int:
        self._recommendations.append((now, raw))
        horizon = max(
            self.config.scale_up.stabilization_window_s,
            self.config.scale_down.stabilization_window_s,
        )
        while self._recommendations and self._recommendations[0][0] < now - horizon:
            self._recommendations.popleft()

        def within(window: float) -> list[int]:
            return [r for t, r in self._recommendations if t >= now - window]

        up_floor = min(within(self.config.scale_up.stabilization_window_s))
        down_ceiling = max(within(self.config.scale_down.stabilization_window_s))
        if raw > current:
            return max(current, up_floor)
        if raw < current:
            return min(current, down_ceiling)
        return current

    def _rate_limit(self, now: float, desired: int, current: int) -> int:
        if desired == current:
            return current
        rules = self.config.scale_up if desired > current else self.config.scale_down
        if rules.select == "disabled":
            return current
        up = desired > current
        limits = [self._policy_limit(now, policy, up, current) for policy in rules.policies]
        if not limits:
            return desired
        # "max" is the policy allowing the largest change: the highest limit up, lowest down.
        most_permissive = rules.select == "max"
        if up:
            return min(desired, max(limits) if most_permissive else min(limits))
        return max(desired, min(limits) if most_permissive else max(limits))

    def _policy_limit(self, now: float, policy: ScalingPolicy, up: bool, current: int) -> int:
        """The most (up) or fewest (down) replicas ``policy`` allows now, relative to the count
        at the start of the period: the current count less the replicas added (up) or plus
        those removed (down) less than ``period_s`` ago, as the HPA controller reckons it."""
        recent = [d for t, d in self._changes if t > now - policy.period_s]
        if up:
            start = current - sum(d for d in recent if d > 0)
        else:
            start = current - sum(d for d in recent if d < 0)
        if policy.type == "pods":
            return start + int(policy.value) if up else start - int(policy.value)
        factor = 1 + policy.value / 100 if up else 1 - policy.value / 100
        return math.ceil(start * factor)

    def _apply(self, change: int) -> None:
        if change > 0:
            for _ in range(change):
                self.fleet.add_replica(self.config.startup_s)
            return
        victims = sorted(self._current(), key=lambda r: (r.ready, r.outstanding, -r.replica_id))[
            :-change
        ]
        for replica in victims:
            self.fleet.drain(replica)


def _replica_metric(metric: MetricType, replica: FleetReplica) -> float:
    replica.sync()
    match metric:
        case "waiting_per_replica":
            return float(replica.num_waiting)
        case "running_per_replica":
            return float(replica.scheduler.num_running)
        case "kv_usage":
            return replica.kv.usage
    raise AssertionError(metric)


def startup_seconds(container_s: float, weight_bytes: float, weight_load_gb_s: float) -> float:
    """A replica's start-up: container start plus reading ``weight_bytes`` at the given rate."""
    return container_s + weight_bytes / (weight_load_gb_s * 1e9)
