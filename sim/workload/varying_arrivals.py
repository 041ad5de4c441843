"""Time-varying arrival processes: piecewise rate profiles, on/off bursts and daily cycles.

Each is a non-homogeneous Poisson process sampled exactly: :class:`PiecewiseRate` (and
:class:`OnOff`, which is a periodic step profile) by inverting the integrated rate,
:class:`Diurnal` by Lewis–Shedler thinning. They follow the conventions of
:mod:`sim.workload.arrivals` (which re-exports them): a ``mean_rate``, and ``times(rng,
num_requests=..., duration_s=...)`` returning sorted float64 seconds from ``t = 0``. Each also
gives its instantaneous ``rate_at`` and the ``expected_count`` of arrivals in an interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Literal

import numpy as np
import numpy.typing as npt

from sim.workload.arrival_sampling import (
    FloatArray,
    check_limits,
    renewal_times,
    require_non_negative,
    require_positive,
    thinned_times,
)


@dataclass(frozen=True)
class _RateTable:
    """Piecewise-linear rate on segments ``[starts[i], starts[i] + lengths[i])``.

    ``cumulative[i]`` is the integral of the rate from 0 to ``starts[i]``. Without a period the
    last segment is unbounded (``lengths[-1] = inf``, constant rate).
    """

    starts: FloatArray
    lengths: FloatArray
    rates: FloatArray
    slopes: FloatArray
    cumulative: FloatArray
    period_s: float | None
    period_integral: float  # integral over one period, or over the bounded segments

    def rate_at(self, t_s: FloatArray) -> FloatArray:
        local = self._local_time(t_s)
        index = np.searchsorted(self.starts, local, side="right") - 1
        out: FloatArray = self.rates[index] + self.slopes[index] * (local - self.starts[index])
        return out

    def integral(self, t_s: FloatArray) -> FloatArray:
        local = self._local_time(t_s)
        index = np.searchsorted(self.starts, local, side="right") - 1
        u = local - self.starts[index]
        within = self.cumulative[index] + u * (self.rates[index] + 0.5 * self.slopes[index] * u)
        if self.period_s is None:
            return within
        periods = np.floor(t_s / self.period_s)
        out: FloatArray = periods * self.period_integral + within
        return out

    def inverse(self, level: FloatArray) -> FloatArray:
        """Earliest time at which the integrated rate reaches ``level`` (vectorised)."""
        if self.period_s is None:
            periods = np.zeros_like(level)
            local = level
        else:
            periods = np.floor(level / self.period_integral)
            local = level - periods * self.period_integral
        index = np.searchsorted(self.cumulative, local, side="right") - 1
        y = local - self.cumulative[index]
        rate = self.rates[index]
        slope = self.slopes[index]
        # Root of slope/2 u^2 + rate u - y = 0 in the form without cancellation; it also covers
        # slope = 0 (u = y / rate) and rate = 0 (u = sqrt(2 y / slope)).
        root = np.sqrt(np.maximum(rate * rate + 2.0 * slope * y, 0.0))
        denominator = rate + root
        safe = np.where(denominator > 0, denominator, 1.0)
        u = np.where(denominator > 0, 2.0 * y / safe, 0.0)
        u = np.clip(u, 0.0, self.lengths[index])
        times: FloatArray = self.starts[index] + u
        if self.period_s is not None:
            times = periods * self.period_s + times
        return times

    def _local_time(self, t_s: FloatArray) -> FloatArray:
        if self.period_s is None:
            return t_s
        out: FloatArray = np.mod(t_s, self.period_s)
        return out


def _build_rate_table(
    points: tuple[tuple[float, float], ...],
    interpolation: Literal["step", "linear"],
    period_s: float | None,
) -> _RateTable:
    times = np.array([t for t, _ in points], dtype=np.float64)
    rates = np.array([r for _, r in points], dtype=np.float64)
    if period_s is None:
        ends = np.append(times[1:], math.inf)
        next_rates = np.append(rates[1:], rates[-1])  # held after the last point
    else:
        ends = np.append(times[1:], period_s)
        # A linear profile wraps back to the first rate at the period end; a step profile holds.
        wrap = rates[0] if interpolation == "linear" else rates[-1]
        next_rates = np.append(rates[1:], wrap)
    lengths = ends - times
    if interpolation == "linear":
        slopes = np.zeros_like(rates)
        bounded = np.isfinite(lengths)
        slopes[bounded] = (next_rates[bounded] - rates[bounded]) / lengths[bounded]
    else:
        slopes = np.zeros_like(rates)
    # The unbounded last segment of a non-periodic profile adds nothing to the bounded total.
    finite_lengths = np.where(np.isfinite(lengths), lengths, 0.0)
    areas = finite_lengths * (rates + 0.5 * slopes * finite_lengths)
    cumulative = np.concatenate(([0.0], np.cumsum(areas)[:-1]))
    period_integral = float(np.sum(areas))
    return _RateTable(
        starts=times,
        lengths=lengths,
        rates=rates,
        slopes=slopes,
        cumulative=cumulative,
        period_s=period_s,
        period_integral=period_integral,
    )


def _as_points(points: Sequence[Sequence[float]]) -> tuple[tuple[float, float], ...]:
    try:
        pairs = tuple((float(t), float(r)) for t, r in points)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"points: must be a sequence of (time_s, rate) pairs, got {points!r}"
        ) from error
    if not pairs:
        raise ValueError("points: give at least one (time_s, rate) pair, starting with (0, rate)")
    return pairs


@dataclass(frozen=True)
class PiecewiseRate:
    """Non-homogeneous Poisson arrivals whose rate follows ``(time_s, rate)`` breakpoints.

    The first point must be at ``time_s = 0``, times strictly increase, rates are finite and
    ``>= 0``, not all zero. ``interpolation="step"`` holds each rate until the next point;
    ``"linear"`` ramps between points. After the last point the last rate is held for ever,
    unless ``period_s`` is given (it must exceed the last point's time): then the profile on
    ``[0, period_s)`` repeats, a step profile holding its last rate until ``period_s`` and a
    linear one ramping from its last rate back to the first rate at ``period_s``.

    ``mean_rate`` is the rate's average over one period when periodic, and otherwise the
    long-run rate after the last point. If that held rate is 0 the process has finitely many
    arrivals, and ``times`` may return fewer than ``num_requests``.

    Sampling is exact: unit-rate Poisson points are mapped through the inverse of the
    integrated rate (the time-rescaling theorem), so no arrival falls where the rate is 0.
    """

    points: tuple[tuple[float, float], ...]
    interpolation: Literal["step", "linear"] = "step"
    period_s: float | None = None
    _table: _RateTable = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        points = _as_points(self.points)
        object.__setattr__(self, "points", points)
        if points[0][0] != 0.0:
            raise ValueError(
                f"points: the first point's time must be 0 (the profile starts at t = 0), "
                f"got {points[0][0]!r}"
            )
        for (t_prev, _), (t_next, _) in pairwise(points):
            if not (math.isfinite(t_next) and t_next > t_prev):
                raise ValueError(
                    f"points: times must be finite and strictly increasing, got {t_prev!r} "
                    f"then {t_next!r}"
                )
        for t, rate in points:
            if not (math.isfinite(rate) and rate >= 0):
                raise ValueError(
                    f"points: rates must be finite and >= 0, got {rate!r} at t = {t!r}"
                )
        if all(rate == 0 for _, rate in points):
            raise ValueError("points: at least one rate must be > 0 (all rates are 0)")
        if self.interpolation not in ("step", "linear"):
            raise ValueError(
                f"interpolation: must be 'step' or 'linear', got {self.interpolation!r}"
            )
        if self.period_s is not None:
            require_positive("period_s", self.period_s)
            if self.period_s <= points[-1][0]:
                raise ValueError(
                    f"period_s: must be greater than the last point's time {points[-1][0]!r}, "
                    f"got {self.period_s!r}"
                )
        object.__setattr__(
            self, "_table", _build_rate_table(points, self.interpolation, self.period_s)
        )

    @property
    def mean_rate(self) -> float:
        """Average rate over one period if periodic, else the rate held after the last point."""
        if self.period_s is None:
            return float(self.points[-1][1])
        return self._table.period_integral / self.period_s

    def rate_at(self, t_s: npt.ArrayLike) -> FloatArray:
        """The instantaneous rate (requests per second) at times ``t_s >= 0``."""
        return self._table.rate_at(np.asarray(t_s, dtype=np.float64))

    def expected_count(self, start_s: float, end_s: float) -> float:
        """Expected number of arrivals in ``[start_s, end_s)``: the integral of the rate."""
        ends = self._table.integral(np.array([start_s, end_s], dtype=np.float64))
        return float(ends[1] - ends[0])

    def times(
        self,
        rng: np.random.Generator,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
    ) -> FloatArray:
        """Sorted arrival times (s); see the module docstring for the limit semantics."""
        check_limits(num_requests, duration_s)
        table = self._table
        bound = math.inf
        if duration_s is not None:
            bound = float(table.integral(np.array([duration_s], dtype=np.float64))[0])
        if self.period_s is None and self.points[-1][1] == 0:
            bound = min(bound, table.period_integral)  # no arrivals once the rate stays 0
        levels = renewal_times(
            rng.standard_exponential,
            1.0,
            num_requests,
            None if math.isinf(bound) else bound,
        )
        # The inverse is monotone in exact arithmetic; the running maximum removes any
        # last-ulp inversion at segment boundaries so the output is guaranteed sorted.
        times = np.maximum.accumulate(table.inverse(levels)) if levels.size else levels
        if duration_s is not None:
            times = times[times < duration_s]
        return times


@dataclass(frozen=True)
class OnOff:
    """Bursty arrivals: Poisson at ``on_rate`` for ``on_s`` seconds, then ``off_rate`` for
    ``off_s`` seconds, repeating from ``t = 0``, which starts an "on" period.

    With the default ``off_rate = 0`` no request arrives during an off period. ``mean_rate`` is
    the time-weighted average ``(on_rate*on_s + off_rate*off_s) / (on_s + off_s)``.
    """

    on_rate: float
    on_s: float
    off_s: float
    off_rate: float = 0.0
    _profile: PiecewiseRate = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        require_positive("on_rate", self.on_rate)
        require_positive("on_s", self.on_s)
        require_positive("off_s", self.off_s)
        require_non_negative("off_rate", self.off_rate)
        profile = PiecewiseRate(
            points=((0.0, float(self.on_rate)), (float(self.on_s), float(self.off_rate))),
            interpolation="step",
            period_s=float(self.on_s + self.off_s),
        )
        object.__setattr__(self, "_profile", profile)

    @property
    def mean_rate(self) -> float:
        """Time-weighted average of the on and off rates."""
        return (self.on_rate * self.on_s + self.off_rate * self.off_s) / (self.on_s + self.off_s)

    def rate_at(self, t_s: npt.ArrayLike) -> FloatArray:
        """The instantaneous rate at times ``t_s >= 0``: ``on_rate`` or ``off_rate``."""
        return self._profile.rate_at(t_s)

    def expected_count(self, start_s: float, end_s: float) -> float:
        """Expected number of arrivals in ``[start_s, end_s)``."""
        return self._profile.expected_count(start_s, end_s)

    def times(
        self,
        rng: np.random.Generator,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
    ) -> FloatArray:
        """Sorted arrival times (s); see the module docstring for the limit semantics."""
        return self._profile.times(rng, num_requests=num_requests, duration_s=duration_s)


@dataclass(frozen=True)
class Diurnal:
    """Daily-cycle Poisson arrivals: ``r(t) = mean_rate * (1 + amplitude * cos(2π(t − peak_s)
    / period_s))``, highest at ``peak_s`` (and every period after), lowest half a period later.

    ``0 <= amplitude <= 1`` keeps the rate non-negative; ``amplitude = 1`` drops it to 0 at the
    trough. Sampled exactly by thinning candidates at the peak rate.
    """

    mean_rate: float
    amplitude: float
    period_s: float = 86400.0
    peak_s: float = 0.0

    def __post_init__(self) -> None:
        require_positive("mean_rate", self.mean_rate)
        if not (math.isfinite(self.amplitude) and 0.0 <= self.amplitude <= 1.0):
            raise ValueError(
                f"amplitude: must be between 0 and 1 (relative swing around mean_rate), "
                f"got {self.amplitude!r}"
            )
        require_positive("period_s", self.period_s)
        if not math.isfinite(self.peak_s):
            raise ValueError(f"peak_s: must be a finite time in seconds, got {self.peak_s!r}")

    def rate_at(self, t_s: npt.ArrayLike) -> FloatArray:
        """The instantaneous rate (requests per second) at times ``t_s``."""
        t = np.asarray(t_s, dtype=np.float64)
        phase = 2.0 * np.pi * (t - self.peak_s) / self.period_s
        out: FloatArray = self.mean_rate * (1.0 + self.amplitude * np.cos(phase))
        return out

    def expected_count(self, start_s: float, end_s: float) -> float:
        """Expected number of arrivals in ``[start_s, end_s)``: the integral of the rate."""
        omega = 2.0 * math.pi / self.period_s
        swing = math.sin(omega * (end_s - self.peak_s)) - math.sin(omega * (start_s - self.peak_s))
        return self.mean_rate * ((end_s - start_s) + self.amplitude * swing / omega)

    def times(
        self,
        rng: np.random.Generator,
        *,
        num_requests: int | None = None,
        duration_s: float | None = None,
    ) -> FloatArray:
        """Sorted arrival times (s); see the module docstring for the limit semantics."""
        check_limits(num_requests, duration_s)
        return thinned_times(
            self.rate_at,
            self.mean_rate * (1.0 + self.amplitude),
            self.mean_rate,
            rng,
            num_requests,
            duration_s,
        )
