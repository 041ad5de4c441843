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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

#: Upper bound on one batch of random draws, so a huge horizon does not allocate one giant
#: overshooting batch; the loops simply take more batches.
_MAX_BATCH = 1 << 22
#: Lower bound on one batch, so short tails do not degenerate into many tiny numpy calls.
_MIN_BATCH = 64


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
# Validation helpers


def _require_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")


def _require_non_negative(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")


def _check_limits(num_requests: int | None, duration_s: float | None) -> None:
    if num_requests is None and duration_s is None:
        raise ValueError(
            "num_requests/duration_s: give at least one limit (a request count, a time horizon "
            "in seconds, or both)"
        )
    if num_requests is not None:
        if isinstance(num_requests, bool) or not isinstance(num_requests, int | np.integer):
            raise ValueError(f"num_requests: must be an integer >= 0, got {num_requests!r}")
        if num_requests < 0:
            raise ValueError(f"num_requests: must be >= 0, got {num_requests}")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s >= 0):
        raise ValueError(f"duration_s: must be a finite number >= 0, got {duration_s!r}")


# ---------------------------------------------------------------------------------------------
# Batched samplers shared by the processes


def _batch_size(expected: float, remaining: int | None) -> int:
    """Draws for the next batch: the expected need plus slack, capped by what is still wanted."""
    if math.isfinite(expected):
        size = int(expected * 1.05 + 4.0 * math.sqrt(max(expected, 0.0))) + _MIN_BATCH
    else:
        size = _MAX_BATCH
    size = min(size, _MAX_BATCH)
    if remaining is not None:
        size = min(size, remaining)
    return max(size, 1)


def _renewal_times(
    draw_gaps: Callable[[int], FloatArray],
    mean_gap: float,
    num_requests: int | None,
    bound: float | None,
) -> FloatArray:
    """Partial sums of i.i.d. gaps, up to ``num_requests`` of them and/or below ``bound``.

    Gaps are drawn in batches sized from the expected remaining count, so the loop runs once or
    a few times however many arrivals there are.
    """
    if num_requests == 0:
        return np.empty(0, dtype=np.float64)
    pieces: list[FloatArray] = []
    count = 0
    last = 0.0
    while True:
        remaining = None if num_requests is None else num_requests - count
        expected = math.inf if bound is None else (bound - last) / mean_gap
        if remaining is not None:
            expected = min(expected, float(remaining))
        size = _batch_size(expected, remaining)
        batch = last + np.cumsum(draw_gaps(size))
        if bound is not None:
            inside = int(np.searchsorted(batch, bound, side="left"))  # keeps t < bound
            if inside < size:
                pieces.append(batch[:inside])
                break
        pieces.append(batch)
        count += size
        last = float(batch[-1])
        if num_requests is not None and count >= num_requests:
            break
    return np.concatenate(pieces)


def _thinned_times(
    rate_at: Callable[[FloatArray], FloatArray],
    max_rate: float,
    mean_rate: float,
    rng: np.random.Generator,
    num_requests: int | None,
    duration_s: float | None,
) -> FloatArray:
    """Lewis–Shedler thinning: candidates at ``max_rate``, each kept with prob. rate/max_rate.

    Exact for any rate function bounded by ``max_rate``; candidates come in numpy batches.
    """
    if num_requests == 0:
        return np.empty(0, dtype=np.float64)
    pieces: list[FloatArray] = []
    count = 0
    last = 0.0
    acceptance = mean_rate / max_rate
    while True:
        remaining = None if num_requests is None else num_requests - count
        expected = math.inf if duration_s is None else (duration_s - last) * max_rate
        if remaining is not None:
            expected = min(expected, remaining / acceptance)
        size = _batch_size(expected, None)
        candidates = last + np.cumsum(rng.exponential(1.0 / max_rate, size))
        keep = rng.random(size) * max_rate < rate_at(candidates)
        reached_end = False
        if duration_s is not None and candidates[-1] >= duration_s:
            keep &= candidates < duration_s
            reached_end = True
        accepted = candidates[keep]
        if remaining is not None and accepted.size >= remaining:
            pieces.append(accepted[:remaining])
            break
        pieces.append(accepted)
        count += accepted.size
        last = float(candidates[-1])
        if reached_end:
            break
    return np.concatenate(pieces)


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
        _require_positive("rate", self.rate)

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
        _check_limits(num_requests, duration_s)
        scale = 1.0 / self.rate
        return _renewal_times(
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
        _require_positive("rate", self.rate)
        _require_positive("cv", self.cv)

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
        _check_limits(num_requests, duration_s)
        shape, scale = self.shape, self.scale_s
        return _renewal_times(
            lambda size: rng.gamma(shape, scale, size), 1.0 / self.rate, num_requests, duration_s
        )


@dataclass(frozen=True)
class Constant:
    """Deterministic arrivals every ``1 / rate`` seconds: the k-th arrival is at ``k / rate``.

    The generator is accepted for interface compatibility and never used.
    """

    rate: float

    def __post_init__(self) -> None:
        _require_positive("rate", self.rate)

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
        _check_limits(num_requests, duration_s)
        count = math.inf if num_requests is None else num_requests
        if duration_s is not None:
            # k / rate < duration_s  <=>  k < duration_s * rate; fix up float rounding below.
            count = min(count, math.ceil(duration_s * self.rate))
        times = np.arange(1, int(count) + 1, dtype=np.float64) / self.rate
        if duration_s is not None:
            times = times[times < duration_s]
        return times


# ---------------------------------------------------------------------------------------------
# Non-homogeneous Poisson processes


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
            _require_positive("period_s", self.period_s)
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
        _check_limits(num_requests, duration_s)
        table = self._table
        bound = math.inf
        if duration_s is not None:
            bound = float(table.integral(np.array([duration_s], dtype=np.float64))[0])
        if self.period_s is None and self.points[-1][1] == 0:
            bound = min(bound, table.period_integral)  # no arrivals once the rate stays 0
        levels = _renewal_times(
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
        _require_positive("on_rate", self.on_rate)
        _require_positive("on_s", self.on_s)
        _require_positive("off_s", self.off_s)
        _require_non_negative("off_rate", self.off_rate)
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
        _require_positive("mean_rate", self.mean_rate)
        if not (math.isfinite(self.amplitude) and 0.0 <= self.amplitude <= 1.0):
            raise ValueError(
                f"amplitude: must be between 0 and 1 (relative swing around mean_rate), "
                f"got {self.amplitude!r}"
            )
        _require_positive("period_s", self.period_s)
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
        _check_limits(num_requests, duration_s)
        return _thinned_times(
            self.rate_at,
            self.mean_rate * (1.0 + self.amplitude),
            self.mean_rate,
            rng,
            num_requests,
            duration_s,
        )


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
        _require_positive("time_scale", self.time_scale)
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
        _check_limits(num_requests, duration_s)
        times = np.asarray(self.times_s, dtype=np.float64) * self.time_scale
        if num_requests is not None:
            times = times[:num_requests]
        if duration_s is not None:
            times = times[: int(np.searchsorted(times, duration_s, side="left"))]
        return times
