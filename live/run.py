"""A live run end to end: the scenario's requests → replay against a server → the same outputs
as ``servesim run`` (records, summary.json), plus the server's own ``/metrics`` deltas.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pandas as pd

from live.replay import ReplayOptions, ReplayResult, Target, replay
from live.scrape import MetricsDelta, MetricsSnapshot, metrics_delta, scrape
from live.tokens import PromptTokens
from sim.metrics import SLO, PrefixCacheCounts, distribution, records_frame, summarize
from sim.request import Request
from sim.run import scenario_requests
from sim.scenario import Scenario


@dataclass
class LiveResult:
    """Records, summary and server-side metric deltas of one live run."""

    records: pd.DataFrame
    summary: dict[str, Any]
    metrics: MetricsDelta | None
    replay: ReplayResult

    def write(self, out_dir: str | Path, fmt: str = "parquet") -> list[Path]:
        """records.{parquet,csv}, summary.json and metrics.json, like ``servesim run --out``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        path = out / f"records.{fmt}"
        if fmt == "parquet":
            self.records.to_parquet(path, index=False)
        else:
            self.records.to_csv(path, index=False)
        written.append(path)
        path = out / "summary.json"
        path.write_text(json.dumps(self.summary, indent=2) + "\n", encoding="utf-8")
        written.append(path)
        if self.metrics is not None:
            path = out / "metrics.json"
            path.write_text(json.dumps(self.metrics.as_dict(), indent=2) + "\n", encoding="utf-8")
            written.append(path)
        return written


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
    before: list[MetricsSnapshot] = []

    def scrape_before() -> None:
        before.append(scrape(target.base_url))

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
    if before and after is not None:
        delta = metrics_delta(before[0], after)
        capacity = kv_capacity_tokens(after)
    slo = SLO(scenario.slo.ttft_s, scenario.slo.tpot_s, scenario.slo.percentile)
    summary = summarize_live(result, slo, delta, capacity)
    return LiveResult(records_frame(result.records), summary, delta, result)
