"""Arrival processes: exact limit semantics, statistical agreement with theory, validation."""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest
from scipy import stats

from sim.workload.arrivals import (
    ArrivalProcess,
    Constant,
    Diurnal,
    GammaArrivals,
    OnOff,
    PiecewiseRate,
    Poisson,
    Replay,
)

SEED = 20240601


def rng(seed: int = SEED) -> np.random.Generator:
    return np.random.default_rng(seed)


def all_processes() -> list[ArrivalProcess]:
    return [
        Poisson(rate=5.0),
        GammaArrivals(rate=5.0, cv=2.0),
        Constant(rate=5.0),
        OnOff(on_rate=10.0, on_s=2.0, off_s=3.0),
        PiecewiseRate(points=((0.0, 1.0), (10.0, 8.0)), interpolation="linear", period_s=30.0),
        Diurnal(mean_rate=5.0, amplitude=0.7, period_s=40.0, peak_s=5.0),
        Replay(times_s=tuple(np.arange(1, 2001) * 0.2)),
    ]


def within_sigmas(observed: int, expected: float, num_sigmas: float = 4.0) -> bool:
    """Poisson count check: |observed − expected| ≤ num_sigmas · sqrt(expected)."""
    return abs(observed - expected) <= num_sigmas * math.sqrt(expected)


# --- limit semantics, shared by every process ------------------------------------------------


@pytest.mark.parametrize("process", all_processes(), ids=lambda p: type(p).__name__)
def test_limits_and_ordering(process: ArrivalProcess) -> None:
    by_count = process.times(rng(), num_requests=300)
    assert by_count.dtype == np.float64
    assert by_count.size == 300
    assert np.all(np.diff(by_count) >= 0)
    assert by_count[0] > 0

    by_time = process.times(rng(), duration_s=50.0)
    assert by_time.size > 0
    assert np.all(np.diff(by_time) >= 0)
    assert by_time[-1] < 50.0

    # Both limits: whichever comes first. A short horizon binds before a large count...
    short = process.times(rng(), num_requests=10_000, duration_s=20.0)
    assert short.size < 10_000 and short[-1] < 20.0
    # ...and a small count binds before a long horizon.
    few = process.times(rng(), num_requests=7, duration_s=1e6)
    assert few.size == 7

    assert process.times(rng(), num_requests=0).size == 0
    assert process.times(rng(), duration_s=0.0).size == 0


@pytest.mark.parametrize("process", all_processes(), ids=lambda p: type(p).__name__)
def test_limits_are_required_and_validated(process: ArrivalProcess) -> None:
    with pytest.raises(ValueError, match="num_requests/duration_s"):
        process.times(rng())
    with pytest.raises(ValueError, match="num_requests"):
        process.times(rng(), num_requests=-1)
    with pytest.raises(ValueError, match="duration_s"):
        process.times(rng(), duration_s=-1.0)


@pytest.mark.parametrize("process", all_processes()[:-1], ids=lambda p: type(p).__name__)
def test_same_seed_same_arrivals_different_seed_different(process: ArrivalProcess) -> None:
    first = process.times(rng(1), num_requests=500)
    again = process.times(rng(1), num_requests=500)
    np.testing.assert_array_equal(first, again)
    if not isinstance(process, Constant):
        other = process.times(rng(2), num_requests=500)
        assert not np.array_equal(first, other)


@pytest.mark.parametrize("process", all_processes()[:-1], ids=lambda p: type(p).__name__)
def test_long_run_count_matches_mean_rate(process: ArrivalProcess) -> None:
    horizon_s = 6000.0  # a whole number of periods for the periodic processes
    count = process.times(rng(), duration_s=horizon_s).size
    expected = process.mean_rate * horizon_s
    # Gamma with cv = 2 has count variance ≈ cv² · mean; allow 4 sigmas of that everywhere.
    assert abs(count - expected) <= 4 * 2.0 * math.sqrt(expected)


# --- Poisson ---------------------------------------------------------------------------------


def test_poisson_gaps_are_exact_exponentials() -> None:
    rate = 3.0
    times = Poisson(rate=rate).times(rng(), num_requests=200_000)
    gaps = np.diff(np.concatenate(([0.0], times)))
    result = stats.kstest(gaps, stats.expon(scale=1.0 / rate).cdf)
    assert result.pvalue > 0.01
    assert abs(gaps.mean() * rate - 1.0) < 0.01
    # No clamping: about 20 of 200k gaps fall below 1e-4 mean gaps; a clamp would leave none.
    assert gaps.min() < 1e-4 / rate
    assert np.sum(gaps < 1e-4 / rate) >= 5
    # No rounding to a time grid (e.g. whole milliseconds).
    assert np.mean(np.isclose(gaps * 1000, np.round(gaps * 1000), rtol=0, atol=1e-9)) < 0.01


def test_poisson_duration_and_count_agree_on_a_prefix() -> None:
    process = Poisson(rate=50.0)
    by_time = process.times(rng(), duration_s=100.0)
    by_count = process.times(rng(), num_requests=by_time.size)
    np.testing.assert_allclose(by_time, by_count, rtol=1e-12)


def test_poisson_rejects_bad_rate() -> None:
    with pytest.raises(ValueError, match=r"rate: must be a finite number > 0, got -3"):
        Poisson(rate=-3)
    with pytest.raises(ValueError, match="rate"):
        Poisson(rate=math.inf)


# --- Gamma -----------------------------------------------------------------------------------


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_gaps_have_requested_cv_and_rate(cv: float) -> None:
    rate = 8.0
    times = GammaArrivals(rate=rate, cv=cv).times(rng(), num_requests=1_000_000)
    gaps = np.diff(np.concatenate(([0.0], times)))
    assert abs(gaps.std() / gaps.mean() / cv - 1.0) < 0.03
    assert abs(times.size / times[-1] / rate - 1.0) < 0.02


def test_gamma_with_cv_one_is_exponential() -> None:
    times = GammaArrivals(rate=2.0, cv=1.0).times(rng(), num_requests=100_000)
    gaps = np.diff(np.concatenate(([0.0], times)))
    assert stats.kstest(gaps, stats.expon(scale=0.5).cdf).pvalue > 0.01


def test_gamma_rejects_bad_cv() -> None:
    with pytest.raises(ValueError, match="cv: must be"):
        GammaArrivals(rate=1.0, cv=0.0)


# --- Constant --------------------------------------------------------------------------------


def test_constant_is_exact() -> None:
    process = Constant(rate=4.0)
    np.testing.assert_array_equal(
        process.times(rng(), num_requests=5), [0.25, 0.5, 0.75, 1.0, 1.25]
    )
    # duration_s is exclusive: the arrival at exactly 1.0 is not included.
    np.testing.assert_array_equal(process.times(rng(), duration_s=1.0), [0.25, 0.5, 0.75])
    np.testing.assert_array_equal(process.times(rng(), num_requests=2, duration_s=1.0), [0.25, 0.5])
    np.testing.assert_array_equal(
        process.times(rng(), num_requests=10, duration_s=0.6), [0.25, 0.5]
    )
    assert process.times(rng(), duration_s=1.0001).size == 4
    assert process.mean_rate == 4.0


# --- OnOff -----------------------------------------------------------------------------------


def test_on_off_has_no_arrivals_while_off_and_the_right_mean_rate() -> None:
    process = OnOff(on_rate=10.0, on_s=5.0, off_s=15.0)
    assert process.mean_rate == pytest.approx(2.5)
    times = process.times(rng(), duration_s=20_000.0)
    phase = np.mod(times, 20.0)
    assert np.all(phase < 5.0)
    assert abs(times.size / 20_000.0 / 2.5 - 1.0) < 0.03


def test_on_off_with_off_rate_mixes_both() -> None:
    process = OnOff(on_rate=10.0, on_s=5.0, off_s=15.0, off_rate=2.0)
    times = process.times(rng(), duration_s=20_000.0)
    off = np.mod(times, 20.0) >= 5.0
    assert within_sigmas(int(off.sum()), 2.0 * 15.0 * 1000)
    assert within_sigmas(int((~off).sum()), 10.0 * 5.0 * 1000)


def test_on_off_rejects_bad_periods() -> None:
    with pytest.raises(ValueError, match="off_s"):
        OnOff(on_rate=1.0, on_s=1.0, off_s=0.0)
    with pytest.raises(ValueError, match="off_rate"):
        OnOff(on_rate=1.0, on_s=1.0, off_s=1.0, off_rate=-1.0)


# --- PiecewiseRate ---------------------------------------------------------------------------


def test_piecewise_step_counts_match_the_integral_per_piece() -> None:
    process = PiecewiseRate(points=((0.0, 5.0), (1000.0, 20.0), (2000.0, 0.0), (2500.0, 1.0)))
    times = process.times(rng(), duration_s=4000.0)
    edges = [0.0, 1000.0, 2000.0, 2500.0, 4000.0]
    counts, _ = np.histogram(times, bins=edges)
    expected = [5000.0, 20_000.0, 0.0, 1500.0]
    for observed, want in zip(counts, expected, strict=True):
        if want == 0:
            assert observed == 0
        else:
            assert within_sigmas(int(observed), want)
    assert process.mean_rate == 1.0  # the rate held after the last point
    assert process.expected_count(0.0, 4000.0) == pytest.approx(sum(expected))


def test_piecewise_linear_ramp_follows_the_integral_and_rescales_to_unit_poisson() -> None:
    process = PiecewiseRate(points=((0.0, 0.0), (1000.0, 40.0)), interpolation="linear")
    times = process.times(rng(), duration_s=1000.0)
    edges = np.linspace(0.0, 1000.0, 11)
    counts, _ = np.histogram(times, bins=edges)
    for (start, end), observed in zip(pairwise(edges), counts, strict=True):
        want = 0.02 * (end**2 - start**2)  # ∫ 0.04 t dt
        assert process.expected_count(start, end) == pytest.approx(want)
        assert within_sigmas(int(observed), want)
    # Time-rescaling theorem: Λ(t_k) − Λ(t_{k−1}) are i.i.d. unit exponentials.
    levels = 0.02 * times**2
    rescaled = np.diff(np.concatenate(([0.0], levels)))
    assert stats.kstest(rescaled, stats.expon().cdf).pvalue > 0.01


def test_piecewise_constant_equals_poisson_in_distribution() -> None:
    times = PiecewiseRate(points=((0.0, 3.0),)).times(rng(), num_requests=50_000)
    gaps = np.diff(np.concatenate(([0.0], times)))
    assert stats.kstest(gaps, stats.expon(scale=1 / 3.0).cdf).pvalue > 0.01


def test_piecewise_periodic_repeats() -> None:
    process = PiecewiseRate(points=((0.0, 10.0), (50.0, 0.0)), period_s=100.0)
    assert process.mean_rate == pytest.approx(5.0)
    times = process.times(rng(), duration_s=100_000.0)
    phase = np.mod(times, 100.0)
    assert np.all(phase < 50.0)
    per_period = np.bincount((times // 100.0).astype(np.int64), minlength=1000)
    assert per_period.size == 1000
    assert within_sigmas(int(per_period[:500].sum()), 250_000.0)
    assert within_sigmas(int(per_period[500:].sum()), 250_000.0)


def test_piecewise_periodic_linear_wraps_back_to_the_first_rate() -> None:
    process = PiecewiseRate(
        points=((0.0, 0.0), (50.0, 20.0)), interpolation="linear", period_s=100.0
    )
    np.testing.assert_allclose(
        process.rate_at([0.0, 25.0, 50.0, 75.0, 100.0, 125.0]), [0.0, 10.0, 20.0, 10.0, 0.0, 10.0]
    )
    assert process.mean_rate == pytest.approx(10.0)
    times = process.times(rng(), duration_s=50_000.0)
    counts, _ = np.histogram(np.mod(times, 100.0), bins=[0.0, 25.0, 50.0, 75.0, 100.0])
    expected = [500 * 125.0, 500 * 375.0, 500 * 375.0, 500 * 125.0]
    for observed, want in zip(counts, expected, strict=True):
        assert within_sigmas(int(observed), want)


def test_piecewise_that_ends_at_zero_runs_out() -> None:
    process = PiecewiseRate(points=((0.0, 100.0), (10.0, 0.0)))
    times = process.times(rng(), num_requests=5000)
    assert times.size < 5000
    assert within_sigmas(times.size, 1000.0)
    assert times[-1] < 10.0


@pytest.mark.parametrize(
    ("points", "fragment"),
    [
        ((), "at least one"),
        (((1.0, 2.0),), "first point's time must be 0"),
        (((0.0, 1.0), (5.0, 2.0), (5.0, 3.0)), "strictly increasing"),
        (((0.0, 1.0), (5.0, -2.0)), ">= 0"),
        (((0.0, 0.0), (5.0, 0.0)), "at least one rate"),
        (((0.0, "fast"),), "pairs"),
    ],
)
def test_piecewise_rejects_bad_points(
    points: tuple[tuple[float, float], ...], fragment: str
) -> None:
    with pytest.raises(ValueError, match="points") as error:
        PiecewiseRate(points=points)
    assert fragment in str(error.value)


def test_piecewise_rejects_short_period_and_unknown_interpolation() -> None:
    with pytest.raises(ValueError, match="period_s"):
        PiecewiseRate(points=((0.0, 1.0), (10.0, 2.0)), period_s=10.0)
    with pytest.raises(ValueError, match="interpolation"):
        PiecewiseRate(points=((0.0, 1.0),), interpolation="cubic")  # type: ignore[arg-type]


# --- Diurnal ---------------------------------------------------------------------------------


def test_diurnal_peak_and_trough_quarters() -> None:
    period_s, num_periods, peak_s = 1000.0, 20, 300.0
    process = Diurnal(mean_rate=20.0, amplitude=0.8, period_s=period_s, peak_s=peak_s)
    times = process.times(rng(), duration_s=num_periods * period_s)
    # The peak quarter of each period is within P/8 of peak_s, the trough quarter 3P/8..5P/8
    # after it; every one of the num_periods periods holds one of each inside the horizon.
    phase = np.mod(times - peak_s + period_s / 8, period_s)
    peak = int(np.sum(phase < period_s / 4))
    trough = int(np.sum((phase >= period_s / 2) & (phase < 3 * period_s / 4)))
    peak_one = process.expected_count(peak_s - period_s / 8, peak_s + period_s / 8)
    trough_one = process.expected_count(peak_s + 3 * period_s / 8, peak_s + 5 * period_s / 8)
    # ∫ over a quarter = m·(P/4 ± a·P·sin(π/4)/π).
    swing = 20.0 * 0.8 * period_s * math.sin(math.pi / 4) / math.pi
    assert peak_one == pytest.approx(20.0 * period_s / 4 + swing)
    assert trough_one == pytest.approx(20.0 * period_s / 4 - swing)
    assert trough < peak
    assert within_sigmas(peak, num_periods * peak_one)
    assert within_sigmas(trough, num_periods * trough_one)
    assert within_sigmas(times.size, process.expected_count(0.0, num_periods * period_s))


def test_diurnal_full_amplitude_rate_reaches_zero() -> None:
    process = Diurnal(mean_rate=1.0, amplitude=1.0, period_s=10.0)
    np.testing.assert_allclose(process.rate_at([0.0, 5.0]), [2.0, 0.0], atol=1e-12)


def test_diurnal_rejects_bad_amplitude() -> None:
    with pytest.raises(ValueError, match="amplitude: must be between 0 and 1"):
        Diurnal(mean_rate=1.0, amplitude=1.5)


# --- Replay ----------------------------------------------------------------------------------


def test_replay_scales_and_truncates() -> None:
    trace = np.array([0.0, 1.0, 2.0, 4.0, 8.0])
    normal = Replay(times_s=trace)
    fast = Replay(times_s=tuple(trace.tolist()), time_scale=0.5)
    np.testing.assert_array_equal(normal.times(rng(), num_requests=10), trace)
    np.testing.assert_array_equal(fast.times(rng(), num_requests=10), trace * 0.5)
    np.testing.assert_array_equal(fast.times(rng(), duration_s=2.0), [0.0, 0.5, 1.0])
    np.testing.assert_array_equal(fast.times(rng(), num_requests=2, duration_s=2.0), [0.0, 0.5])
    assert normal.mean_rate == pytest.approx(5 / 8)
    assert fast.mean_rate == pytest.approx(5 / 4)


def test_replay_keeps_its_own_copy() -> None:
    trace = np.array([1.0, 2.0, 3.0])
    replay = Replay(times_s=trace)
    trace[0] = 99.0
    assert replay.times(rng(), num_requests=1)[0] == 1.0


@pytest.mark.parametrize(
    ("trace", "fragment"),
    [([], "non-empty"), ([2.0, 1.0], "sort"), ([-1.0, 1.0], ">= 0"), ([0.0], "after t = 0")],
)
def test_replay_rejects_bad_traces(trace: list[float], fragment: str) -> None:
    with pytest.raises(ValueError, match="times_s") as error:
        Replay(times_s=trace)
    assert fragment in str(error.value)
