"""Token-length distributions: moments, bounds, real-trace resampling, validation."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.workload.lengths import (
    Z90,
    Clipped,
    ConstantLength,
    EmpiricalLength,
    LengthDistribution,
    LogNormalLength,
    UniformLength,
)

SEED = 7
SHAREGPT = Path("vidur/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv")


def rng(seed: int = SEED) -> np.random.Generator:
    return np.random.default_rng(seed)


# --- LogNormalLength -------------------------------------------------------------------------


@pytest.mark.parametrize(("mean", "p90"), [(500.0, 1000.0), (200.0, 250.0), (1000.0, 2200.0)])
def test_from_mean_p90_reproduces_mean_and_p90(mean: float, p90: float) -> None:
    dist = LogNormalLength.from_mean_p90(mean, p90)
    assert dist.mean == pytest.approx(mean, rel=1e-12)
    assert math.exp(dist.mu + Z90 * dist.sigma) == pytest.approx(p90, rel=1e-12)
    unclipped = LogNormalLength(mu=dist.mu, sigma=dist.sigma, min_tokens=1, max_tokens=None)
    values = unclipped.sample(rng(), 400_000)
    assert abs(values.mean() / mean - 1.0) < 0.02
    assert abs(np.quantile(values, 0.9) / p90 - 1.0) < 0.02


def test_from_mean_p90_picks_the_lighter_tailed_root() -> None:
    dist = LogNormalLength.from_mean_p90(500.0, 1000.0)
    assert 0 < dist.sigma <= Z90
    # The other root also fits both statistics but has a far heavier tail.
    d = math.log(2.0)
    other = Z90 + math.sqrt(Z90 * Z90 - 2 * d)
    assert other > dist.sigma
    assert dist.sigma == pytest.approx(Z90 - math.sqrt(Z90 * Z90 - 2 * d))


def test_from_mean_p90_edges_of_the_valid_range() -> None:
    assert LogNormalLength.from_mean_p90(300.0, 300.0).sigma == 0.0
    top = LogNormalLength.from_mean_p90(300.0, 300.0 * math.exp(Z90 * Z90 / 2) * (1 - 1e-12))
    assert top.sigma == pytest.approx(Z90, rel=1e-4)


@pytest.mark.parametrize("p90", [1200.0, 5000.0, 400.0])
def test_from_mean_p90_rejects_impossible_combinations_with_a_hint(p90: float) -> None:
    with pytest.raises(ValueError, match="p90") as error:
        LogNormalLength.from_mean_p90(500.0, p90)
    message = str(error.value)
    assert "between the mean and mean × exp(z90²/2)" in message
    assert "1136.6" in message  # the largest feasible p90 for this mean


def test_lognormal_rounds_and_clips() -> None:
    dist = LogNormalLength(mu=math.log(300.0), sigma=1.5, min_tokens=50, max_tokens=800)
    values = dist.sample(rng(), 100_000)
    assert values.dtype == np.int64
    assert values.min() == 50 and values.max() == 800  # both bounds are hit at this spread
    assert dist.mean == pytest.approx(math.exp(math.log(300.0) + 1.5**2 / 2))
    # Rounding to the nearest integer, not truncation.
    tight = LogNormalLength(mu=math.log(10.0), sigma=0.0)
    np.testing.assert_array_equal(tight.sample(rng(), 3), [10, 10, 10])


def test_lognormal_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="sigma"):
        LogNormalLength(mu=1.0, sigma=-0.1)
    with pytest.raises(ValueError, match="min_tokens"):
        LogNormalLength(mu=1.0, sigma=1.0, min_tokens=0)
    with pytest.raises(ValueError, match="max_tokens: must be >= min_tokens"):
        LogNormalLength(mu=1.0, sigma=1.0, min_tokens=10, max_tokens=5)


# --- Constant, Uniform -----------------------------------------------------------------------


def test_constant_length() -> None:
    np.testing.assert_array_equal(ConstantLength(value=128).sample(rng(), 4), [128] * 4)
    assert ConstantLength(value=128).mean == 128.0
    with pytest.raises(ValueError, match="value"):
        ConstantLength(value=0)


def test_uniform_hits_both_inclusive_bounds() -> None:
    dist = UniformLength(low=3, high=7)
    values = dist.sample(rng(), 10_000)
    assert set(np.unique(values).tolist()) == {3, 4, 5, 6, 7}
    assert dist.mean == 5.0
    assert abs(values.mean() - 5.0) < 0.05
    with pytest.raises(ValueError, match="high: must be >= low"):
        UniformLength(low=5, high=4)


# --- Empirical -------------------------------------------------------------------------------


def test_empirical_from_the_sharegpt_trace(shared_data: Path) -> None:
    path = shared_data / SHAREGPT
    dist = EmpiricalLength.from_file(path, "num_decode_tokens")
    file_mean = float(pd.read_csv(path)["num_decode_tokens"].mean())
    assert dist.mean == pytest.approx(file_mean)
    values = dist.sample(rng(), 200_000)
    assert values.dtype == np.int64
    assert abs(values.mean() / file_mean - 1.0) < 0.03
    assert set(np.unique(values).tolist()) <= set(np.asarray(dist.values).tolist())


def test_empirical_from_file_names_a_missing_or_bad_column(shared_data: Path) -> None:
    path = shared_data / SHAREGPT
    with pytest.raises(ValueError, match="num_output_tokens") as error:
        EmpiricalLength.from_file(path, "num_output_tokens")
    assert "num_decode_tokens" in str(error.value)  # the hint lists what is there
    assert path.name in str(error.value)
    # pd_ratio holds fractions, not whole token counts.
    with pytest.raises(ValueError, match="pd_ratio"):
        EmpiricalLength.from_file(path, "pd_ratio")


def test_empirical_from_file_rejects_non_numeric_and_non_positive(tmp_path: Path) -> None:
    text = tmp_path / "text.csv"
    text.write_text("tokens\n12\nmany\n")
    with pytest.raises(ValueError, match=r"'tokens'.*line 3 holds many"):
        EmpiricalLength.from_file(text, "tokens")
    zero = tmp_path / "zero.csv"
    zero.write_text("tokens\n12\n0\n")
    with pytest.raises(ValueError, match="tokens"):
        EmpiricalLength.from_file(zero, "tokens")
    with pytest.raises(ValueError, match="no such file"):
        EmpiricalLength.from_file(tmp_path / "missing.csv", "tokens")


def test_empirical_from_a_file_that_is_not_a_csv_table(tmp_path: Path) -> None:
    # Found by benchmarks/fuzz.py: pandas' own words ("No columns to parse from file", "'utf-8'
    # codec can't decode byte 0xff"), naming neither the file nor the field.
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe1\n2\n")
    for path in (empty, binary):
        with pytest.raises(ValueError, match=r"^path: '.*' is not a CSV table with a header row"):
            EmpiricalLength.from_file(path, "tokens")
    with pytest.raises(ValueError, match=r"^path: cannot read"):
        EmpiricalLength.from_file(tmp_path / ("x" * 300), "tokens")  # longer than a file name


def test_empirical_values_are_validated_and_frozen() -> None:
    dist = EmpiricalLength(values=(5, 6, 7))
    assert dist.mean == 6.0
    with pytest.raises(ValueError, match="values"):
        EmpiricalLength(values=())
    with pytest.raises(ValueError, match="values"):
        EmpiricalLength(values=(3, 0))
    with pytest.raises(ValueError, match="values"):
        EmpiricalLength(values=np.array([1.5, 2.0]))
    with pytest.raises(ValueError, match="read-only"):
        np.asarray(dist.values)[0] = 1


# --- Clipped ---------------------------------------------------------------------------------


def test_clipped_bounds_any_distribution() -> None:
    dist = Clipped(inner=UniformLength(low=1, high=100), min_tokens=20, max_tokens=60)
    values = dist.sample(rng(), 10_000)
    assert values.min() == 20 and values.max() == 60
    assert dist.mean == 50.5  # the inner mean, before clipping
    with pytest.raises(ValueError, match="max_tokens"):
        Clipped(inner=UniformLength(low=1, high=100), min_tokens=20, max_tokens=10)


def test_same_seed_same_lengths() -> None:
    dist = LogNormalLength.from_mean_p90(400.0, 800.0, max_tokens=4096)
    np.testing.assert_array_equal(dist.sample(rng(1), 1000), dist.sample(rng(1), 1000))
    assert not np.array_equal(dist.sample(rng(1), 1000), dist.sample(rng(2), 1000))


def test_negative_n_is_rejected() -> None:
    with pytest.raises(ValueError, match="n: must be an integer >= 0"):
        UniformLength(low=1, high=2).sample(rng(), -1)
    assert ConstantLength(value=3).sample(rng(), 0).shape == (0,)


# --- invariants for random valid parameters --------------------------------------------------


@st.composite
def distributions(draw: st.DrawFn) -> tuple[LengthDistribution, int, int | None]:
    """A random valid distribution with the bounds every sample must respect."""
    low = draw(st.integers(min_value=1, max_value=10_000))
    max_tokens = draw(st.none() | st.integers(min_value=low, max_value=low + 100_000))
    kind = draw(st.sampled_from(["lognormal", "uniform", "constant", "empirical"]))
    if kind == "lognormal":
        mu = draw(st.floats(min_value=-5.0, max_value=15.0))
        sigma = draw(st.floats(min_value=0.0, max_value=5.0))
        return LogNormalLength(mu, sigma, min_tokens=low, max_tokens=max_tokens), low, max_tokens
    if kind == "uniform":
        high = draw(st.integers(min_value=1, max_value=50_000))
        inner: LengthDistribution = UniformLength(low=min(high, 7), high=high)
    elif kind == "constant":
        inner = ConstantLength(value=draw(st.integers(min_value=1, max_value=50_000)))
    else:
        values = draw(st.lists(st.integers(min_value=1, max_value=50_000), min_size=1))
        inner = EmpiricalLength(values=values)
    return Clipped(inner=inner, min_tokens=low, max_tokens=max_tokens), low, max_tokens


@settings(max_examples=200, deadline=None)
@given(case=distributions(), n=st.integers(min_value=0, max_value=500), seed=st.integers(0, 2**32))
def test_samples_are_int64_of_length_n_within_bounds(
    case: tuple[LengthDistribution, int, int | None], n: int, seed: int
) -> None:
    dist, low, high = case
    values = dist.sample(np.random.default_rng(seed), n)
    assert values.dtype == np.int64
    assert values.shape == (n,)
    assert np.all(values >= low)
    if high is not None:
        assert np.all(values <= high)
    assert math.isfinite(dist.mean) and dist.mean > 0
