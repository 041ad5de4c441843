"""Scrape a vLLM server's Prometheus ``/metrics`` and difference two scrapes.

A live run scrapes before and after the workload; :func:`metrics_delta` turns the two into what
the run itself did (prefix-cache queries and hits, preemptions, tokens, and the latency
histograms), to compare with the simulator's summary under the same vLLM names. Counters and
histograms are summed over label sets (engines, models), so a server with several engines
reads as one.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: ``(sample name, sorted (label, value) pairs)``: one Prometheus sample.
SampleKey = tuple[str, tuple[tuple[str, str], ...]]

#: The per-request time-per-output-token histogram; older vLLM versions used the second name.
TPOT_NAMES = ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds")


def parse_metrics(text: str) -> dict[SampleKey, float]:
    """Every sample of a Prometheus text exposition, keyed by name and sorted labels.

    Sample names are as exposed: a counter family ``vllm:prompt_tokens`` has the sample
    ``vllm:prompt_tokens_total``; a histogram ``x`` has ``x_bucket`` (with an ``le`` label),
    ``x_sum`` and ``x_count``.
    """
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[SampleKey, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            samples[key] = float(sample.value)
    return samples


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram: cumulative counts per upper bound ``le``, plus sum and count.

    ``buckets`` is ordered by ``le`` and ends with ``+inf`` when the histogram has samples.
    """

    buckets: tuple[tuple[float, float], ...] = ()
    sum: float = 0.0
    count: float = 0.0

    @property
    def mean(self) -> float:
        """``sum / count``; NaN when nothing was observed."""
        return self.sum / self.count if self.count else math.nan

    def bucket_counts(self) -> dict[float, float]:
        """``le -> cumulative count``."""
        return dict(self.buckets)

    def __sub__(self, other: Histogram) -> Histogram:
        """The observations made between ``other`` (earlier) and ``self`` (later)."""
        mine, theirs = self.bucket_counts(), other.bucket_counts()
        buckets = tuple(
            (le, mine.get(le, 0.0) - theirs.get(le, 0.0)) for le in sorted(mine.keys() | theirs)
        )
        return Histogram(buckets, self.sum - other.sum, self.count - other.count)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly: bucket bounds as strings (``"+Inf"``), a NaN mean as None."""
        return {
            "buckets": {_format_le(le): count for le, count in self.buckets},
            "sum": self.sum,
            "count": self.count,
            "mean": None if math.isnan(self.mean) else self.mean,
        }


def _format_le(le: float) -> str:
    return "+Inf" if math.isinf(le) else repr(le)


@dataclass(frozen=True)
class MetricsSnapshot:
    """One scrape of ``/metrics``: every sample and the wall-clock time (Unix s) it was taken."""

    samples: Mapping[SampleKey, float]
    time_s: float = field(default_factory=time.time)

    def has(self, name: str) -> bool:
        """Whether any sample has this name (or, for a counter, its ``_total`` spelling)."""
        return any(sample_name in self._names() for sample_name in _spellings(name))

    def _names(self) -> set[str]:
        return {sample_name for sample_name, _ in self.samples}

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples named ``name`` whose labels include ``labels``; 0.0 if none.

        A counter may be named either way: ``vllm:prompt_tokens`` finds
        ``vllm:prompt_tokens_total`` and vice versa (the exact name wins if both exist).
        """
        names = self._names()
        for spelling in _spellings(name):
            if spelling in names:
                return sum(
                    value
                    for (sample_name, sample_labels), value in self.samples.items()
                    if sample_name == spelling and _matches(sample_labels, labels)
                )
        return 0.0

    def histogram(self, name: str, **labels: str) -> Histogram:
        """The histogram ``name`` summed over label sets (other than ``le``) matching ``labels``.

        Empty (no buckets, zero sum and count) if the server does not expose it.
        """
        counts: defaultdict[float, float] = defaultdict(float)
        total = count = 0.0
        for (sample_name, sample_labels), value in self.samples.items():
            if not _matches(sample_labels, labels):
                continue
            if sample_name == f"{name}_bucket":
                le = dict(sample_labels).get("le")
                if le is not None:
                    counts[float(le)] += value  # float() reads "+Inf" as inf
            elif sample_name == f"{name}_sum":
                total += value
            elif sample_name == f"{name}_count":
                count += value
        return Histogram(tuple(sorted(counts.items())), total, count)


def _spellings(name: str) -> tuple[str, ...]:
    if name.endswith("_total"):
        return (name, name.removesuffix("_total"))
    return (name, f"{name}_total")


def _matches(sample_labels: tuple[tuple[str, str], ...], wanted: Mapping[str, str]) -> bool:
    if not wanted:
        return True
    have = dict(sample_labels)
    return all(have.get(key) == str(value) for key, value in wanted.items())


def scrape(url: str, *, timeout_s: float = 10) -> MetricsSnapshot:
    """``GET {url}/metrics`` of a server (``url`` as ``http://host:port``, ``/v1`` tolerated)."""
    import httpx

    from live.client import base_url

    response = httpx.get(f"{base_url(url)}/metrics", timeout=timeout_s)
    response.raise_for_status()
    return MetricsSnapshot(parse_metrics(response.text), time.time())


@dataclass(frozen=True)
class MetricsDelta:
    """What a server did between two scrapes, under vLLM's metric names.

    Token counts and prefix-cache figures are in tokens (vLLM counts cache queries and hits in
    tokens, in whole blocks); ``tpot`` is vLLM's per-request time per output token and ``itl``
    its per-token inter-token latency.
    """

    duration_s: float
    prefix_cache_queries: float
    prefix_cache_hits: float
    preemptions: float
    prompt_tokens: float
    prompt_tokens_cached: float
    generation_tokens: float
    iteration_tokens: Histogram
    ttft: Histogram
    tpot: Histogram
    itl: Histogram
    e2e: Histogram
    queue_time: Histogram  # engine: queued -> first scheduled
    # Engine-side phases of a request (vLLM V1): scheduled -> first token, first token -> last,
    # and scheduled -> last.
    prefill_time: Histogram = field(default_factory=Histogram)
    decode_time: Histogram = field(default_factory=Histogram)
    inference_time: Histogram = field(default_factory=Histogram)

    @property
    def ttft_outside_engine_s(self) -> float:
        """Mean seconds of vLLM's TTFT spent neither queued in the engine nor in its prefill:
        the API server's input processing, the hand-off to the engine core, the wait for the
        step in progress to end, and the first token's way back. NaN without the histograms."""
        if not (self.ttft.count and self.queue_time.count and self.prefill_time.count):
            return math.nan
        return self.ttft.mean - self.queue_time.mean - self.prefill_time.mean

    def ttft_parts(self) -> dict[str, float] | None:
        """vLLM's mean TTFT and its parts in seconds: ``ttft = outside_engine + queue +
        prefill`` (the names calibration.replay_fit.ttft_parts gives a simulated run's); None
        where the server did not expose the phase histograms."""
        outside = self.ttft_outside_engine_s
        if math.isnan(outside):
            return None
        return {
            "ttft": self.ttft.mean,
            "outside_engine": outside,
            "queue": self.queue_time.mean,
            "prefill": self.prefill_time.mean,
        }

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Hit tokens over queried tokens; NaN when nothing was queried."""
        return (
            self.prefix_cache_hits / self.prefix_cache_queries
            if self.prefix_cache_queries
            else math.nan
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly: numbers, histograms as ``{buckets, sum, count, mean}``, NaN as None."""
        result: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            result[name] = value.as_dict() if isinstance(value, Histogram) else value
        rate = self.prefix_cache_hit_rate
        result["prefix_cache_hit_rate"] = None if math.isnan(rate) else rate
        outside = self.ttft_outside_engine_s
        result["ttft_outside_engine_s"] = None if math.isnan(outside) else outside
        return result


def metrics_delta(before: MetricsSnapshot, after: MetricsSnapshot) -> MetricsDelta:
    """``after - before`` for the metrics that matter; absent metrics count as zero.

    Raises ``ValueError`` if a counter went down, which means the server restarted in between
    (its counters start again from zero) and the difference is meaningless.
    """

    def counter(name: str) -> float:
        delta = after.value(name) - before.value(name)
        if delta < 0:
            raise ValueError(
                f"{name} went down by {-delta:g} between the scrapes: the server restarted in "
                "between; scrape again before the run"
            )
        return delta

    def histogram(name: str) -> Histogram:
        return after.histogram(name) - before.histogram(name)

    tpot_name = next((name for name in TPOT_NAMES if after.has(f"{name}_count")), TPOT_NAMES[0])
    return MetricsDelta(
        duration_s=after.time_s - before.time_s,
        prefix_cache_queries=counter("vllm:prefix_cache_queries"),
        prefix_cache_hits=counter("vllm:prefix_cache_hits"),
        preemptions=counter("vllm:num_preemptions"),
        prompt_tokens=counter("vllm:prompt_tokens"),
        prompt_tokens_cached=counter("vllm:prompt_tokens_cached"),
        generation_tokens=counter("vllm:generation_tokens"),
        iteration_tokens=histogram("vllm:iteration_tokens_total"),
        ttft=histogram("vllm:time_to_first_token_seconds"),
        tpot=histogram(tpot_name),
        itl=histogram("vllm:inter_token_latency_seconds"),
        e2e=histogram("vllm:e2e_request_latency_seconds"),
        queue_time=histogram("vllm:request_queue_time_seconds"),
        prefill_time=histogram("vllm:request_prefill_time_seconds"),
        decode_time=histogram("vllm:request_decode_time_seconds"),
        inference_time=histogram("vllm:request_inference_time_seconds"),
    )
