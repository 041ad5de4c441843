"""Token-length distributions for prompts and outputs.

Every distribution is a frozen value object whose ``sample(rng, n)`` returns an int64 array of
``n`` token counts, each ``>= 1``, drawn from the ``numpy.random.Generator`` it is handed (never
a global RNG). ``mean`` is the mean of the underlying distribution *before* rounding to whole
tokens and clipping, which is what a workload was specified with and what sanity checks against
theory use; for narrow clipping windows the sample mean can differ from it.

Clipping: :class:`LogNormalLength` carries its own ``min_tokens``/``max_tokens`` because a
continuous distribution has to be rounded and bounded anyway; any other distribution is bounded
by wrapping it in :class:`Clipped`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt
import pandas as pd
from scipy.stats import norm

IntArray = npt.NDArray[np.int64]

#: The 90th-percentile z-score of the standard normal, used by ``LogNormalLength.from_mean_p90``.
Z90: float = float(norm.ppf(0.9))

#: Without a ``max_tokens`` bound, rounded samples are capped here so they convert to int64
#: exactly (any real token count is many orders of magnitude below this).
_UNBOUNDED_MAX_TOKENS = 2**53


class LengthDistribution(Protocol):
    """A distribution of token counts (integers >= 1)."""

    @property
    def mean(self) -> float:
        """Mean before rounding and clipping."""
        ...

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        """``n`` int64 token counts, each >= 1."""
        ...


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n: must be an integer >= 0 (how many lengths to draw), got {n!r}")


def _check_bounds(min_tokens: int, max_tokens: int | None) -> None:
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int | np.integer):
        raise ValueError(f"min_tokens: must be an integer >= 1, got {min_tokens!r}")
    if min_tokens < 1:
        raise ValueError(f"min_tokens: must be >= 1 (every request has a token), got {min_tokens}")
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int | np.integer):
            raise ValueError(f"max_tokens: must be an integer or None, got {max_tokens!r}")
        if max_tokens < min_tokens:
            raise ValueError(
                f"max_tokens: must be >= min_tokens ({min_tokens}), got {max_tokens}; "
                "raise it or use None for no upper bound"
            )


def _round_and_clip(
    values: npt.NDArray[np.float64], min_tokens: int, max_tokens: int | None
) -> IntArray:
    upper = _UNBOUNDED_MAX_TOKENS if max_tokens is None else max_tokens
    return np.clip(np.rint(values), min_tokens, upper).astype(np.int64)


@dataclass(frozen=True)
class ConstantLength:
    """Every request has exactly ``value`` tokens (``value >= 1``)."""

    value: int

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, int | np.integer):
            raise ValueError(f"value: must be an integer >= 1, got {self.value!r}")
        if self.value < 1:
            raise ValueError(f"value: must be >= 1 token, got {self.value}")

    @property
    def mean(self) -> float:
        """``value``."""
        return float(self.value)

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        """``n`` copies of ``value``; the generator is not used."""
        _check_n(n)
        return np.full(n, self.value, dtype=np.int64)


@dataclass(frozen=True)
class UniformLength:
    """Token counts uniform over the integers ``low..high``, both ends included."""

    low: int
    high: int

    def __post_init__(self) -> None:
        for name, value in (("low", self.low), ("high", self.high)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        if self.low < 1:
            raise ValueError(f"low: must be >= 1 token, got {self.low}")
        if self.high < self.low:
            raise ValueError(f"high: must be >= low ({self.low}), got {self.high}")

    @property
    def mean(self) -> float:
        """``(low + high) / 2``."""
        return (self.low + self.high) / 2.0

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        """``n`` integers drawn uniformly from ``low..high`` inclusive."""
        _check_n(n)
        return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)


@dataclass(frozen=True)
class LogNormalLength:
    """Log-normal token counts: ``exp(N(mu, sigma^2))`` rounded to the nearest integer, then
    clipped to ``[min_tokens, max_tokens]`` (no upper bound when ``max_tokens`` is None).

    ``mean`` is ``exp(mu + sigma^2 / 2)``, the mean before rounding and clipping. Use
    :meth:`from_mean_p90` to specify the distribution by the statistics traces report.
    """

    mu: float
    sigma: float
    min_tokens: int = 1
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not math.isfinite(self.mu):
            raise ValueError(f"mu: must be a finite number (log-tokens), got {self.mu!r}")
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise ValueError(f"sigma: must be a finite number >= 0, got {self.sigma!r}")
        _check_bounds(self.min_tokens, self.max_tokens)

    @classmethod
    def from_mean_p90(
        cls,
        mean: float,
        p90: float,
        min_tokens: int = 1,
        max_tokens: int | None = None,
    ) -> LogNormalLength:
        """The log-normal with this (unclipped) mean and 90th percentile.

        Solves ``ln(mean) = mu + sigma^2/2`` and ``ln(p90) = mu + z90*sigma`` with
        ``z90 = Φ⁻¹(0.9)``. With ``d = ln(p90 / mean)`` this is ``sigma^2/2 − z90*sigma + d = 0``,
        which has a non-negative root exactly when ``0 <= d <= z90^2/2``, i.e. when
        ``mean <= p90 <= mean * exp(z90^2/2)`` (about 2.27 × mean). Of the two roots the
        smaller, lighter-tailed ``sigma = z90 − sqrt(z90^2 − 2d)`` is chosen.
        """
        if not (math.isfinite(mean) and mean > 0):
            raise ValueError(f"mean: must be a finite number > 0 tokens, got {mean!r}")
        if not (math.isfinite(p90) and p90 > 0):
            raise ValueError(f"p90: must be a finite number > 0 tokens, got {p90!r}")
        d = math.log(p90 / mean)
        upper = mean * math.exp(Z90 * Z90 / 2.0)
        if d < 0 or d > Z90 * Z90 / 2.0:
            raise ValueError(
                f"p90: no log-normal has mean {mean!r} and p90 {p90!r}; p90 must lie between the "
                f"mean and mean × exp(z90²/2) ≈ {upper:.6g} (about 2.27 × mean). For a heavier "
                "tail use an EmpiricalLength or specify mu and sigma directly"
            )
        root = math.sqrt(max(Z90 * Z90 - 2.0 * d, 0.0))
        sigma = 2.0 * d / (Z90 + root)  # = z90 - root, without cancellation for small d
        mu = math.log(mean) - sigma * sigma / 2.0
        return cls(mu=mu, sigma=sigma, min_tokens=min_tokens, max_tokens=max_tokens)

    @property
    def mean(self) -> float:
        """``exp(mu + sigma^2/2)``: the mean before rounding and clipping."""
        return math.exp(self.mu + self.sigma * self.sigma / 2.0)

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        """``n`` log-normal draws, rounded to the nearest integer and clipped to the bounds."""
        _check_n(n)
        return _round_and_clip(
            rng.lognormal(self.mu, self.sigma, n), self.min_tokens, self.max_tokens
        )


@dataclass(frozen=True, eq=False)
class EmpiricalLength:
    """Resamples observed token counts with replacement (each observation equally likely).

    ``values`` may be any 1-D sequence of whole numbers >= 1; it is stored as a read-only int64
    array, so instances compare and hash by identity. ``mean`` is the mean of ``values``.
    """

    values: IntArray | Sequence[int]

    def __post_init__(self) -> None:
        try:
            raw = np.asarray(self.values)
            as_float = raw.astype(np.float64)
        except (TypeError, ValueError) as error:
            raise ValueError("values: must be a 1-D sequence of whole token counts") from error
        if as_float.ndim != 1 or as_float.size == 0:
            raise ValueError(
                f"values: must be a non-empty 1-D sequence of token counts, got shape {raw.shape}"
            )
        bad = ~np.isfinite(as_float) | (as_float < 1) | (as_float != np.round(as_float))
        if np.any(bad):
            index = int(np.argmax(bad))
            raise ValueError(
                f"values: every value must be a whole number >= 1, got {raw[index]!r} at "
                f"index {index}"
            )
        values = as_float.astype(np.int64)
        values.flags.writeable = False
        object.__setattr__(self, "values", values)

    @classmethod
    def from_file(cls, path: str | Path, column: str) -> EmpiricalLength:
        """Token counts from one column of a CSV file (e.g. a processed ShareGPT trace)."""
        path = Path(path)
        try:
            found = path.is_file()
        except OSError as exc:  # a name longer than the file system takes, say
            raise ValueError(f"path: cannot read {str(path)!r}: {exc.strerror or exc}") from None
        if not found:
            raise ValueError(f"path: no such file {str(path)!r}; check the data folder")
        try:
            frame = pd.read_csv(path)
        except (OSError, ValueError) as exc:  # pandas' parse errors and bad UTF-8 are ValueErrors
            problem = " ".join(str(exc).split())
            raise ValueError(
                f"path: {str(path)!r} is not a CSV table with a header row ({problem}); give a "
                "UTF-8 CSV file with a column of token counts"
            ) from None
        if column not in frame.columns:
            raise ValueError(
                f"column: {column!r} is not in {str(path)!r}; available columns: "
                f"{', '.join(map(str, frame.columns))}"
            )
        numbers = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(numbers) | (numbers < 1) | (numbers != np.round(numbers))
        if numbers.size == 0 or np.any(bad):
            detail = "it is empty"
            if numbers.size:
                row = int(np.argmax(bad))
                detail = f"line {row + 2} holds {frame[column].iloc[row]}"  # after the header
            raise ValueError(
                f"column: {column!r} in {str(path)!r} must hold whole token counts >= 1; {detail}"
            )
        return cls(values=numbers.astype(np.int64))

    @property
    def mean(self) -> float:
        """The mean of the observed values."""
        return float(np.mean(np.asarray(self.values, dtype=np.int64)))

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        """``n`` observations drawn uniformly with replacement."""
        _check_n(n)
        values = np.asarray(self.values, dtype=np.int64)
        out: IntArray = values[rng.integers(0, values.size, size=n)]
        return out


@dataclass(frozen=True)
class Clipped:
    """Bounds any length distribution: samples of ``inner`` clipped to
    ``[min_tokens, max_tokens]`` (no upper bound when ``max_tokens`` is None).

    ``mean`` is ``inner.mean``, the mean before clipping.
    """

    inner: LengthDistribution
    min_tokens: int = 1
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        _check_bounds(self.min_tokens, self.max_tokens)

    @property
    def mean(self) -> float:
        """The inner distribution's mean, before clipping."""
        return self.inner.mean

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        """``n`` draws of ``inner``, clipped to the bounds."""
        _check_n(n)
        upper = _UNBOUNDED_MAX_TOKENS if self.max_tokens is None else self.max_tokens
        out: IntArray = np.clip(self.inner.sample(rng, n), self.min_tokens, upper).astype(np.int64)
        return out
