"""Records as a table, and the summary a capacity planner reads: latency percentiles, SLO
attainment, goodput, throughput, prefix-cache hit rate.

Percentiles are over requests that completed (`status == ok`); SLO attainment and goodput count
every request, so rejected and failed requests count as misses. Throughput is measured over the
span from the first arrival to the last completion.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from sim.engine.request import RECORD_COLUMNS, Record, RequestStatus
from sim.report.sketch import Values

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True, slots=True)
class PrefixCacheCounts:
    """vLLM's prefix-cache counters in tokens. Like vLLM's Prometheus counters, ``queries`` and
    ``hits`` cover first lookups only; lookups of preempted requests are counted apart.
    """

    queries_tokens: int
    hits_tokens: int
    preempted_queries_tokens: int = 0
    preempted_hits_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        """``hits / queries``; 0 when nothing was looked up."""
        return self.hits_tokens / self.queries_tokens if self.queries_tokens else 0.0


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency targets at a percentile: TTFT and TPOT each at most their target, and E2E when
    it has one (None: no E2E target)."""

    ttft_s: float
    tpot_s: float
    percentile: float = 90.0
    e2e_s: float | None = None


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What a summary reports beside the records: the engine's counters and the run's clock."""

    prefix_cache: PrefixCacheCounts
    num_preemptions: int
    kv_capacity_tokens: int
    busy_s: float | None  # per replica; None where unknown (a live server)
    wall_s: float
    simulated_s: float
    num_events: int


def records_frame(records: Iterable[Record]) -> pd.DataFrame:
    """Records as a DataFrame with exactly :data:`RECORD_COLUMNS`, ordered by request id.

    Built column by column (one array per field, the latencies computed on whole columns with
    the same float operations as :func:`sim.engine.request.latency_metrics`), not row by row: a run
    of half a million requests would otherwise build half a million dicts.
    """
    records = list(records)
    for record in records:
        assert record.status is not None, f"request {record.request_id} has no status"

    def column(name: str, dtype: type) -> np.ndarray:
        return np.fromiter((getattr(r, name) for r in records), dtype=dtype, count=len(records))

    arrival = column("arrival_s", np.float64)
    scheduled = column("scheduled_s", np.float64)
    first = column("first_token_s", np.float64)
    finish = column("finish_s", np.float64)
    output = column("output_tokens", np.int64)
    with np.errstate(invalid="ignore"):
        tpot = np.where(output > 1, (finish - first) / np.maximum(output - 1, 1), math.nan)
    frame = pd.DataFrame(
        {
            "request_id": column("request_id", np.int64),
            "arrival_s": arrival,
            "scheduled_s": scheduled,
            "first_token_s": first,
            "finish_s": finish,
            "prompt_tokens": column("prompt_tokens", np.int64),
            "output_tokens": output,
            "cached_tokens": column("cached_tokens", np.int64),
            "num_preemptions": column("num_preemptions", np.int64),
            "replica_id": column("replica_id", np.int64),
            "priority": column("priority", np.int64),
            "status": [r.status.value for r in records],  # type: ignore[union-attr]
            "error": [r.error for r in records],
            "ttft_s": first - arrival,
            "tpot_s": tpot,
            "e2e_s": finish - arrival,
            "queue_s": scheduled - arrival,
        },
        columns=list(RECORD_COLUMNS),
    )
    ids = frame["request_id"].to_numpy()
    if ids.size < 2 or bool(np.all(ids[1:] > ids[:-1])):
        return frame  # a simulation's records come in id order: no sorted copy of a big frame
    return frame.sort_values("request_id", kind="stable").reset_index(drop=True)


def token_times_frame(records: Iterable[Record]) -> pd.DataFrame | None:
    """Every recorded token time as ``(request_id, token_index, time_s)``; None if none kept."""
    rows = [(r.request_id, i, t) for r in records for i, t in enumerate(r.token_times_s or ())]
    if not rows:
        return None
    return pd.DataFrame(rows, columns=["request_id", "token_index", "time_s"])


def percentile_key(percentile: float) -> str:
    """A percentile's key in a summary: ``p50``, ``p99.9``."""
    return f"p{percentile:g}"


def with_defaults(percentiles: Sequence[float] | None) -> tuple[float, ...]:
    """The user's percentiles and :data:`PERCENTILES` (which every summary keeps), sorted."""
    return tuple(sorted({*PERCENTILES, *(percentiles or ())}))


def distribution(
    values: Sequence[float] | np.ndarray,
    counts: Sequence[int] | np.ndarray | None = None,
    percentiles: Sequence[float] = PERCENTILES,
) -> dict[str, float | None]:
    """``mean`` and each percentile (``p50`` … ``p99`` by default) of the finite values; None
    when there are none.

    With ``counts``, value ``i`` occurs ``counts[i]`` times (run-length encoded samples, such as
    the simulator's inter-token latencies); the percentiles are those of the expanded samples.
    """
    array = np.asarray(values, dtype=np.float64)
    weights = None if counts is None else np.asarray(counts, dtype=np.int64)
    # Copies only where something is dropped: a big run's step samples run to millions.
    finite = np.isfinite(array)
    if not finite.all():
        array = array[finite]
        weights = None if weights is None else weights[finite]
    del finite
    if weights is not None and not (positive := weights > 0).all():
        array, weights = array[positive], weights[positive]
    if array.size == 0:
        return {"mean": None, **{percentile_key(p): None for p in percentiles}}
    if weights is None:
        quantiles = np.percentile(array, percentiles)
        mean = float(array.mean())
    else:
        quantiles = weighted_percentiles(array, weights, percentiles)
        mean = float(np.dot(array, weights) / weights.sum())
    return {
        "mean": mean,
        **{percentile_key(p): float(q) for p, q in zip(percentiles, quantiles, strict=True)},
    }


def weighted_percentiles(
    values: np.ndarray, counts: np.ndarray, percentiles: Sequence[float]
) -> np.ndarray:
    """``np.percentile`` (linear method) of ``values`` repeated ``counts`` times, without
    expanding them: the two order statistics around each percentile are found by a search in
    the cumulative counts and interpolated as numpy does."""
    # A big run has millions of steps: two temporaries (the order and the cumulative counts),
    # not a sorted copy of the values beside them, which only a few positions are read from.
    # Equal values are interchangeable, so the sort need not be stable (nor allocate a buffer).
    order = np.argsort(values)
    ends = counts[order]
    np.cumsum(ends, out=ends)  # the expanded index after each value's last copy
    total = int(ends[-1])
    position = np.asarray(percentiles, dtype=np.float64) / 100.0 * (total - 1)
    below = np.floor(position)
    fraction = position - below
    below_index = below.astype(np.int64)
    above_index = np.minimum(below_index + 1, total - 1)
    low = values[order[np.searchsorted(ends, below_index, side="right")]]
    high = values[order[np.searchsorted(ends, above_index, side="right")]]
    difference = high - low
    # numpy's lerp: from the lower neighbour below one half, from the upper one from there on.
    result: np.ndarray = np.where(
        fraction >= 0.5, high - difference * (1 - fraction), low + difference * fraction
    )
    return result


def slo_met(frame: pd.DataFrame, slo: SLO) -> np.ndarray:
    """Per request: completed, TTFT within target, TPOT within target (or undefined), and E2E
    within its target where there is one."""
    ok = (frame["status"] == RequestStatus.OK.value).to_numpy()
    ttft_ok = (frame["ttft_s"] <= slo.ttft_s).to_numpy()
    tpot = frame["tpot_s"].to_numpy(dtype=np.float64)
    tpot_ok = np.isnan(tpot) | (tpot <= slo.tpot_s)
    result: np.ndarray = ok & ttft_ok & tpot_ok
    if slo.e2e_s is not None:
        result &= (frame["e2e_s"] <= slo.e2e_s).to_numpy()
    return result


def summarize(
    frame: pd.DataFrame,
    *,
    itl_s: np.ndarray,
    itl_counts: np.ndarray | None = None,
    slo: SLO,
    facts: RunFacts,
    percentiles: Sequence[float] = PERCENTILES,
) -> dict[str, Any]:
    """The summary dictionary (also ``summary.json`` and ``servesim run --json``) of a table of
    records, with each latency at ``percentiles``, exact (:class:`RecordStats` of one chunk)."""
    stats = RecordStats(slo, exact_limit=None)
    stats.add(frame)
    itl = Values(exact_limit=None)
    itl.add(itl_s, itl_counts)
    return stats.summary(itl=itl, facts=facts, percentiles=percentiles)


_LATENCIES = ("ttft_s", "tpot_s", "e2e_s", "queue_s")


class _ClassStats:
    """One priority class: its requests, completed ones, latencies and SLO attainment."""

    def __init__(self, exact_limit: int | None) -> None:
        self.requests = self.ok = self.met = 0
        self.latencies = {name: Values(exact_limit) for name in ("ttft_s", "tpot_s", "e2e_s")}


class RecordStats:
    """What the summary reads from records, gathered from tables of records added one chunk
    at a time (a run too big to hold its records streams them out in chunks).

    The SLO is judged over *every* request: a rejected or failed request counts as one that
    missed both targets, so a run that rejects half its traffic cannot meet a p90 SLO.
    Percentiles are exact while each distribution holds at most ``exact_limit`` values (None:
    always), from a t-digest past that (:mod:`sim.report.sketch`); ``summary()`` says which
    (``sim.percentiles``).
    """

    def __init__(self, slo: SLO, exact_limit: int | None) -> None:
        self.slo = slo
        self.exact_limit = exact_limit
        self.latencies = {name: Values(exact_limit) for name in _LATENCIES}
        self.statuses: dict[str, int] = {}
        self.total = self.num_ok = self.met = 0
        self.output_tokens = self.prompt_tokens = 0  # of completed requests
        self.all_output_tokens = 0  # of every request (the stability's mean output)
        self.rate_sum, self.rate_count = 0.0, 0  # 1 / TPOT of completed requests
        self.first_arrival_s, self.last_arrival_s, self.num_arrivals = math.inf, -math.inf, 0
        self.last_finish_s = -math.inf
        self.classes: dict[int, _ClassStats] = {}

    def add(self, frame: pd.DataFrame) -> None:
        """Fold a table of records (:data:`RECORD_COLUMNS`) into the statistics."""
        if not len(frame):
            return
        is_ok = (frame["status"] == RequestStatus.OK.value).to_numpy()
        for name, values in self.latencies.items():
            values.add(frame[name].to_numpy(dtype=np.float64)[is_ok])
        rates = _decode_rates(frame["tpot_s"].to_numpy(dtype=np.float64)[is_ok])
        self.rate_sum += float(rates.sum())
        self.rate_count += rates.size
        for status, count in frame["status"].value_counts().items():
            self.statuses[str(status)] = self.statuses.get(str(status), 0) + int(count)
        self.total += len(frame)
        self.num_ok += int(is_ok.sum())
        output = frame["output_tokens"].to_numpy(dtype=np.int64)
        self.output_tokens += int(output[is_ok].sum())
        self.all_output_tokens += int(output.sum())
        self.prompt_tokens += int(frame["prompt_tokens"].to_numpy(dtype=np.int64)[is_ok].sum())
        met = slo_met(frame, self.slo)
        self.met += int(met.sum())
        arrivals = frame["arrival_s"].to_numpy(dtype=np.float64)
        arrivals = arrivals[np.isfinite(arrivals)]
        if arrivals.size:
            self.num_arrivals += arrivals.size
            self.first_arrival_s = min(self.first_arrival_s, float(arrivals.min()))
            self.last_arrival_s = max(self.last_arrival_s, float(arrivals.max()))
        finish = frame["finish_s"].to_numpy(dtype=np.float64)
        finish = finish[~np.isnan(finish)]
        if finish.size:
            self.last_finish_s = max(self.last_finish_s, float(finish.max()))
        if "priority" not in frame:
            return
        priorities = frame["priority"].to_numpy(dtype=np.int64)
        for priority in np.unique(priorities):
            rows = priorities == priority
            stats = self.classes.setdefault(int(priority), _ClassStats(self.exact_limit))
            ok_rows = rows & is_ok
            stats.requests += int(rows.sum())
            stats.ok += int(ok_rows.sum())
            stats.met += int(met[rows].sum())
            for name, values in stats.latencies.items():
                values.add(frame[name].to_numpy(dtype=np.float64)[ok_rows])

    @property
    def exact(self) -> bool:
        """Whether every percentile is exact (no distribution became a sketch)."""
        return all(v.exact for v in self.latencies.values())

    @property
    def mean_output_tokens(self) -> float:
        """The mean output length over every request (NaN without any)."""
        return self.all_output_tokens / self.total if self.total else math.nan

    def summary(
        self,
        *,
        itl: Values,
        facts: RunFacts,
        percentiles: Sequence[float] = PERCENTILES,
    ) -> dict[str, Any]:
        """The summary dictionary, each latency at ``percentiles``."""
        slo, prefix_cache, busy_s = self.slo, facts.prefix_cache, facts.busy_s
        if self.total:
            start = self.first_arrival_s
            end = max(self.last_finish_s, start)
        else:
            start = end = 0.0
        span = end - start
        per_s = (lambda x: x / span) if span > 0 else (lambda x: math.nan)
        bad = self.total - self.num_ok
        ttft_pct = _percentile_all(self.latencies["ttft_s"], bad, slo.percentile)
        tpot_pct = _percentile_all(self.latencies["tpot_s"], bad, slo.percentile)
        e2e_pct = _percentile_all(self.latencies["e2e_s"], bad, slo.percentile)
        e2e_met = slo.e2e_s is None or e2e_pct <= slo.e2e_s
        tpot = self.latencies["tpot_s"]
        per_user = (
            _per_user(tpot.held()[0])
            if tpot.exact
            else (self.rate_sum / self.rate_count if self.rate_count else None)
        )
        summary: dict[str, Any] = {
            **{
                name: summary_of(self.latencies[name], percentiles) for name in ("ttft_s", "tpot_s")
            },
            "itl_s": summary_of(itl, percentiles),
            **{
                name: summary_of(self.latencies[name], percentiles) for name in ("e2e_s", "queue_s")
            },
            "throughput": {
                "requests_per_s": per_s(self.num_ok),
                "output_tokens_per_s": per_s(self.output_tokens),
                "total_tokens_per_s": per_s(self.output_tokens + self.prompt_tokens),
                # The interactivity axis: each request's decode speed (1 / TPOT), averaged.
                "output_tokens_per_s_per_user": per_user,
            },
            "goodput": {
                "requests_per_s": per_s(self.met),
                "slo_attainment": self.met / self.total if self.total else None,
            },
            "slo": {
                "percentile": slo.percentile,
                "ttft_target_s": slo.ttft_s,
                "tpot_target_s": slo.tpot_s,
                "e2e_target_s": slo.e2e_s,
                "ttft_at_percentile_s": _finite_or_none(ttft_pct),
                "tpot_at_percentile_s": _finite_or_none(tpot_pct),
                "e2e_at_percentile_s": _finite_or_none(e2e_pct),
                "met": bool(
                    ttft_pct <= slo.ttft_s
                    and (math.isnan(tpot_pct) or tpot_pct <= slo.tpot_s)
                    and e2e_met
                ),
            },
            "prefix_cache": {
                "hit_rate": prefix_cache.hit_rate,
                "queries_tokens": prefix_cache.queries_tokens,
                "hits_tokens": prefix_cache.hits_tokens,
                "preempted_queries_tokens": prefix_cache.preempted_queries_tokens,
                "preempted_hits_tokens": prefix_cache.preempted_hits_tokens,
            },
            "preemptions": facts.num_preemptions,
            "kv_capacity_tokens": facts.kv_capacity_tokens,
            "busy_fraction": (
                busy_s / facts.simulated_s if busy_s is not None and facts.simulated_s > 0 else None
            ),
            "requests": {
                "total": self.total,
                **{status.value: self.statuses.get(status.value, 0) for status in RequestStatus},
            },
            "sim": {
                "wall_s": facts.wall_s,
                "simulated_s": facts.simulated_s,
                "events": facts.num_events,
                "percentiles": "exact" if self.exact and itl.exact else "t-digest",
            },
        }
        if len(self.classes) > 1:
            summary["by_priority"] = {
                str(priority): {
                    "requests": stats.requests,
                    "ok": stats.ok,
                    **{name: summary_of(v) for name, v in stats.latencies.items()},
                    "slo_attainment": stats.met / stats.requests if stats.requests else None,
                }
                for priority, stats in sorted(self.classes.items())
            }
        return summary


def summary_of(
    values: Values, percentiles: Sequence[float] = PERCENTILES
) -> dict[str, float | None]:
    """:func:`distribution` of gathered values: exact while they are held, else the t-digest's
    percentiles and the exact mean."""
    if values.exact:
        held, counts = values.held()
        return distribution(held, counts, percentiles)
    quantiles = values.quantiles([p / 100.0 for p in percentiles])
    return {
        "mean": values.mean(),
        **{percentile_key(p): q for p, q in zip(percentiles, quantiles, strict=True)},
    }


def _decode_rates(tpot_s: np.ndarray) -> np.ndarray:
    """Each request's decode speed, 1 / TPOT, where TPOT is finite and positive."""
    rates: np.ndarray = 1.0 / tpot_s[np.isfinite(tpot_s) & (tpot_s > 0)]
    return rates


def _per_user(tpot_s: np.ndarray) -> float | None:
    rates = _decode_rates(tpot_s)
    return float(rates.mean()) if rates.size else None


def _percentile_all(values: Values, num_bad: int, percentile: float) -> float:
    """Percentile (numpy's ``higher`` method) over all requests: the completed ones' finite
    ``values`` and ``num_bad`` requests that did not complete, counting as +inf. NaN when there
    is no value at all."""
    if values.exact:
        held, _ = values.held()
        everything = np.concatenate([held, np.full(num_bad, np.inf)])
        if everything.size == 0:
            return math.nan
        return float(np.percentile(everything, percentile, method="higher"))
    total = values.count + num_bad
    rank = math.ceil((total - 1) * percentile / 100.0)
    return math.inf if rank >= values.count else values.ranked(rank)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
