"""A run's records as ``vllm bench serve``'s result file, so dashboards that read vLLM's benchmark
JSON read servesim's predictions beside real runs.

The keys and their meaning follow ``vllm/benchmarks/serve.py`` (vLLM 0.1x): ``duration`` from the
first request sent to the last answer; ``completed`` and ``failed``; token totals over completed
requests; ``request_throughput``, ``output_throughput`` and ``total_token_throughput`` per second of
``duration``; and for TTFT, TPOT, ITL and E2E latency ``mean_*_ms``, ``median_*_ms``, ``std_*_ms``
and ``p{P}_*_ms`` for each chosen percentile (vLLM's ``--metric-percentiles``, default 99; ``p99.9``
keeps its decimal as vLLM writes it). TPOT is vLLM's ``(latency − ttft) / (output_len − 1)`` over
requests with more than one output token, as servesim's own. The simulator keeps inter-token
latencies run-length encoded, so ``std_itl_ms`` is null and the ITL entries are the summary's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from sim.report.summary import percentile_key

#: vLLM's default ``--metric-percentiles``.
VLLM_DEFAULT_PERCENTILES: tuple[float, ...] = (99.0,)


def _stats(name: str, values_s: np.ndarray, percentiles: Sequence[float]) -> dict[str, float]:
    values_ms = values_s[np.isfinite(values_s)] * 1e3
    if values_ms.size == 0:
        values_ms = np.zeros(1)  # vLLM's `np.mean(values or 0)`: zeros for an empty list
    out = {
        f"mean_{name}_ms": float(values_ms.mean()),
        f"median_{name}_ms": float(np.median(values_ms)),
        f"std_{name}_ms": float(values_ms.std()),
    }
    for p in percentiles:
        out[f"{percentile_key(p)}_{name}_ms"] = float(np.percentile(values_ms, p))
    return out


def vllm_bench_result(
    records: pd.DataFrame,
    *,
    itl: dict[str, float | None],
    goodput_requests_per_s: float | None,
    model_id: str,
    request_rate: float | None,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    percentiles: Sequence[float] = VLLM_DEFAULT_PERCENTILES,
    backend: str = "servesim",
) -> dict[str, Any]:
    """The result document ``vllm bench serve --save-result`` would have written for this run:
    ``records`` in the record schema, ``itl`` the summary's ITL distribution (in seconds, with
    the chosen percentiles), ``goodput_requests_per_s`` the summary's goodput."""
    ok = records[records["status"] == "ok"]
    start = float(records["arrival_s"].min()) if len(records) else 0.0
    finish = ok["finish_s"].to_numpy(dtype=np.float64)
    duration = float(np.nanmax(finish)) - start if finish.size else 0.0

    def per_s(count: float) -> float:
        return count / duration if duration > 0 else 0.0

    total_input = int(ok["prompt_tokens"].sum())
    total_output = int(ok["output_tokens"].sum())
    rate: float | str | None = request_rate
    if request_rate is not None and math.isinf(request_rate):
        rate = "inf"  # as vLLM writes an infinite rate
    result: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": backend,
        "backend": backend,
        "label": None,
        "model_id": model_id,
        "tokenizer_id": model_id,
        "num_prompts": len(records),
        "request_rate": rate,
        "burstiness": burstiness,
        "max_concurrency": max_concurrency,
        "duration": duration,
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": per_s(len(ok)),
        "request_goodput": goodput_requests_per_s,
        "output_throughput": per_s(total_output),
        "total_token_throughput": per_s(total_input + total_output),
    }
    result |= _stats("ttft", ok["ttft_s"].to_numpy(dtype=np.float64), percentiles)
    result |= _stats("tpot", ok["tpot_s"].to_numpy(dtype=np.float64), percentiles)

    def ms(key: str) -> float | None:
        value = itl.get(key)
        return None if value is None else value * 1e3

    result |= {"mean_itl_ms": ms("mean"), "median_itl_ms": ms("p50"), "std_itl_ms": None}
    for p in percentiles:
        result[f"{percentile_key(p)}_itl_ms"] = ms(percentile_key(p))
    result |= _stats("e2el", ok["e2e_s"].to_numpy(dtype=np.float64), percentiles)
    return result
