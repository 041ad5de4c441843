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

This module reads the file and decides its format; :mod:`live.import_vllm_bench` and
:mod:`live.import_guidellm` turn one run of each format into records, with the error type, the
:class:`ImportedRun` and the field readers of :mod:`live.import_fields`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from live.import_fields import BenchmarkImportError, ImportedRun, choose_index, require_object
from live.import_guidellm import import_guidellm
from live.import_vllm_bench import import_vllm_bench

ImportFormat = Literal["auto", "vllm_bench", "guidellm"]


#: Written by ``live import`` beside the records: what the source file said about the run
#: (``arrival_known`` False: the file had no send times, every ``arrival_s`` is 0).
IMPORT_META_FILE = "import.json"


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
            index = choose_index(len(documents), benchmark_index, path, "results (lines)")
            return import_vllm_bench(documents[index], path, index, len(documents))
        case "guidellm":
            if len(documents) != 1:
                raise BenchmarkImportError(
                    f"{path}: a GuideLLM report is one JSON object, but the file holds "
                    f"{len(documents)} (one per line)"
                )
            return import_guidellm(documents[0], path, benchmark_index)
        case _:
            raise AssertionError(format)


def run_labels(path: str | Path, format: ImportFormat = "auto") -> list[str]:
    """A name for each run the file holds, in file order (what ``--benchmark NAME`` matches):
    GuideLLM's strategy and rate (``constant@5``, ``synchronous``), vLLM's ``label`` or its
    request rate (``rate=5``, ``rate=inf``)."""
    path = Path(path)
    documents = _read_json_documents(path)
    if format == "auto":
        format = _detect_format(documents[0], path)
    if format == "guidellm":
        labels = []
        for benchmark in documents[0].get("benchmarks") or []:
            config = (
                (benchmark.get("config") or benchmark.get("args") or {})
                if isinstance(benchmark, dict)
                else {}
            )
            strategy = config.get("strategy") or {}
            kind, rate = strategy.get("type_") or "benchmark", strategy.get("rate")
            labels.append(f"{kind}@{rate:g}" if isinstance(rate, int | float) else str(kind))
        return labels
    return [str(d.get("label") or f"rate={d.get('request_rate', '?')}") for d in documents]


# --- reading and detection -----------------------------------------------------------------


def _read_json_documents(path: Path) -> list[dict[str, Any]]:
    """The JSON objects in the file: one, or one per line (``--append-result``)."""
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise BenchmarkImportError(f"{path}: the file is empty")
    try:
        return [require_object(json.loads(text), path, "the top level")]
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
        documents.append(require_object(value, path, f"line {line_number}"))
    return documents


def _json_error(
    path: Path, text: str, error: json.JSONDecodeError, line_offset: int
) -> BenchmarkImportError:
    """The error for JSON that stops parsing, with its position in the file and a truncation
    hint when it stopped at the end."""
    truncated = error.pos >= len(text.rstrip())
    hint = "; the file ends early (truncated?)" if truncated else ""
    return BenchmarkImportError(
        f"{path}: not valid JSON at line {error.lineno + line_offset}, column {error.colno} "
        f"(character {error.pos}): {error.msg}{hint}"
    )


def _detect_format(document: dict[str, Any], path: Path) -> Literal["vllm_bench", "guidellm"]:
    """Which tool wrote ``document``, by its top-level keys; raise when neither did."""
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


__all__: Sequence[str] = ["BenchmarkImportError", "ImportedRun", "import_records"]
