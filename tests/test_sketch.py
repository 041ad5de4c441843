"""Distributions gathered in chunks (sim/report/sketch.py): exact while small, a t-digest with
a bounded rank error past that, and the summary built on them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.report.sketch import RANK_ERROR, Values
from sim.report.summary import distribution, summary_of


def rank_of(sorted_values: np.ndarray, value: float) -> float:
    """Where ``value`` falls among ``sorted_values``, as a fraction (the middle of ties)."""
    low = np.searchsorted(sorted_values, value, side="left")
    high = np.searchsorted(sorted_values, value, side="right")
    return float((low + high) / 2 / sorted_values.size)


def test_exact_values_give_numpys_percentiles_whatever_the_chunks() -> None:
    rng = np.random.default_rng(0)
    values = rng.lognormal(0, 1, 10_001)
    gathered = Values(exact_limit=None)
    for chunk in np.array_split(values, 7):
        gathered.add(chunk)
    assert gathered.exact and gathered.count == values.size
    assert summary_of(gathered, (50, 90, 99.9)) == distribution(values, percentiles=(50, 90, 99.9))


def test_non_finite_values_and_empty_counts_are_left_out() -> None:
    gathered = Values(exact_limit=None)
    gathered.add(np.array([1.0, math.nan, 3.0, math.inf]), np.array([2, 5, 0, 1]))
    assert gathered.count == 2
    values, counts = gathered.held()
    assert values.tolist() == [1.0] and counts is not None and counts.tolist() == [2]
    assert Values(exact_limit=None).mean() != Values(exact_limit=None).mean()  # NaN: no value


@pytest.mark.parametrize("weighted", [False, True])
def test_past_its_limit_a_distribution_is_a_t_digest_within_the_stated_rank_error(
    weighted: bool,
) -> None:
    rng = np.random.default_rng(1)
    values = rng.lognormal(-3, 1.2, 400_000)  # latency-like: heavy right tail
    counts = rng.integers(1, 20, values.size) if weighted else None
    gathered = Values(exact_limit=50_000)
    for i in range(0, values.size, 30_000):
        gathered.add(values[i : i + 30_000], None if counts is None else counts[i : i + 30_000])
    assert not gathered.exact
    expanded = np.sort(values if counts is None else np.repeat(values, counts))
    assert gathered.count == expanded.size
    assert gathered.mean() == pytest.approx(expanded.mean(), rel=1e-9)  # the mean stays exact
    fractions = [0.5, 0.9, 0.95, 0.99, 0.999]
    for fraction, value in zip(fractions, gathered.quantiles(fractions), strict=True):
        assert abs(rank_of(expanded, value) - fraction) <= RANK_ERROR, fraction
    # The k-th smallest value (the SLO's percentile over every request) within the same error.
    rank = int(0.9 * (expanded.size - 1))
    assert abs(rank_of(expanded, gathered.ranked(rank)) - 0.9) <= RANK_ERROR


def test_a_sketched_summary_has_the_keys_of_an_exact_one() -> None:
    rng = np.random.default_rng(2)
    values = rng.exponential(1.0, 5_000)
    sketched = Values(exact_limit=100)
    sketched.add(values)
    exact = distribution(values, percentiles=(50, 99))
    approximate = summary_of(sketched, (50, 99))
    assert set(approximate) == set(exact)
    for key, value in exact.items():
        assert approximate[key] == pytest.approx(value, rel=0.05), key
