"""A live run end to end: the scenario's requests → replay against a server → the same outputs
as ``servesim run`` (records, summary.json), plus the server's own ``/metrics`` deltas.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import pandas as pd

from live.replay import ReplayOptions, ReplayResult, Target, replay
from live.scrape import MetricsDelta, MetricsSnapshot, metrics_delta, scrape
from live.tokens import PromptTokens
from sim.metrics import (
    SLO,
    PrefixCacheCounts,
    distribution,
    records_frame,
    summarize,
    token_times_frame,
)
from sim.request import Request
from sim.run import scenario_requests, write_outputs
from sim.scenario import Scenario


@dataclass
class LiveResult:
    """Records, summary and server-side metric deltas of one live run."""

    records: pd.DataFrame
    summary: dict[str, Any]
    metrics: MetricsDelta | None
    replay: ReplayResult
    token_times: bool = False  # write every token's time (scenario output.record_token_times)

    def write(self, out_dir: str | Path, fmt: Literal["parquet", "csv"] = "parquet") -> list[Path]:
        """records (and token_times), summary.json and metrics.json, like ``servesim run``."""
        tables = {"records": self.records}
        token_times = token_times_frame(self.replay.records) if self.token_times else None
        if token_times is not None:
            tables["token_times"] = token_times
        documents: dict[str, Any] = {"summary": self.summary}
        if self.metrics is not None:
            documents["metrics"] = self.metrics.as_dict()
        return write_outputs(out_dir, tables, documents, fmt)


def kv_capacity_tokens(snapshot: MetricsSnapshot) -> int:
    """KV capacity from vLLM's ``vllm:cache_config_info`` labels (0 when not exposed)."""
    for (name, labels), _ in snapshot.samples.items():
        if name.startswith("vllm:cache_config_info"):
            fields = dict(labels)
            try:
                return int(fields["num_gpu_blocks"]) * int(fields["block_size"])
            except (KeyError, ValueError):
                return 0
    return 0


def summarize_live(
    result: ReplayResult,
    slo: SLO,
    delta: MetricsDelta | None,
    kv_capacity: int = 0,
) -> dict[str, Any]:
    """The simulator's summary computed on live records, plus what only a live run knows."""
    frame = records_frame(result.records)
    prefix = PrefixCacheCounts(
        queries_tokens=int(delta.prefix_cache_queries) if delta else 0,
        hits_tokens=int(delta.prefix_cache_hits) if delta else 0,
    )
    summary = summarize(
        frame,
        itl_s=result.itl_s,
        slo=slo,
        prefix_cache=prefix,
        num_preemptions=int(delta.preemptions) if delta else 0,
        kv_capacity_tokens=kv_capacity,
        busy_s=None,
        wall_s=result.duration_s,
        simulated_s=result.duration_s,
        num_events=len(result.records),
    )
    summary["live"] = {
        "interrupted": result.interrupted,
        "reason": result.reason,
        "started_at_unix_s": result.started_at_unix_s,
        "load_generator_lag_s": distribution(result.lag_s),
        "server_ttft_mean_s": delta.ttft.mean if delta else None,
    }
    return summary


def run_live(
    scenario: Scenario,
    target: Target,
    tokens: PromptTokens,
    *,
    out_dir: Path,
    options: ReplayOptions | None = None,
    requests: list[Request] | None = None,
) -> LiveResult:
    """Replay the scenario's workload (the same requests ``servesim run`` simulates).

    ``/metrics`` is scraped after the warm-up and after the run; records stream to
    ``out_dir/records.jsonl`` as requests complete.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    requests = scenario_requests(scenario) if requests is None else requests
    if options is None:
        options = ReplayOptions(record_token_times=scenario.output.record_token_times)
    before: list[MetricsSnapshot] = []

    notes: list[str] = []

    def scrape_before() -> None:
        try:
            before.append(scrape(target.base_url))
        except (httpx.HTTPError, OSError) as exc:
            notes.append(f"/metrics not readable before the run: {exc}")

    records_path = out_dir / "records.jsonl"
    records_path.unlink(missing_ok=True)
    result = asyncio.run(
        replay(
            requests,
            target,
            tokens,
            records_path=records_path,
            options=options,
            after_warmup=scrape_before,
        )
    )
    delta: MetricsDelta | None = None
    capacity = 0
    try:
        after = scrape(target.base_url)
    except (httpx.HTTPError, OSError):  # a dead server must not cost the records
        after = None
    if after is None:
        notes.append("/metrics not readable after the run (server gone?)")
    if before and after is not None:
        try:
            delta = metrics_delta(before[0], after)
            capacity = kv_capacity_tokens(after)
        except ValueError as exc:  # counters went down: the server restarted mid-run
            notes.append(f"server metrics unusable: {exc}")
    slo = SLO(scenario.slo.ttft_s, scenario.slo.tpot_s, scenario.slo.percentile)
    summary = summarize_live(result, slo, delta, capacity)
    summary["live"].update(
        url=target.base_url, model=target.model, endpoint=target.endpoint, notes=notes
    )
    return LiveResult(
        records_frame(result.records), summary, delta, result, options.record_token_times
    )
