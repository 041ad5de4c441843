"""One time-series sample of a fleet, as a named, typed row.

Gauges (waiting, running, KV use, replica counts, cost rate) are read at ``time_s``; rates, the
prefix-cache hit rate and the busy fraction cover the interval that ends at ``time_s``. The
field names are the columns of ``timeseries.parquet``; a row is a tuple, so building one per
sample stays cheap and a list of them is a DataFrame as it is.
"""

from __future__ import annotations

from typing import NamedTuple


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
