"""Was a run's load sustainable? A growing queue makes latency percentiles a function of how
long the run was, not of the deployment; this says so, and estimates the capacity it hit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd


def stability(
    arrivals: tuple[int, float, float],
    mean_output_tokens: float,
    timeseries: pd.DataFrame,
    stopped: str = "",
) -> dict[str, Any]:
    """Was the load sustainable, given the records' ``arrivals`` (how many have a time, the
    first and the last) and mean output length? A run is unstable when it was stopped by a bound
    (``stopped`` says which) or when its waiting queue grew through the second half of the
    arrivals — by at least 20 requests and half its mean there. Then the percentiles depend on
    how long the run was, not on the deployment.

    Reports the arrival rate (over the arrival span), and when unstable the time since which
    the queue has not been short (``diverging_since_s``: the last sample with at most 5 % of
    the final queue) and the capacity (output tokens per second since then over the mean
    output length: requests per second).
    """
    num_arrivals, start, end = arrivals
    result: dict[str, Any] = {
        "stable": True,
        "arrival_rate_per_s": None,
        "capacity_per_s": None,
        "diverging_since_s": None,
        "stopped": stopped or None,
        "message": "",
    }
    if num_arrivals < 2:
        result["stable"] = not stopped
        return result
    span = end - start
    rate = (num_arrivals - 1) / span if span > 0 else math.inf
    result["arrival_rate_per_s"] = rate
    times = timeseries["time_s"].to_numpy(dtype=np.float64)
    waiting = timeseries["num_requests_waiting"].to_numpy(dtype=np.float64)
    output_rate = timeseries["output_tokens_per_s"].to_numpy(dtype=np.float64)
    growing = False
    window = (times >= start + span / 2) & (times <= end)
    if window.sum() >= 3:
        slope = float(np.polyfit(times[window], waiting[window], 1)[0])
        growth = slope * span / 2
        growing = growth >= max(20.0, 0.5 * float(waiting[window].mean()))
    if not (growing or stopped):
        return result
    result["stable"] = False
    upto = times <= (end if not stopped else times[-1])
    upto_times, upto_waiting = times[upto], waiting[upto]
    short = upto_waiting <= max(1.0, 0.05 * float(upto_waiting[-1]))
    first = int(np.nonzero(short)[0][-1]) if short.any() else 0
    last = int(upto.sum()) - 1
    since = float(upto_times[first])
    capacity = None
    if last > first:
        # Output tokens per second while saturated, over the workload's mean output: requests
        # per second (a count of finished requests would miss long ones still decoding).
        tokens_per_s = float(output_rate[first + 1 : last + 1].mean())
        capacity = tokens_per_s / mean_output_tokens if mean_output_tokens > 0 else None
    result["diverging_since_s"] = since
    result["capacity_per_s"] = capacity
    capacity_text = "?" if capacity is None else f"{capacity:.3g}"
    result["message"] = (
        f"unstable: arrival rate {rate:.3g} req/s > capacity ≈ {capacity_text} req/s; the queue "
        f"has grown since {since:,.0f} s"
        + (f"; the run was stopped: {stopped}" if stopped else "")
        + ". Latency percentiles of this run depend on its length, not on the deployment."
    )
    return result
