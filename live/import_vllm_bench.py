"""Import the per-request results of ``vllm bench serve --save-result --save-detailed``.

Checked against vLLM 0.32, ``vllm/benchmarks/serve.py``: ``benchmark()`` builds the per-request
arrays ``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``latencies``, ``start_times``,
``queue_times``, ``errors``; ``main_async()`` adds ``date``, ``backend``, ``model_id`` … Every
time in the file is a ``time.perf_counter()`` reading of the client
(``vllm/benchmarks/lib/endpoint_request_func.py``), so only differences mean anything.

:func:`live.importers.import_records` picks the result (one per line of a file written with
``--append-result``) and calls :func:`import_vllm_bench`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from live.import_fields import (
    BenchmarkImportError,
    ImportedRun,
    read_count,
    read_number,
    read_numbers,
)
from sim.engine.request import Record, RequestStatus
from sim.report.summary import records_frame

_T = TypeVar("_T")

# Per-request arrays of a detailed `vllm bench serve` result; all have one entry per request.
_VLLM_REQUIRED_ARRAYS = ("input_lens", "output_lens", "ttfts", "itls", "errors")
_VLLM_OPTIONAL_ARRAYS = ("latencies", "start_times", "queue_times", "generated_texts")

_Arrays = dict[str, list[Any]]


def import_vllm_bench(
    document: dict[str, Any], path: Path, index: int, num_documents: int
) -> ImportedRun:
    """Records from one detailed ``vllm bench serve`` result (``index`` of ``num_documents``).

    A request succeeded when its ``errors`` entry is empty and it produced output (vLLM writes
    ``output_lens`` 0 for a failed request, whose ``ttfts``/``latencies`` are unset zeros, so
    its timestamps are NaN here). The first token arrives ``ttfts[i]`` after the request was
    sent and the last ``latencies[i]`` after it (``ttfts[i] + sum(itls[i])`` in files without
    ``latencies``), which makes TPOT vLLM's own ``(latency − ttft) / (output_len − 1)``.
    ``arrival_s`` is ``start_times[i]`` relative to the first request sent (0 for every
    request in files without ``start_times``).

    Raises :class:`~live.import_fields.BenchmarkImportError` for a file without per-request
    results (a summary-only or pooling benchmark), arrays of different lengths or none, and any
    entry of the wrong type.
    """
    arrays = _per_request_arrays(document, path)
    num_requests = len(arrays["ttfts"])
    start_times = _column(arrays, "start_times", read_number, path)
    origin = min(start_times) if start_times else 0.0
    records: list[Record] = []
    itls_ok: list[float] = []
    for i in range(num_requests):
        arrival = start_times[i] - origin if start_times is not None else 0.0
        record, itls = _record(arrays, i, arrival, path)
        records.append(record)
        if record.status is RequestStatus.OK:
            itls_ok.extend(itls)
    return ImportedRun(
        format="vllm_bench",
        path=str(path),
        records=records_frame(records),
        itl_s=np.asarray(itls_ok, dtype=np.float64),
        metadata=_metadata(document, arrays, path, index, num_documents, start_times is not None),
    )


def _per_request_arrays(document: dict[str, Any], path: Path) -> _Arrays:
    """The per-request lists of the result, checked to be lists of one common, non-zero length."""
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
    if lengths["ttfts"] == 0:
        raise BenchmarkImportError(f"{path}: field 'ttfts' is empty: the file has no requests")
    return arrays


def _entry(
    arrays: _Arrays, name: str, i: int, read: Callable[[object, Path, str], _T], path: Path
) -> _T:
    """Entry ``i`` of array ``name``, read with ``read`` (errors name ``field 'name'[i]``)."""
    return read(arrays[name][i], path, f"field {name!r}[{i}]")


def _column(
    arrays: _Arrays, name: str, read: Callable[[object, Path, str], _T], path: Path
) -> list[_T] | None:
    """Every entry of the optional array ``name``, or None when the file lacks it."""
    if name not in arrays:
        return None
    return [_entry(arrays, name, i, read, path) for i in range(len(arrays[name]))]


def _record(arrays: _Arrays, i: int, arrival: float, path: Path) -> tuple[Record, list[float]]:
    """Request ``i`` as a record, with its inter-token latencies."""
    prompt_tokens = _entry(arrays, "input_lens", i, read_count, path)
    output_tokens = _entry(arrays, "output_lens", i, read_count, path)
    error = arrays["errors"][i]
    if error is None:
        error = ""
    if not isinstance(error, str):
        raise BenchmarkImportError(
            f"{path}: field 'errors'[{i}] must be a string, got {type(error).__name__}"
        )
    ttft = _entry(arrays, "ttfts", i, read_number, path)
    itls = _entry(arrays, "itls", i, read_numbers, path)
    if error != "" or output_tokens == 0:
        failed = Record(
            request_id=i,
            arrival_s=arrival,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            status=RequestStatus.ERROR,
            error=error or "failed without an error message (output_lens is 0)",
        )
        return failed, itls
    if "latencies" in arrays:
        latency = _entry(arrays, "latencies", i, read_number, path)
    else:
        latency = ttft + math.fsum(itls)
    completed = Record(
        request_id=i,
        arrival_s=arrival,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        first_token_s=arrival + ttft,
        finish_s=arrival + latency,
        status=RequestStatus.OK,
    )
    return completed, itls


def _metadata(
    document: dict[str, Any],
    arrays: _Arrays,
    path: Path,
    index: int,
    num_documents: int,
    arrival_known: bool,
) -> dict[str, Any]:
    """The result's scalar fields, plus how the import read the file."""
    metadata: dict[str, Any] = {
        key: value for key, value in document.items() if not isinstance(value, list | dict)
    }
    if metadata.get("request_rate") == "inf":
        metadata["request_rate"] = math.inf
    metadata.update(
        model=document.get("model_id"),
        result_index=index,
        num_results_in_file=num_documents,
        num_requests=len(arrays["ttfts"]),
        arrival_known=arrival_known,
        # Send times are the client's perf_counter readings: only differences mean anything.
        arrival_source=(
            "start_times (client send time, relative to the first request sent)"
            if arrival_known
            else "absent from the file: every arrival_s is 0"
        ),
        finish_source="latencies" if "latencies" in arrays else "ttfts + sum(itls)",
        itl_known=True,
    )
    # Time a request waited for the client's --max-concurrency semaphore before being sent.
    queue_times = _column(arrays, "queue_times", read_number, path)
    if queue_times is not None:
        metadata["client_queue_s"] = queue_times
    return metadata
