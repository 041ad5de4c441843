"""What every arrival process shares: argument checks and exact, batched samplers.

:func:`renewal_times` sums i.i.d. gaps (Poisson, gamma, and unit-rate points that a
time-varying process maps through its integrated rate); :func:`thinned_times` is Lewis–Shedler
thinning for a bounded rate function. Both draw in numpy batches sized from the expected
remaining count, so a run takes a few numpy calls however many arrivals it has. The processes
themselves are in :mod:`sim.workload.arrivals` and :mod:`sim.workload.varying_arrivals`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

#: Upper bound on one batch of random draws, so a huge horizon does not allocate one giant
#: overshooting batch; the loops simply take more batches.
_MAX_BATCH = 1 << 22
#: Lower bound on one batch, so short tails do not degenerate into many tiny numpy calls.
_MIN_BATCH = 64


# ---------------------------------------------------------------------------------------------
# Validation helpers


def require_positive(name: str, value: float) -> None:
    """Refuse a parameter ``name`` that is not a finite number > 0."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")


def require_non_negative(name: str, value: float) -> None:
    """Refuse a parameter ``name`` that is not a finite number >= 0."""
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")


def check_limits(num_requests: int | None, duration_s: float | None) -> None:
    """Refuse ``times`` limits that are both absent, or not a count >= 0 and a time >= 0."""
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


def renewal_times(
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


def thinned_times(
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
