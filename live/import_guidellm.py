"""Import one benchmark of a GuideLLM ``benchmarks.json`` report.

The report is the ``model_dump(mode="json")`` of ``GenerativeBenchmarksReport``. Read from the
wheels of guidellm 0.8.1 (report schema version 2: each request has ``info.timings.request_start``
/ ``first_token_iteration`` / ``last_token_iteration`` / ``request_end``,
``guidellm/schemas/base/info.py`` and ``request_stats.py``) and guidellm 0.3.1 (flat
``start_time`` / ``first_token_time`` / ``last_token_time`` / ``end_time``,
``guidellm/benchmark/benchmark.py``).

:func:`live.importers.import_records` recognises the report and calls :func:`import_guidellm`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from live.import_fields import (
    BenchmarkImportError,
    ImportedRun,
    choose_index,
    optional_reader,
    read_count,
    read_number,
    require_object,
)
from sim.engine.request import Record, RequestStatus
from sim.report.summary import records_frame

# GuideLLM's status groups and what they mean here. "incomplete" requests were still in flight
# when the benchmark ended and GuideLLM cancelled them.
_GUIDELLM_STATUSES: tuple[tuple[str, RequestStatus], ...] = (
    ("successful", RequestStatus.OK),
    ("errored", RequestStatus.ERROR),
    ("incomplete", RequestStatus.CANCELLED),
)


@dataclass(frozen=True, slots=True)
class _GuideLLMRequest:
    """One request of a GuideLLM report, times in Unix seconds (None when not recorded)."""

    source_id: str
    start: float | None
    first_token: float | None
    last_token: float | None
    end: float | None
    prompt_tokens: int | None
    output_tokens: int | None
    cached_tokens: int
    error: str


def import_guidellm(
    document: dict[str, Any], path: Path, benchmark_index: int | None
) -> ImportedRun:
    """Records from one benchmark of a GuideLLM report.

    ``successful`` requests are ok, ``errored`` ones errors and ``incomplete`` ones (still in
    flight when the benchmark stopped) cancelled. A request arrives when the backend started
    it (``request_start``), relative to the first request of the benchmark; it finishes with
    its last token (``last_token_iteration``; ``request_end`` when there is none), so TPOT is
    GuideLLM's own inter-token latency ``(last − first) / (output_tokens − 1)``. Request ids
    are positions in arrival order; GuideLLM's own ids are in ``metadata["request_ids"]``.
    GuideLLM keeps no per-token times, so ``itl_s`` is empty.

    ``benchmark_index`` picks one benchmark of a sweep (None: the report must hold one).
    Raises :class:`~live.import_fields.BenchmarkImportError` for a report without benchmarks
    or requests, a request of neither schema, or a successful request without its times.
    """
    benchmarks = document["benchmarks"]
    if not benchmarks:
        raise BenchmarkImportError(f"{path}: field 'benchmarks' is empty: no benchmark to import")
    index = choose_index(len(benchmarks), benchmark_index, path, "benchmarks")
    prefix = f"benchmarks[{index}]"
    benchmark = require_object(benchmarks[index], path, prefix)
    parsed = _parse_requests(benchmark, path, prefix)
    starts = [r.start for r, _ in parsed if r.start is not None]
    origin = min(starts) if starts else math.nan
    # Arrival order; requests that never started (no start time) go last.
    parsed.sort(key=lambda pair: (pair[0].start is None, pair[0].start or 0.0))
    records = [
        _record(request_id, request, status, origin)
        for request_id, (request, status) in enumerate(parsed)
    ]
    metadata = _guidellm_metadata(document, benchmark, index, len(benchmarks))
    metadata.update(
        num_requests=len(records),
        request_ids=[request.source_id for request, _ in parsed],
        time_origin_unix_s=origin,
        arrival_known=True,
        arrival_source="request_start (client send time, relative to the first request)",
        itl_known=False,
    )
    return ImportedRun(
        format="guidellm",
        path=str(path),
        records=records_frame(records),
        itl_s=np.zeros(0, dtype=np.float64),
        metadata=metadata,
    )


def _parse_requests(
    benchmark: dict[str, Any], path: Path, prefix: str
) -> list[tuple[_GuideLLMRequest, RequestStatus]]:
    """Every request of the benchmark with its status, in report order (at least one)."""
    groups = benchmark.get("requests")
    if not isinstance(groups, dict):
        raise BenchmarkImportError(
            f"{path}: field '{prefix}.requests' is missing or not an object: the report has no "
            "per-request results"
        )
    parsed: list[tuple[_GuideLLMRequest, RequestStatus]] = []
    for group, status in _GUIDELLM_STATUSES:
        entries = groups.get(group) or []
        if not isinstance(entries, list):
            raise BenchmarkImportError(
                f"{path}: field '{prefix}.requests.{group}' must be a list, "
                f"got {type(entries).__name__}"
            )
        for j, entry in enumerate(entries):
            where = f"{prefix}.requests.{group}[{j}]"
            request = _guidellm_request(require_object(entry, path, where), path, where)
            if status is RequestStatus.OK:
                _check_complete(request, path, where)
            parsed.append((request, status))
    if not parsed:
        raise BenchmarkImportError(f"{path}: field '{prefix}.requests' holds no requests")
    return parsed


def _record(
    request_id: int, request: _GuideLLMRequest, status: RequestStatus, origin: float
) -> Record:
    """One request as a record, its times relative to ``origin`` (NaN where not recorded)."""

    def relative(time_s: float | None) -> float:
        return time_s - origin if time_s is not None else math.nan

    if status is RequestStatus.OK:
        finish = request.last_token if request.last_token is not None else request.end
        error = ""
    else:
        finish = request.end
        error = request.error or (
            "errored" if status is RequestStatus.ERROR else "incomplete when the benchmark ended"
        )
    return Record(
        request_id=request_id,
        arrival_s=relative(request.start),
        prompt_tokens=request.prompt_tokens or 0,
        output_tokens=request.output_tokens or 0,
        first_token_s=relative(request.first_token),
        finish_s=relative(finish),
        cached_tokens=request.cached_tokens,
        status=status,
        error=error,
    )


def _guidellm_request(entry: dict[str, Any], path: Path, where: str) -> _GuideLLMRequest:
    """Times and token counts of one request, from either report schema."""
    number = optional_reader(read_number, path, where)
    count = optional_reader(read_count, path, where)
    if isinstance(entry.get("info"), dict):
        # guidellm >= 0.4 (report schema version 2): timings live in info.timings.
        info = entry["info"]
        timings = info.get("timings")
        if not isinstance(timings, dict):
            raise BenchmarkImportError(f"{path}: field '{where}.info.timings' is missing")
        input_metrics = entry.get("input_metrics") or {}
        output_metrics = entry.get("output_metrics") or {}
        start = number(timings, "request_start", "info.timings")
        if start is None:
            start = number(timings, "resolve_start", "info.timings")
        end = number(timings, "request_end", "info.timings")
        if end is None:
            end = number(timings, "resolve_end", "info.timings")
        prompt_tokens = count(entry, "prompt_tokens", "")
        if prompt_tokens is None:
            prompt_tokens = count(input_metrics, "text_tokens", "input_metrics")
        output_tokens = count(entry, "output_tokens", "")
        if output_tokens is None:
            output_tokens = count(output_metrics, "text_tokens", "output_metrics")
        return _GuideLLMRequest(
            source_id=str(entry.get("request_id", info.get("request_id", ""))),
            start=start,
            first_token=number(timings, "first_token_iteration", "info.timings"),
            last_token=number(timings, "last_token_iteration", "info.timings"),
            end=end,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            cached_tokens=count(input_metrics, "cached_tokens", "input_metrics") or 0,
            error=str(info.get("error") or ""),
        )
    if "start_time" in entry:
        # guidellm 0.3: flat per-request fields.
        return _GuideLLMRequest(
            source_id=str(entry.get("request_id", "")),
            start=number(entry, "start_time", ""),
            first_token=number(entry, "first_token_time", ""),
            last_token=number(entry, "last_token_time", ""),
            end=number(entry, "end_time", ""),
            prompt_tokens=count(entry, "prompt_tokens", ""),
            output_tokens=count(entry, "output_tokens", ""),
            cached_tokens=0,
            error=str(entry.get("error") or ""),
        )
    raise BenchmarkImportError(
        f"{path}: field '{where}' has neither 'info.timings' (guidellm >= 0.4) nor 'start_time' "
        "(guidellm 0.3): not a GuideLLM request"
    )


def _check_complete(request: _GuideLLMRequest, path: Path, where: str) -> None:
    """A successful request needs a start, a first token, an end and token counts."""
    missing = [
        name
        for name, value in (
            ("start", request.start),
            ("first token time", request.first_token),
            ("prompt_tokens", request.prompt_tokens),
            ("output_tokens", request.output_tokens),
        )
        if value is None
    ]
    if request.last_token is None and request.end is None:
        missing.append("last token or end time")
    if missing:
        raise BenchmarkImportError(
            f"{path}: field '{where}' is a successful request without {', '.join(missing)}"
        )


def _guidellm_metadata(
    document: dict[str, Any], benchmark: dict[str, Any], index: int, num_benchmarks: int
) -> dict[str, Any]:
    """What the report says about the run, from either schema (missing entries are None)."""
    report_metadata = document.get("metadata") or {}
    config = benchmark.get("config") or benchmark.get("args") or {}
    strategy = config.get("strategy") or {}
    backend = config.get("backend") or {}
    worker = benchmark.get("worker") or {}
    start = benchmark.get("start_time")
    end = benchmark.get("end_time")
    duration = benchmark.get("duration")
    if duration is None and isinstance(start, int | float) and isinstance(end, int | float):
        duration = end - start
    totals = (benchmark.get("metrics") or {}).get("request_totals") or benchmark.get(
        "request_totals"
    )
    return {
        "model": backend.get("model") or worker.get("backend_model"),
        "target": backend.get("target") or worker.get("backend_target"),
        "backend": backend.get("type_") or backend.get("kind") or worker.get("backend_type"),
        "strategy": strategy.get("type_"),
        "request_rate": strategy.get("rate"),
        "max_concurrency": strategy.get("max_concurrency") or strategy.get("streams"),
        "strategy_config": strategy,
        "start_time_unix_s": start,
        "duration": duration,
        "request_totals": totals,
        "guidellm_version": report_metadata.get("guidellm_version"),
        "report_schema_version": report_metadata.get("version", 1),
        "benchmark_index": index,
        "num_benchmarks": num_benchmarks,
    }
