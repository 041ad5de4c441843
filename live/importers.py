"""Import other benchmark tools' per-request results into the shared record schema.

Two client-side formats are read, each checked against the source that writes it:

* ``vllm_bench``: the JSON that ``vllm bench serve --save-result --save-detailed`` writes
  (vLLM 0.32, ``vllm/benchmarks/serve.py``: ``benchmark()`` builds the per-request arrays
  ``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``latencies``, ``start_times``,
  ``queue_times``, ``errors``; ``main_async()`` adds ``date``, ``backend``, ``model_id`` …).
  Every time in it is a ``time.perf_counter()`` reading of the client
  (``vllm/benchmarks/lib/endpoint_request_func.py``). A file written with ``--append-result``
  holds one such object per line.
* ``guidellm``: a GuideLLM ``benchmarks.json`` report, the ``model_dump(mode="json")`` of
  ``GenerativeBenchmarksReport``. Read from the wheels of guidellm 0.8.1 (report schema version
  2: each request has ``info.timings.request_start`` / ``first_token_iteration`` /
  ``last_token_iteration`` / ``request_end``, ``guidellm/schemas/base/info.py`` and
  ``request_stats.py``) and guidellm 0.3.1 (flat ``start_time`` / ``first_token_time`` /
  ``last_token_time`` / ``end_time``, ``guidellm/benchmark/benchmark.py``).

Both tools measure at the client, so what the server did inside is not observable:
``scheduled_s`` (and with it ``queue_s``) is NaN, ``replica_id`` is -1 and ``num_preemptions``
is 0. ``arrival_s`` is when the client sent the request, relative to the first request sent.
TTFT, TPOT and end-to-end latency come from :func:`sim.engine.request.latency_metrics` through
:meth:`sim.engine.request.Record.as_row`, so an imported run is judged exactly like a simulated one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import pandas as pd

from sim.engine.request import Record, RequestStatus
from sim.report.summary import records_frame

ImportFormat = Literal["auto", "vllm_bench", "guidellm"]

_T = TypeVar("_T")

# Per-request arrays of a detailed `vllm bench serve` result; all have one entry per request.
_VLLM_REQUIRED_ARRAYS = ("input_lens", "output_lens", "ttfts", "itls", "errors")
_VLLM_OPTIONAL_ARRAYS = ("latencies", "start_times", "queue_times", "generated_texts")

# GuideLLM's status groups and what they mean here. "incomplete" requests were still in flight
# when the benchmark ended and GuideLLM cancelled them.
_GUIDELLM_STATUSES: tuple[tuple[str, RequestStatus], ...] = (
    ("successful", RequestStatus.OK),
    ("errored", RequestStatus.ERROR),
    ("incomplete", RequestStatus.CANCELLED),
)


class BenchmarkImportError(ValueError):
    """A benchmark result file that cannot be imported; the message names the file and the
    field (or line) at fault."""


@dataclass(frozen=True)
class ImportedRun:
    """One benchmark run read from a file, in the record schema shared by sim/ and live/.

    ``records`` has exactly :data:`sim.engine.request.RECORD_COLUMNS`, one row per request.
    ``itl_s`` holds every inter-token latency of the completed requests, flattened, when the
    file records them (vLLM does; GuideLLM does not, and then it is empty and
    ``metadata["itl_known"]`` is False). ``metadata`` carries what the file says about the run
    (model, backend, request rate, concurrency, date, duration, number of prompts …) and how
    the import filled what the file lacks.
    """

    format: str
    path: str
    records: pd.DataFrame
    itl_s: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)


def import_records(
    path: str | Path,
    format: ImportFormat = "auto",
    *,
    benchmark_index: int | None = None,
) -> ImportedRun:
    """Read a ``vllm bench serve`` detailed result or a GuideLLM report into records.

    ``format="auto"`` decides by the top-level keys: per-request arrays such as ``ttfts`` mean
    vLLM, a ``benchmarks`` list means GuideLLM. A file that holds several runs (a GuideLLM sweep,
    or a vLLM file written with ``--append-result``) needs ``benchmark_index`` to pick one; a
    file with one run needs none.

    Raises :class:`BenchmarkImportError` for a file that is not valid JSON (with the line and
    column where reading stopped, as in a truncated file), of an unknown shape, without
    per-request results, or with a field of the wrong type or length.
    """
    path = Path(path)
    if format not in ("auto", "vllm_bench", "guidellm"):
        raise BenchmarkImportError(
            f"{path}: unknown format {format!r}; use 'auto', 'vllm_bench' or 'guidellm'"
        )
    documents = _read_json_documents(path)
    if format == "auto":
        format = _detect_format(documents[0], path)
    match format:
        case "vllm_bench":
            index = _choose_index(len(documents), benchmark_index, path, "results (lines)")
            return _import_vllm_bench(documents[index], path, index, len(documents))
        case "guidellm":
            if len(documents) != 1:
                raise BenchmarkImportError(
                    f"{path}: a GuideLLM report is one JSON object, but the file holds "
                    f"{len(documents)} (one per line)"
                )
            return _import_guidellm(documents[0], path, benchmark_index)
        case _:
            raise AssertionError(format)


# --- reading and detection -----------------------------------------------------------------


def _read_json_documents(path: Path) -> list[dict[str, Any]]:
    """The JSON objects in the file: one, or one per line (``--append-result``)."""
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise BenchmarkImportError(f"{path}: the file is empty")
    try:
        return [_require_object(json.loads(text), path, "the top level")]
    except json.JSONDecodeError as error:
        if error.msg != "Extra data":
            raise _json_error(path, text, error, line_offset=0) from None
    # Several JSON values: accept JSON lines, one object per non-empty line.
    documents = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise _json_error(path, line, error, line_offset=line_number - 1) from None
        documents.append(_require_object(value, path, f"line {line_number}"))
    return documents


def _json_error(
    path: Path, text: str, error: json.JSONDecodeError, line_offset: int
) -> BenchmarkImportError:
    truncated = error.pos >= len(text.rstrip())
    hint = "; the file ends early (truncated?)" if truncated else ""
    return BenchmarkImportError(
        f"{path}: not valid JSON at line {error.lineno + line_offset}, column {error.colno} "
        f"(character {error.pos}): {error.msg}{hint}"
    )


def _require_object(value: object, path: Path, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BenchmarkImportError(
            f"{path}: {where} must be a JSON object, got {type(value).__name__}"
        )
    return value


def _detect_format(document: dict[str, Any], path: Path) -> Literal["vllm_bench", "guidellm"]:
    if isinstance(document.get("benchmarks"), list):
        return "guidellm"
    vllm_keys = {"ttfts", "input_lens", "itls", "output_lens"}
    summary_keys = {"backend", "duration", "completed", "request_throughput"}
    if vllm_keys & document.keys() or summary_keys <= document.keys():
        return "vllm_bench"
    keys = ", ".join(sorted(document)[:12]) or "none"
    raise BenchmarkImportError(
        f"{path}: unknown benchmark result shape (top-level keys: {keys}); expected a "
        "`vllm bench serve --save-detailed` result (keys such as 'ttfts', 'itls', 'input_lens') "
        "or a GuideLLM report (a 'benchmarks' list)"
    )


def _choose_index(count: int, requested: int | None, path: Path, what: str) -> int:
    if requested is None:
        if count != 1:
            raise BenchmarkImportError(
                f"{path}: the file holds {count} {what}; pass benchmark_index=0…{count - 1}"
            )
        return 0
    if not 0 <= requested < count:
        raise BenchmarkImportError(
            f"{path}: benchmark_index={requested} is out of range; the file holds {count} {what}"
        )
    return requested


# --- vLLM `bench serve` ----------------------------------------------------------------------


def _import_vllm_bench(
    document: dict[str, Any], path: Path, index: int, num_documents: int
) -> ImportedRun:
    """Records from one detailed ``vllm bench serve`` result.

    A request succeeded when its ``errors`` entry is empty and it produced output (vLLM writes
    ``output_lens`` 0 for a failed request, whose ``ttfts``/``latencies`` are unset zeros, so
    its timestamps are NaN here). The first token arrives ``ttfts[i]`` after the request was
    sent and the last ``latencies[i]`` after it (``ttfts[i] + sum(itls[i])`` in files without
    ``latencies``), which makes TPOT vLLM's own ``(latency − ttft) / (output_len − 1)``.
    """
    if "ttfts" not in document and "latencies" in document and "input_lens" in document:
        raise BenchmarkImportError(
            f"{path}: field 'ttfts' is missing: this is a pooling/embedding benchmark, which has "
            "no token timings to import"
        )
    for name in _VLLM_REQUIRED_ARRAYS:
        if name not in document:
            raise BenchmarkImportError(
                f"{path}: field {name!r} is missing: the file has no per-request results; "
                "rerun `vllm bench serve` with --save-result --save-detailed"
            )
    arrays = {
        name: document[name]
        for name in (*_VLLM_REQUIRED_ARRAYS, *_VLLM_OPTIONAL_ARRAYS)
        if document.get(name) is not None
    }
    for name, values in arrays.items():
        if not isinstance(values, list):
            raise BenchmarkImportError(
                f"{path}: field {name!r} must be a list, got {type(values).__name__}"
            )
    lengths = {name: len(values) for name, values in arrays.items()}
    if len(set(lengths.values())) > 1:
        described = ", ".join(f"{name!r} has {length}" for name, length in lengths.items())
        raise BenchmarkImportError(
            f"{path}: per-request fields differ in length ({described}); each needs one entry "
            "per request"
        )
    num_requests = lengths["ttfts"]
    if num_requests == 0:
        raise BenchmarkImportError(f"{path}: field 'ttfts' is empty: the file has no requests")

    def item(name: str, i: int) -> Any:
        return arrays[name][i]

    def where(name: str, i: int) -> str:
        return f"field {name!r}[{i}]"

    start_times = (
        [
            _number(item("start_times", i), path, where("start_times", i))
            for i in range(num_requests)
        ]
        if "start_times" in arrays
        else None
    )
    origin = min(start_times) if start_times else 0.0
    records: list[Record] = []
    itls_ok: list[float] = []
    for i in range(num_requests):
        prompt_tokens = _count(item("input_lens", i), path, where("input_lens", i))
        output_tokens = _count(item("output_lens", i), path, where("output_lens", i))
        error = item("errors", i)
        if error is None:
            error = ""
        if not isinstance(error, str):
            raise BenchmarkImportError(
                f"{path}: {where('errors', i)} must be a string, got {type(error).__name__}"
            )
        ttft = _number(item("ttfts", i), path, where("ttfts", i))
        itls = _numbers(item("itls", i), path, where("itls", i))
        arrival = start_times[i] - origin if start_times is not None else 0.0
        ok = error == "" and output_tokens > 0
        if not ok:
            records.append(
                Record(
                    request_id=i,
                    arrival_s=arrival,
                    prompt_tokens=prompt_tokens,
                    output_tokens=output_tokens,
                    status=RequestStatus.ERROR,
                    error=error or "failed without an error message (output_lens is 0)",
                )
            )
            continue
        if "latencies" in arrays:
            latency = _number(item("latencies", i), path, where("latencies", i))
        else:
            latency = ttft + math.fsum(itls)
        itls_ok.extend(itls)
        records.append(
            Record(
                request_id=i,
                arrival_s=arrival,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                first_token_s=arrival + ttft,
                finish_s=arrival + latency,
                status=RequestStatus.OK,
            )
        )

    metadata: dict[str, Any] = {
        key: value for key, value in document.items() if not isinstance(value, list | dict)
    }
    if metadata.get("request_rate") == "inf":
        metadata["request_rate"] = math.inf
    metadata.update(
        model=document.get("model_id"),
        result_index=index,
        num_results_in_file=num_documents,
        num_requests=num_requests,
        arrival_known=start_times is not None,
        # Send times are the client's perf_counter readings: only differences mean anything.
        arrival_source=(
            "start_times (client send time, relative to the first request sent)"
            if start_times is not None
            else "absent from the file: every arrival_s is 0"
        ),
        finish_source="latencies" if "latencies" in arrays else "ttfts + sum(itls)",
        itl_known=True,
    )
    if "queue_times" in arrays:
        # Time a request waited for the client's --max-concurrency semaphore before being sent.
        metadata["client_queue_s"] = [
            _number(item("queue_times", i), path, where("queue_times", i))
            for i in range(num_requests)
        ]
    return ImportedRun(
        format="vllm_bench",
        path=str(path),
        records=records_frame(records),
        itl_s=np.asarray(itls_ok, dtype=np.float64),
        metadata=metadata,
    )


# --- GuideLLM -------------------------------------------------------------------------------


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


def _import_guidellm(
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
    """
    benchmarks = document["benchmarks"]
    if not benchmarks:
        raise BenchmarkImportError(f"{path}: field 'benchmarks' is empty: no benchmark to import")
    index = _choose_index(len(benchmarks), benchmark_index, path, "benchmarks")
    prefix = f"benchmarks[{index}]"
    benchmark = _require_object(benchmarks[index], path, prefix)
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
            request = _guidellm_request(_require_object(entry, path, where), path, where)
            if status is RequestStatus.OK:
                _check_complete(request, path, where)
            parsed.append((request, status))
    if not parsed:
        raise BenchmarkImportError(f"{path}: field '{prefix}.requests' holds no requests")

    starts = [r.start for r, _ in parsed if r.start is not None]
    origin = min(starts) if starts else math.nan
    # Arrival order; requests that never started (no start time) go last.
    parsed.sort(key=lambda pair: (pair[0].start is None, pair[0].start or 0.0))

    def relative(time_s: float | None) -> float:
        return time_s - origin if time_s is not None else math.nan

    records = []
    for request_id, (request, status) in enumerate(parsed):
        if status is RequestStatus.OK:
            finish = request.last_token if request.last_token is not None else request.end
            error = ""
        else:
            finish = request.end
            error = request.error or (
                "errored"
                if status is RequestStatus.ERROR
                else "incomplete when the benchmark ended"
            )
        records.append(
            Record(
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
        )
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


def _guidellm_request(entry: dict[str, Any], path: Path, where: str) -> _GuideLLMRequest:
    """Times and token counts of one request, from either report schema."""
    number = _optional_reader(_number, path, where)
    count = _optional_reader(_count, path, where)
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


# --- field readers ----------------------------------------------------------------------------


def _number(value: object, path: Path, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BenchmarkImportError(f"{path}: {where} must be a number, got {value!r}")
    return float(value)


def _numbers(value: object, path: Path, where: str) -> list[float]:
    if not isinstance(value, list):
        raise BenchmarkImportError(f"{path}: {where} must be a list of numbers, got {value!r}")
    return [_number(v, path, f"{where}[{k}]") for k, v in enumerate(value)]


def _count(value: object, path: Path, where: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BenchmarkImportError(f"{path}: {where} must be a non-negative integer, got {value!r}")
    return value


def _optional_reader(
    read: Callable[[object, Path, str], _T], path: Path, where: str
) -> Callable[[dict[str, Any], str, str], _T | None]:
    """A reader of ``mapping[key]`` that gives None for a missing or null entry."""

    def read_optional(mapping: dict[str, Any], key: str, parent: str) -> _T | None:
        value = mapping.get(key)
        if value is None:
            return None
        dotted = ".".join(part for part in (where, parent, key) if part)
        return read(value, path, f"field {dotted!r}")

    return read_optional


__all__: Sequence[str] = ["BenchmarkImportError", "ImportedRun", "import_records"]
