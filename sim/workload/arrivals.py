"""Arrival processes: when requests reach the fleet.

Every process is a frozen value object that knows its long-run ``mean_rate`` (requests per
second), so a simulation's measured throughput can be checked against it, and draws its arrival
times from a ``numpy.random.Generator`` it is handed (never a global RNG). Times are float64
seconds, sorted, measured from ``t = 0``; a process's first arrival is its first gap after
``t = 0`` (only a :class:`Replay` trace may place an arrival exactly at 0).

``times(rng, num_requests=..., duration_s=...)`` needs at least one limit: ``num_requests`` stops
after that many arrivals, ``duration_s`` keeps arrivals with ``t < duration_s`` (exclusive), and
with both the process stops at whichever limit it reaches first.

Poisson gaps are exact exponentials: no clamping and no rounding, so arbitrarily small gaps occur
just as often as theory says. Time-varying rates are sampled exactly too, by inverting the
integrated rate (:class:`PiecewiseRate`, :class:`OnOff`) or by Lewis–Shedler thinning
(:class:`Diurnal`), always in vectorised batches rather than one Python step per arrival.

The stationary processes (:class:`Poisson`, :class:`GammaArrivals`, :class:`Constant`) and trace
:class:`Replay` live here; the time-varying ones (:class:`PiecewiseRate`, :class:`OnOff`,
:class:`Diurnal`) in :mod:`sim.workload.varying_arrivals`, and are re-exported so that this module
names every process.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sim.workload.arrival_sampling import FloatArray, check_limits, renewal_times, require_positive
from sim.workload.varying_arrivals import Diurnal, OnOff, PiecewiseRate

__all__ = [
    "ArrivalProcess",
    "AtOnce",
    "Constant",
    "Diurnal",
    "GammaArrivals",
    "OnOff",
    "PiecewiseRate",
    "Poisson",
    "Replay",
]


class ArrivalProcess(Protocol):
    """A stochastic stream of request arrival times."""

    @property
    def mean_rate(self) -> float:
        """Long-run average arrivals per second."""
        ...

    def times(
        self,
        rng: np.random.Generator,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
    ) -> FloatArray:
        """Sorted arrival times in seconds, limited by ``num_requests`` and/or ``duration_s``."""
        ...


# ---------------------------------------------------------------------------------------------
# Renewal processes


@dataclass(frozen=True)
class Poisson:
    """Homogeneous Poisson arrivals at ``rate`` per second.

    Gaps are exact exponentials with mean ``1 / rate`` (no clamping, no rounding), so the
    process is memoryless and very short gaps occur as often as theory predicts.
    """

    rate: float

    def __post_init__(self) -> None:
        require_positive("rate", self.rate)

    @property
    def mean_rate(self) -> float:
        """Arrivals per second: ``rate``."""
        return float(self.rate)

    def times(
        self,
        rng: np.random.Generator,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
    ) -> FloatArray:
        """Sorted arrival times (s); see the module docstring for the limit semantics."""
        check_limits(num_requests, duration_s)
        scale = 1.0 / self.rate
        return renewal_times(
            lambda size: rng.exponential(scale, size), scale, num_requests, duration_s
        )


@dataclass(frozen=True)
class GammaArrivals:
    """Renewal arrivals with gamma gaps: mean ``1 / rate``, coefficient of variation ``cv``.

    The gap shape is ``1 / cv**2`` and the scale ``1 / (rate * shape)``. ``cv = 1`` is exactly
    a Poisson process; ``cv > 1`` is burstier (clusters of near-simultaneous arrivals separated
    by long lulls), ``cv < 1`` more regular.
    """

    rate: float
    cv: float

    def __post_init__(self) -> None:
        require_positive("rate", self.rate)
        require_positive("cv", self.cv)

    @property
    def mean_rate(self) -> float:
        """Arrivals per second: ``rate``."""
        return float(self.rate)

    @property
    def shape(self) -> float:
        """Gamma shape parameter of the gaps, ``1 / cv**2``."""
        return 1.0 / (self.cv * self.cv)

    @property
    def scale_s(self) -> float:
        """Gamma scale parameter of the gaps in seconds, ``1 / (rate * shape)``."""
        return 1.0 / (self.rate * self.shape)

    def times(
        self,
        rng: np.random.Generator,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
    ) -> FloatArray:
        """Sorted arrival times (s); see the module docstring for the limit semantics."""
        check_limits(num_requests, duration_s)
        shape, scale = self.shape, self.scale_s
        return renewal_times(
            lambda size: rng.gamma(shape, scale, size), 1.0 / self.rate, num_requests, duration_s
        )


@dataclass(frozen=True)
class Constant:
    """Deterministic arrivals every ``1 / rate`` seconds: the k-th arrival is at ``k / rate``.

    The generator is accepted for interface compatibility and never used.
    """

    rate: float

    def __post_init__(self) -> None:
        require_positive("rate", self.rate)

    @property
    def mean_rate(self) -> float:
        """Arrivals per second: ``rate``."""
        return float(self.rate)

    def times(
        self,
        rng: np.random.Generator,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
    ) -> FloatArray:
        """Arrivals at ``1/rate, 2/rate, ...``; see the module docstring for the limits."""
        check_limits(num_requests, duration_s)
        count = math.inf if num_requests is None else num_requests
        if duration_s is not None:
            # k / rate < duration_s  <=>  k < duration_s * rate; fix up float rounding below.
            count = min(count, math.ceil(duration_s * self.rate))
        times = np.arange(1, int(count) + 1, dtype=np.float64) / self.rate
        if duration_s is not None:
            times = times[times < duration_s]
        return times


@dataclass(frozen=True)
class AtOnce:
    """Every request at t = 0: an infinite rate (``vllm bench serve --request-rate inf``).

    Alone it is a burst; with a concurrency cap (``workload.max_concurrency``) it is a closed
    loop of that many users. ``num_requests`` is required: a duration bounds nothing here. The
    generator is accepted for interface compatibility and never used.
    """

    @property
    def mean_rate(self) -> float:
        """Arrivals per second: infinite."""
        return math.inf

    def times(
        self,
        rng: np.random.Generator,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
    ) -> FloatArray:
        """``num_requests`` zeros."""
        check_limits(num_requests, duration_s)
        if num_requests is None:
            raise ValueError("num_requests: an infinite rate needs a number of requests")
        return np.zeros(num_requests, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# Trace replay


@dataclass(frozen=True, eq=False)
class Replay:
    """Replays recorded arrival times: arrival ``k`` is at ``times_s[k] * time_scale``.

    ``time_scale = 0.5`` replays the trace twice as fast (double the rate). ``times_s`` must be
    non-empty, finite, ``>= 0`` and non-decreasing, with the last one after 0; it is stored as a
    read-only float64 array (so instances compare and hash by identity). ``num_requests`` and
    ``duration_s`` truncate the trace; once it runs out, fewer arrivals are returned. The
    generator is accepted for interface compatibility and never used. ``mean_rate`` is the
    number of arrivals over the replayed span from 0 to the last arrival.
    """

    times_s: FloatArray | Sequence[float]
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        try:
            times = np.array(self.times_s, dtype=np.float64)
        except (TypeError, ValueError) as error:
            raise ValueError("times_s: must be a 1-D sequence of numbers (seconds)") from error
        if times.ndim != 1 or times.size == 0:
            raise ValueError(
                f"times_s: must be a non-empty 1-D sequence of seconds, got shape {times.shape}"
            )
        if not np.all(np.isfinite(times)) or times[0] < 0:
            raise ValueError("times_s: every time must be finite and >= 0 (shift the trace to 0)")
        if np.any(np.diff(times) < 0):
            raise ValueError("times_s: must be non-decreasing; sort the trace first")
        if times[-1] <= 0:
            raise ValueError("times_s: the last arrival must be after t = 0 (the span is empty)")
        require_positive("time_scale", self.time_scale)
        times.flags.writeable = False
        object.__setattr__(self, "times_s", times)

    @property
    def mean_rate(self) -> float:
        """Arrivals per second over the replayed span ``[0, last arrival]``."""
        times = np.asarray(self.times_s, dtype=np.float64)
        return times.size / (float(times[-1]) * self.time_scale)

    def times(
        self,
        rng: np.random.Generator,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
    ) -> FloatArray:
        """The scaled trace, truncated by ``num_requests`` and/or ``duration_s``."""
        check_limits(num_requests, duration_s)
        times = np.asarray(self.times_s, dtype=np.float64) * self.time_scale
        if num_requests is not None:
            times = times[:num_requests]
        if duration_s is not None:
            times = times[: int(np.searchsorted(times, duration_s, side="left"))]
        return times
