"""The fleet's time series under vLLM's Prometheus metric names, so dashboards and alerting or
HPA rules written for a real vLLM deployment can be tried on simulated traffic.

Two forms, both built from a run's time series and records:

* :func:`scrape_text` — what ``/metrics`` would have returned at one sample time (Prometheus
  text format 0.0.4, no timestamps), one document per sample time;
* :func:`openmetrics_backfill` — every sample time in one OpenMetrics file with timestamps, for
  ``promtool tsdb create-blocks-from openmetrics FILE DIR`` (simulated second ``t`` becomes
  ``start_epoch_s + t``).

Metrics: the gauges ``vllm:num_requests_waiting``, ``vllm:num_requests_running`` and
``vllm:kv_cache_usage_perc`` (0–1, mean over ready replicas), the counters
``vllm:prompt_tokens``, ``vllm:generation_tokens`` and ``vllm:request_success``, the histograms
``vllm:time_to_first_token_seconds`` and ``vllm:e2e_request_latency_seconds`` with vLLM's own
bucket boundaries, and ``servesim:num_replicas`` (ready), ``servesim:num_replicas_starting``
and ``servesim:num_replicas_draining``. Series carry ``model_name`` (as vLLM's do) and
``engine="fleet"``: they are fleet-wide.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

#: vLLM 0.32's bucket boundaries (vllm/v1/metrics/buckets.py: TIME_TO_FIRST_TOKEN_BUCKETS and
#: REQUEST_LATENCY_BUCKETS), so quantiles computed from these histograms match a real server's.
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
E2E_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
#: 2026-01-01T00:00:00Z: where simulated time 0 lands in a backfill unless told otherwise.
DEFAULT_START_EPOCH_S = 1_767_225_600.0

_GAUGES = (
    ("vllm:num_requests_waiting", "num_requests_waiting", "Requests waiting to be scheduled."),
    ("vllm:num_requests_running", "num_requests_running", "Requests in execution batches."),
    ("vllm:kv_cache_usage_perc", "kv_cache_usage", "KV-cache usage, 1 means 100 percent."),
    ("servesim:num_replicas", "num_replicas", "Replicas ready and taking requests."),
    ("servesim:num_replicas_starting", "num_replicas_starting", "Replicas starting up."),
    ("servesim:num_replicas_draining", "num_replicas_draining", "Replicas draining."),
)
_COUNTERS = (
    ("vllm:prompt_tokens", "Prefill tokens processed."),
    ("vllm:generation_tokens", "Generation tokens processed."),
    ("vllm:request_success", "Requests finished successfully."),
)
_HISTOGRAMS = (
    ("vllm:time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS),
    ("vllm:e2e_request_latency_seconds", "End-to-end request latency in seconds.", E2E_BUCKETS),
)


class _Series:
    """Everything the exposition needs at each sample time, computed once."""

    def __init__(self, timeseries: pd.DataFrame, records: pd.DataFrame) -> None:
        self.times = timeseries["time_s"].to_numpy(dtype=np.float64)
        self.gauges = {
            column: timeseries[column].to_numpy(dtype=np.float64)
            for _, column, _ in _GAUGES
            if column in timeseries.columns
        }
        interval = np.diff(self.times, prepend=0.0)
        self.counters = {
            "vllm:prompt_tokens": np.cumsum(timeseries["prompt_tokens_per_s"] * interval),
            "vllm:generation_tokens": np.cumsum(timeseries["output_tokens_per_s"] * interval),
            "vllm:request_success": timeseries["num_ok"].to_numpy(dtype=np.float64),
        }
        ok = records[records["status"] == "ok"]
        self.observations = {
            "vllm:time_to_first_token_seconds": _sorted(ok["first_token_s"], ok["ttft_s"]),
            "vllm:e2e_request_latency_seconds": _sorted(ok["finish_s"], ok["e2e_s"]),
        }

    def histogram(self, name: str, buckets: Sequence[float], i: int) -> tuple[list[int], float]:
        """Cumulative counts per bucket (then +Inf) and the sum, of what was observed by t_i."""
        when, values = self.observations[name]
        seen = values[: int(np.searchsorted(when, self.times[i], side="right"))]
        ordered = np.sort(seen)
        counts = [int(np.searchsorted(ordered, le, side="right")) for le in buckets]
        return [*counts, len(seen)], float(seen.sum())


def _sorted(at: pd.Series, values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(at.to_numpy(dtype=np.float64), kind="stable")
    return at.to_numpy(dtype=np.float64)[order], values.to_numpy(dtype=np.float64)[order]


def _num(value: float) -> str:
    """A sample value as the exposition formats spell it."""
    value = float(value)
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _labels(model_name: str, extra: str = "") -> str:
    escaped = model_name.replace("\\", "\\\\").replace('"', '\\"')
    inner = f'engine="fleet",model_name="{escaped}"'
    return "{" + inner + (f",{extra}" if extra else "") + "}"


def _le(bound: float) -> str:
    return f'le="{bound!r}"' if bound != float("inf") else 'le="+Inf"'


def _family_lines(
    series: _Series, i: int, model_name: str, stamp: str
) -> Iterator[tuple[str, list[str]]]:
    """(family name, its lines) for sample ``i``; ``stamp`` is appended to every sample."""
    labels = _labels(model_name)
    for name, column, _doc in _GAUGES:
        if column in series.gauges:
            yield name, [f"{name}{labels} {_num(series.gauges[column][i])}{stamp}"]
    for name, _doc in _COUNTERS:
        yield name, [f"{name}_total{labels} {_num(series.counters[name][i])}{stamp}"]
    for name, _doc, buckets in _HISTOGRAMS:
        counts, total = series.histogram(name, buckets, i)
        lines = [
            f"{name}_bucket{_labels(model_name, _le(le))} {count}{stamp}"
            for le, count in zip([*buckets, float("inf")], counts, strict=True)
        ]
        lines += [
            f"{name}_count{labels} {counts[-1]}{stamp}",
            f"{name}_sum{labels} {_num(total)}{stamp}",
        ]
        yield name, lines


def _header(name: str, openmetrics: bool) -> list[str]:
    for gauge, _, doc in _GAUGES:
        if gauge == name:
            return [f"# HELP {name} {doc}", f"# TYPE {name} gauge"]
    for counter, doc in _COUNTERS:
        if counter == name:
            # The text format names the family after its sample (with _total); OpenMetrics
            # names it without.
            family = name if openmetrics else f"{name}_total"
            return [f"# HELP {family} {doc}", f"# TYPE {family} counter"]
    for histogram, doc, _ in _HISTOGRAMS:
        if histogram == name:
            return [f"# HELP {name} {doc}", f"# TYPE {name} histogram"]
    raise AssertionError(name)


def scrape_text(
    timeseries: pd.DataFrame, records: pd.DataFrame, index: int, *, model_name: str
) -> str:
    """``/metrics`` at sample ``index`` of the time series (Prometheus text format 0.0.4)."""
    series = _Series(timeseries, records)
    lines: list[str] = []
    for name, family in _family_lines(series, index, model_name, ""):
        lines += _header(name, openmetrics=False) + family
    return "\n".join(lines) + "\n"


def openmetrics_backfill(
    timeseries: pd.DataFrame,
    records: pd.DataFrame,
    *,
    model_name: str,
    start_epoch_s: float = DEFAULT_START_EPOCH_S,
) -> str:
    """Every sample time as one OpenMetrics document with timestamps (see module docstring)."""
    series = _Series(timeseries, records)
    families: dict[str, list[str]] = {}
    for i, t in enumerate(series.times):
        stamp = f" {start_epoch_s + t:.3f}"
        for name, lines in _family_lines(series, i, model_name, stamp):
            families.setdefault(name, []).extend(lines)
    out: list[str] = []
    for name, lines in families.items():
        out += _header(name, openmetrics=True) + lines
    return "\n".join([*out, "# EOF"]) + "\n"


def write_backfill(path: str | Path, text: str) -> Path:
    path = Path(path)
    path.write_text(text, encoding="utf-8")
    return path
