"""A fleet's time series: one sample per sampling instant, as a named, typed row, and the
series that keeps them.

Gauges (waiting, running, KV use, replica counts, cost rate) are read at ``time_s``; rates, the
prefix-cache hit rate and the busy fraction cover the interval that ends at ``time_s``. The
field names are the columns of ``timeseries.parquet``; a row is a tuple, so building one per
sample stays cheap and a list of them is a DataFrame as it is.

A run of months sampled every second takes millions of samples. :class:`SampledSeries` hands
each one to a writer in chunks as it is taken (every sample reaches the file) and keeps a copy of
at most :data:`MAX_KEPT` rows for the reports that read the series in memory (the stability
check, the fleet summary, the HTML report, the Prometheus backfill, the dashboard): every sample
while there are few, then rows that each stand for 2, 4, 8 … consecutive samples, as if sampled
that much less often.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import pandas as pd


class Sample(NamedTuple):
    """The fleet at one sampling instant (see the module docstring for what each covers)."""

    time_s: float
    num_requests_waiting: int  # summed over replicas (plus requests no replica could take yet)
    num_requests_running: int
    kv_cache_usage: float  # mean over ready replicas
    prefix_cache_hit_rate: float  # over the interval, all replicas
    prompt_tokens_per_s: float
    output_tokens_per_s: float
    busy_fraction: float  # mean over ready replicas
    num_finished: int
    num_ok: int
    num_replicas: int  # ready and accepting requests
    num_replicas_starting: int
    num_replicas_draining: int
    cost_usd_per_hour: float  # GPUs of every replica started and not yet stopped × their price


#: The time-series columns, in order.
TIMESERIES_COLUMNS = Sample._fields
#: Columns that cover the interval before ``time_s``: a merged row averages them over its
#: samples, weighted by their intervals (so rate × interval, a token count, is kept; the hit
#: rate is weighted by time, not by lookups). The others are gauges, read at the merged row's end.
INTERVAL_COLUMNS = (
    "prefix_cache_hit_rate",
    "prompt_tokens_per_s",
    "output_tokens_per_s",
    "busy_fraction",
)

#: The most rows a series keeps in memory (an even number: full, it halves by merging pairs).
MAX_KEPT = 200_000
#: Samples handed to the writer at a time.
CHUNK_ROWS = 50_000


class TableSink(Protocol):
    """Where every sample goes (sim/report/outputs.py's TableWriter is one)."""

    def write(self, frame: pd.DataFrame) -> None: ...


def merge(samples: Sequence[Sample], start_s: float) -> Sample:
    """``samples`` (consecutive, the first one's interval starting at ``start_s``) as one row
    over their whole interval: interval columns averaged by time, gauges from the last."""
    last = samples[-1]
    if len(samples) == 1:
        return last
    spans = []
    previous = start_s
    for sample in samples:
        spans.append(sample.time_s - previous)
        previous = sample.time_s
    total = sum(spans)
    weights = spans if total > 0 else [1.0] * len(samples)
    whole = sum(weights)

    def mean(values: Sequence[float]) -> float:
        return sum(v * w for v, w in zip(values, weights, strict=True)) / whole

    return last._replace(
        prefix_cache_hit_rate=mean([s.prefix_cache_hit_rate for s in samples]),
        prompt_tokens_per_s=mean([s.prompt_tokens_per_s for s in samples]),
        output_tokens_per_s=mean([s.output_tokens_per_s for s in samples]),
        busy_fraction=mean([s.busy_fraction for s in samples]),
    )


class SampledSeries:
    """The samples of one fleet or pool: every one to :attr:`writer` (when it has one), at most
    ``max_rows`` kept (see the module docstring)."""

    def __init__(self, max_rows: int | None = None, chunk_rows: int | None = None) -> None:
        """``max_rows`` defaults to :data:`MAX_KEPT`, ``chunk_rows`` to :data:`CHUNK_ROWS`."""
        max_rows = MAX_KEPT if max_rows is None else max_rows
        if max_rows < 2 or max_rows % 2:
            raise ValueError(f"max_rows: must be an even number >= 2, got {max_rows}")
        self.max_rows = max_rows
        self.chunk_rows = CHUNK_ROWS if chunk_rows is None else chunk_rows
        self.writer: TableSink | None = None
        self.stride = 1  # samples per kept row
        self.count = 0  # samples taken
        self.peak_replicas = 0  # most replicas ready or starting at a sample
        self._kept: list[Sample] = []  # rows of ``stride`` samples each
        self._filling: list[Sample] = []  # the samples of the next kept row (< stride)
        self._chunk: list[Sample] = []
        self._last: Sample | None = None

    @property
    def last(self) -> Sample:
        """The latest sample (a series is read after its first)."""
        if self._last is None:
            raise LookupError("the series has no sample yet")
        return self._last

    def add(self, sample: Sample) -> None:
        """One sample: to the writer's next chunk, and into the kept rows."""
        self.count += 1
        self._last = sample
        self.peak_replicas = max(
            self.peak_replicas, sample.num_replicas + sample.num_replicas_starting
        )
        if self.writer is not None:
            self._chunk.append(sample)
            if len(self._chunk) >= self.chunk_rows:
                self.flush()
        self._filling.append(sample)
        if len(self._filling) < self.stride:
            return
        self._kept.append(merge(self._filling, self._end_of_kept()))
        self._filling = []
        if len(self._kept) >= self.max_rows:
            self._halve()

    def _end_of_kept(self) -> float:
        return self._kept[-1].time_s if self._kept else 0.0

    def _halve(self) -> None:
        """Merge the kept rows in pairs: half as many, each of twice the samples."""
        kept, merged = self._kept, []
        start = 0.0
        for i in range(0, len(kept), 2):
            merged.append(merge(kept[i : i + 2], start))
            start = kept[i + 1].time_s
        self._kept = merged
        self.stride *= 2

    def flush(self) -> None:
        """Hand the samples not yet written to the writer."""
        if self.writer is not None and self._chunk:
            self.writer.write(pd.DataFrame(self._chunk, columns=list(TIMESERIES_COLUMNS)))
        self._chunk = []

    def frame(self) -> pd.DataFrame:
        """The kept rows (the last one merges the samples since the last full row)."""
        rows = list(self._kept)
        if self._filling:
            rows.append(merge(self._filling, self._end_of_kept()))
        return pd.DataFrame(rows, columns=list(TIMESERIES_COLUMNS))
