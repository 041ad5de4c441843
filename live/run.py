"""A live run end to end: the scenario's requests → replay against a server → the same outputs
as ``servesim run`` (records, summary.json), plus the server's own ``/metrics`` deltas.

Next to ``records.jsonl`` a run writes ``records.meta.json`` (digests of the scenario and of its
requests), so that resuming an interrupted run (:func:`read_resume`) can refuse records written
for another scenario. ``records.jsonl`` itself keeps its format: one record per line.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import httpx
import pandas as pd

from live.replay import (
    RecordsFile,
    RecordsFileError,
    ReplayOptions,
    ReplayResult,
    Target,
    read_records,
    replay,
    requests_digest,
)
from live.scrape import MetricsDelta, MetricsSnapshot, metrics_delta, scrape
from live.tokens import PromptTokens
from sim.engine.request import Request
from sim.files import DocumentError, read_document
from sim.report.summary import (
    PERCENTILES,
    SLO,
    PrefixCacheCounts,
    RunFacts,
    distribution,
    records_frame,
    summarize,
    token_times_frame,
    with_defaults,
)
from sim.run import scenario_requests, write_outputs
from sim.scenario import Scenario

#: The records a live run appends to as requests complete, and the file that says whose they are.
RECORDS_FILE = "records.jsonl"
RECORDS_META_FILE = "records.meta.json"
RECORDS_META_FORMAT = "servesim-live-records/1"


def scenario_digest(scenario: Scenario) -> str:
    """SHA-256 of the scenario's content (every field, key order ignored)."""
    text = json.dumps(scenario.model_dump(mode="json"), sort_keys=True, allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def records_meta(
    scenario: Scenario, requests: list[Request], prompt_salt: int = 0
) -> dict[str, Any]:
    """What ``records.meta.json`` holds: which scenario and requests the records belong to, and
    the salt of their prompts' token ids (see :class:`live.tokens.PromptTokens`)."""
    return {
        "format": RECORDS_META_FORMAT,
        "scenario": scenario.name,
        "scenario_sha256": scenario_digest(scenario),
        "requests_sha256": requests_digest(requests),
        "num_requests": len(requests),
        "prompt_salt": prompt_salt,
    }


def recorded_salt(out_dir: Path) -> int:
    """The prompt salt of the run in ``out_dir`` (0 for records from before salts existed): a
    resumed run sends its prompts again with it, so later turns hit what earlier ones cached."""
    try:
        meta = read_document(out_dir / RECORDS_META_FILE, format="json")
    except DocumentError:
        return 0
    salt = meta.get("prompt_salt", 0) if isinstance(meta, dict) else 0
    return salt if isinstance(salt, int) and salt >= 0 else 0


def read_resume(out_dir: Path, scenario: Scenario, requests: list[Request]) -> RecordsFile:
    """The records of an interrupted run in ``out_dir``, checked to be this scenario's.

    Raises :class:`RecordsFileError` (a one-line message) when ``records.jsonl`` or
    ``records.meta.json`` is missing or unreadable, when either belongs to another scenario or
    workload, or when a record is corrupt before the last line (see :func:`read_records`).
    """
    records_path = out_dir / RECORDS_FILE
    meta_path = out_dir / RECORDS_META_FILE
    if not records_path.is_file():
        raise RecordsFileError(f"no records file at {records_path}: nothing to resume")
    try:
        meta = read_document(meta_path, format="json")
    except DocumentError as exc:
        if exc.missing:
            raise RecordsFileError(
                f"{meta_path} is missing, so the records in {records_path} cannot be checked "
                "against the scenario (written by an older servesim?)"
            ) from None
        raise RecordsFileError(f"cannot read {meta_path}: {exc.problem}") from None
    expected = records_meta(scenario, requests)
    if not isinstance(meta, dict) or meta.get("format") != RECORDS_META_FORMAT:
        raise RecordsFileError(f"{meta_path}: not a {RECORDS_META_FORMAT} file")
    if meta.get("scenario_sha256") != expected["scenario_sha256"]:
        raise RecordsFileError(
            f"the records in {records_path} are from another scenario "
            f"({meta.get('scenario')!r}, digest {str(meta.get('scenario_sha256'))[:12]}; this "
            f"one {scenario.name!r}, digest {expected['scenario_sha256'][:12]})"
        )
    if meta.get("requests_sha256") != expected["requests_sha256"]:
        raise RecordsFileError(
            f"the records in {records_path} are from another workload: the scenario is the same "
            "but its requests differ (a trace file that changed?)"
        )
    return read_records(records_path, requests)


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
    percentiles: Sequence[float] = PERCENTILES,
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
        facts=RunFacts(
            prefix_cache=prefix,
            num_preemptions=int(delta.preemptions) if delta else 0,
            kv_capacity_tokens=kv_capacity,
            busy_s=None,
            wall_s=result.duration_s,
            simulated_s=result.duration_s,
            num_events=len(result.records),
        ),
        percentiles=percentiles,
    )
    summary["live"] = {
        "interrupted": result.interrupted,
        "reason": result.reason,
        "started_at_unix_s": result.started_at_unix_s,
        "load_generator_lag_s": distribution(result.lag_s),
        "server_ttft_mean_s": delta.ttft.mean if delta else None,
        # A resumed run reuses earlier records: only `sent` requests ran under this run's load.
        "resume": {
            "resumed": result.resumed,
            "reused": result.num_reused,
            "sent": result.num_sent,
        },
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
    resume_from: RecordsFile | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> LiveResult:
    """Replay the scenario's workload (the same requests ``servesim run`` simulates).

    ``/metrics`` is scraped after the warm-up and after the run; records stream to
    ``out_dir/records.jsonl`` as requests complete. A fresh run replaces any records file in
    ``out_dir`` and writes ``records.meta.json``; ``resume_from`` (from :func:`read_resume`)
    resumes the interrupted run whose records are there instead: ``ok`` and ``rejected`` records
    are kept and the rest sent again (see :func:`live.replay.replay`). The server's ``/metrics``
    deltas then cover the resumed part only. ``progress(done, total)`` follows the requests
    as they end.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    requests = scenario_requests(scenario) if requests is None else requests
    if options is None:
        options = ReplayOptions(record_token_times=scenario.output.record_token_times)
    if options.max_concurrency is None and scenario.workload.max_concurrency is not None:
        # The scenario's closed loop, replayed as the simulator runs it.
        options = replace(
            options,
            max_concurrency=scenario.workload.max_concurrency,
            think_time_s=scenario.workload.think_time_s,
        )
    before: list[MetricsSnapshot] = []

    notes: list[str] = []

    def scrape_before() -> None:
        try:
            before.append(scrape(target.base_url))
        # ValueError: a 200 that is not Prometheus text (a server other than vLLM).
        except (httpx.HTTPError, OSError, ValueError) as exc:
            notes.append(f"/metrics not readable before the run: {exc}")

    records_path = out_dir / RECORDS_FILE
    if resume_from is None:
        records_path.unlink(missing_ok=True)
        meta = json.dumps(records_meta(scenario, requests, tokens.salt), indent=2)
        (out_dir / RECORDS_META_FILE).write_text(meta + "\n", encoding="utf-8")
    elif resume_from.note:
        notes.append(resume_from.note)
    result = asyncio.run(
        replay(
            requests,
            target,
            tokens,
            records_path=records_path,
            options=options,
            after_warmup=scrape_before,
            resume_from=resume_from,
            progress=progress,
        )
    )
    delta: MetricsDelta | None = None
    capacity = 0
    try:
        after = scrape(target.base_url)
    except (httpx.HTTPError, OSError, ValueError):  # a dead server must not cost the records
        after = None
    if after is None:
        notes.append("/metrics not readable after the run (server gone?)")
    if before and after is not None:
        try:
            delta = metrics_delta(before[0], after)
            capacity = kv_capacity_tokens(after)
        except ValueError as exc:  # counters went down: the server restarted mid-run
            notes.append(f"server metrics unusable: {exc}")
    slo = scenario.slo.target()
    summary = summarize_live(
        result, slo, delta, capacity, with_defaults(scenario.output.percentiles)
    )
    # One server: the GPUs of one replica of the scenario's engine.
    gpus = scenario.engine.tensor_parallel_size * scenario.engine.pipeline_parallel_size
    rate = summary["throughput"]["output_tokens_per_s"]
    summary["throughput"]["output_tokens_per_s_per_gpu"] = (
        rate / gpus if rate is not None and math.isfinite(rate) else None
    )
    summary["live"].update(
        url=target.base_url,
        model=target.model,
        endpoint=target.endpoint,
        notes=notes,
        prompt_salt=tokens.salt,
    )
    return LiveResult(
        records_frame(result.records), summary, delta, result, options.record_token_times
    )
