"""Importing `vllm bench serve` results and GuideLLM reports into the record schema.

The files here are hand-made but follow the writers' schemas field for field:
* vLLM 0.32 ``vllm/benchmarks/serve.py`` (``benchmark()``'s result dict and ``main_async()``'s
  ``result_json``), as written by ``--save-result --save-detailed``;
* guidellm 0.8.1 ``GenerativeBenchmarksReport.model_dump(mode="json")`` (report schema version
  2: ``guidellm/benchmark/schemas/report.py``, ``benchmark.py``;
  ``guidellm/schemas/base/request_stats.py``, ``info.py``, ``request.py``), computed fields
  included, as pydantic serializes them;
* guidellm 0.3.1 ``guidellm/benchmark/benchmark.py`` (``GenerativeTextResponseStats``, flat).

Times are binary fractions so that the expected latencies are exact.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from live.importers import BenchmarkImportError, ImportedRun, import_records, run_labels
from sim.engine.request import RECORD_COLUMNS

# --- vLLM bench serve ------------------------------------------------------------------------


def vllm_result(**overrides: Any) -> dict[str, Any]:
    """A detailed `vllm bench serve` result of three requests; the third one failed."""
    result: dict[str, Any] = {
        "date": "20250101-120000",
        "endpoint_type": "vllm",
        "backend": "vllm",
        "label": None,
        "model_id": "tiny-llama",
        "tokenizer_id": "tiny-llama",
        "num_prompts": 3,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": None,
        "duration": 1.5,
        "completed": 2,
        "failed": 1,
        "total_input_tokens": 30,
        "total_output_tokens": 6,
        "request_throughput": 1.33,
        "request_goodput": None,
        "output_throughput": 4.0,
        "total_token_throughput": 24.0,
        "input_lens": [10, 12, 8],
        "output_lens": [4, 2, 0],
        "ttfts": [0.5, 0.25, 0.0],
        "itls": [[0.125, 0.25, 0.375], [0.5], []],
        "latencies": [1.25, 0.75, 0.0],
        "start_times": [100.0, 100.25, 100.5],
        "queue_times": [0.0, 0.0, 0.0],
        "generated_texts": ["a b c d", "e f", ""],
        "errors": ["", "", "Traceback (most recent call last):\nServerDisconnectedError"],
        "max_output_tokens_per_s": 4.0,
        "max_concurrent_requests": 3,
        "rtfx": 0.0,
        "mean_ttft_ms": 375.0,
        "mean_tpot_ms": 375.0,
        "mean_itl_ms": 312.5,
    }
    result.update(overrides)
    return result


def write_json(path: Path, document: object) -> Path:
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def test_vllm_bench_rows_carry_the_files_latencies(tmp_path: Path) -> None:
    run = import_records(write_json(tmp_path / "bench.json", vllm_result()))

    assert isinstance(run, ImportedRun)
    assert run.format == "vllm_bench"
    assert run.path == str(tmp_path / "bench.json")
    frame = run.records
    assert list(frame.columns) == list(RECORD_COLUMNS)
    assert frame["request_id"].tolist() == [0, 1, 2]
    assert frame["arrival_s"].tolist() == [0.0, 0.25, 0.5]
    assert frame["prompt_tokens"].tolist() == [10, 12, 8]
    assert frame["output_tokens"].tolist() == [4, 2, 0]
    assert frame["status"].tolist() == ["ok", "ok", "error"]
    ok = frame.iloc[:2]
    assert ok["ttft_s"].tolist() == [0.5, 0.25]
    assert ok["tpot_s"].tolist() == [np.mean([0.125, 0.25, 0.375]), 0.5]
    assert ok["e2e_s"].tolist() == [1.25, 0.75]
    assert ok["first_token_s"].tolist() == [0.5, 0.5]
    assert ok["finish_s"].tolist() == [1.25, 1.0]
    assert ok["error"].tolist() == ["", ""]
    # Not observable from the client.
    assert frame["scheduled_s"].isna().all() and frame["queue_s"].isna().all()
    assert frame["replica_id"].tolist() == [-1, -1, -1]
    assert frame["cached_tokens"].tolist() == [0, 0, 0]
    assert frame["num_preemptions"].tolist() == [0, 0, 0]
    # vLLM's zeros for a failed request are not measurements.
    failed = frame.iloc[2]
    assert "ServerDisconnectedError" in failed["error"]
    assert math.isnan(failed["first_token_s"]) and math.isnan(failed["ttft_s"])
    assert run.itl_s.tolist() == [0.125, 0.25, 0.375, 0.5]
    assert run.metadata["model"] == "tiny-llama"
    assert run.metadata["backend"] == "vllm"
    assert run.metadata["request_rate"] == math.inf
    assert run.metadata["max_concurrency"] is None
    assert run.metadata["num_prompts"] == 3
    assert run.metadata["date"] == "20250101-120000"
    assert run.metadata["arrival_known"] is True
    assert run.metadata["client_queue_s"] == [0.0, 0.0, 0.0]


def test_vllm_tpot_matches_vllms_own_mean_tpot(tmp_path: Path) -> None:
    run = import_records(write_json(tmp_path / "bench.json", vllm_result()), "vllm_bench")
    ok = run.records[run.records["status"] == "ok"]
    assert 1000 * ok["tpot_s"].mean() == vllm_result()["mean_tpot_ms"]
    assert 1000 * run.itl_s.mean() == vllm_result()["mean_itl_ms"]


def test_vllm_file_without_send_times_or_latencies(tmp_path: Path) -> None:
    """Older vLLM results lack start_times and latencies: arrivals are 0, flagged unknown."""
    document = vllm_result()
    for name in ("start_times", "latencies", "queue_times"):
        del document[name]
    run = import_records(write_json(tmp_path / "old.json", document))

    frame = run.records
    assert frame["arrival_s"].tolist() == [0.0, 0.0, 0.0]
    assert run.metadata["arrival_known"] is False
    assert frame["e2e_s"].iloc[:2].tolist() == [0.5 + 0.75, 0.25 + 0.5]
    assert frame["tpot_s"].iloc[:2].tolist() == [0.25, 0.5]


def test_a_failure_without_a_message_is_still_an_error(tmp_path: Path) -> None:
    document = vllm_result(errors=["", "", ""])  # an HTTP error whose reason was empty
    frame = import_records(write_json(tmp_path / "bench.json", document)).records
    assert frame["status"].tolist() == ["ok", "ok", "error"]
    assert "output_lens is 0" in frame["error"].iloc[2]


def test_append_result_lines_need_an_index(tmp_path: Path) -> None:
    path = tmp_path / "appended.json"
    first, second = vllm_result(), vllm_result(model_id="other", input_lens=[1, 2, 3])
    path.write_text(json.dumps(first) + "\n" + json.dumps(second), encoding="utf-8")

    with pytest.raises(BenchmarkImportError, match=r"appended\.json.*2 results.*benchmark_index"):
        import_records(path)
    run = import_records(path, benchmark_index=1)
    assert run.metadata["model"] == "other"
    assert run.records["prompt_tokens"].tolist() == [1, 2, 3]
    assert run.metadata["result_index"] == 1


def test_truncated_json_names_the_file_and_position(tmp_path: Path) -> None:
    text = json.dumps(vllm_result(), indent=1)
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) // 2], encoding="utf-8")
    pattern = r"cut\.json: not valid JSON at line \d+, column \d+"
    with pytest.raises(BenchmarkImportError, match=pattern) as info:
        import_records(path)
    assert "truncated" in str(info.value)


def test_arrays_of_different_lengths_name_the_fields(tmp_path: Path) -> None:
    path = write_json(tmp_path / "bench.json", vllm_result(ttfts=[0.5, 0.25]))
    with pytest.raises(BenchmarkImportError, match=r"bench\.json.*'ttfts' has 2.*'itls' has 3"):
        import_records(path)


def test_a_bad_entry_names_the_field_and_index(tmp_path: Path) -> None:
    path = write_json(tmp_path / "bench.json", vllm_result(itls=[[0.1], "x", []]))
    with pytest.raises(BenchmarkImportError, match=r"bench\.json: field 'itls'\[1\]"):
        import_records(path)
    path = write_json(tmp_path / "lens.json", vllm_result(output_lens=[4, -2, 0]))
    with pytest.raises(BenchmarkImportError, match=r"lens\.json: field 'output_lens'\[1\]"):
        import_records(path)


def test_a_result_saved_without_details_says_how_to_get_them(tmp_path: Path) -> None:
    document = vllm_result()
    for name in ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"):
        del document[name]
    for name in ("start_times", "latencies", "queue_times"):
        del document[name]
    path = write_json(tmp_path / "summary.json", document)
    with pytest.raises(BenchmarkImportError, match=r"summary\.json.*'input_lens'.*--save-detailed"):
        import_records(path)


def test_unknown_shapes_and_empty_files(tmp_path: Path) -> None:
    path = write_json(tmp_path / "other.json", {"foo": 1, "bar": [1]})
    with pytest.raises(BenchmarkImportError, match=r"other\.json: unknown .*bar, foo"):
        import_records(path)
    path = write_json(tmp_path / "list.json", [1, 2])
    with pytest.raises(BenchmarkImportError, match=r"list\.json: the top level must be a JSON"):
        import_records(path)
    (tmp_path / "empty.json").write_text("\n", encoding="utf-8")
    with pytest.raises(BenchmarkImportError, match=r"empty\.json: the file is empty"):
        import_records(tmp_path / "empty.json")
    with pytest.raises(BenchmarkImportError, match="unknown format 'csv'"):
        import_records(path, "csv")  # type: ignore[arg-type]


# --- GuideLLM --------------------------------------------------------------------------------


def guidellm_request(
    request_id: str,
    *,
    start: float,
    first: float | None,
    last: float | None,
    end: float,
    prompt_tokens: int,
    output_tokens: int | None,
    cached_tokens: int | None = None,
    status: str = "completed",
    error: str | None = None,
) -> dict[str, Any]:
    """One ``GenerativeRequestStats`` as guidellm 0.8.1 serializes it (computed fields too)."""
    iterations = output_tokens or 0
    ttft_ms = 1000 * (first - start) if first is not None else None
    itl_ms = (
        1000 * (last - first) / (output_tokens - 1)
        if first is not None and last is not None and output_tokens and output_tokens > 1
        else None
    )
    return {
        "type_": "generative_request_stats",
        "request_id": request_id,
        "response_id": None,
        "request_args": None,
        "output": "x " * iterations if status == "completed" else None,
        "reasoning_output": None,
        "tool_calls": None,
        "info": {
            "request_id": request_id,
            "conversation_id": None,
            "status": status,
            "scheduler_node_id": 0,
            "scheduler_process_id": 0,
            "scheduler_start_time": start - 1.0,
            "timings": {
                "targeted_start": start,
                "predecessor_completed": None,
                "queued": start - 0.5,
                "dequeued": start - 0.25,
                "scheduled_at": start,
                "resolve_start": start,
                "request_start": start,
                "first_request_iteration": start,
                "first_token_iteration": first,
                "first_output_token_iteration": first,
                "last_token_iteration": last,
                "last_request_iteration": last,
                "request_iterations": iterations,
                "token_iterations": iterations,
                "request_end": end,
                "resolve_end": end,
                "finalized": end,
            },
            "settings": {"relative_timestamp": None, "requeue_delay": None},
            "error": error,
            "traceback": None,
            "started_at": start,
            "completed_at": end,
        },
        "input_metrics": {
            "text_tokens": prompt_tokens,
            "cached_tokens": cached_tokens,
            "text_words": None,
            "text_characters": None,
            "total_tokens": prompt_tokens,
        },
        "response_metrics": None,
        "output_metrics": {
            "text_tokens": output_tokens,
            "cached_tokens": None,
            "total_tokens": output_tokens,
        },
        "request_start_time": start,
        "request_end_time": end,
        "request_latency": end - start,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "output_tokens": output_tokens,
        "total_tokens": prompt_tokens + (output_tokens or 0),
        "time_to_first_token_ms": ttft_ms,
        "inter_token_latency_ms": itl_ms,
    }


def guidellm_benchmark(requests: dict[str, list[dict[str, Any]]], rate: float) -> dict[str, Any]:
    """One ``GenerativeBenchmark`` (guidellm 0.8.1), reduced to what an importer may read."""
    return {
        "type_": "generative_benchmark",
        "config": {
            "id_": "b-1",
            "run_id": "r-1",
            "run_index": 0,
            "strategy": {"type_": "constant", "rate": rate, "max_concurrency": None},
            "constraints": {},
            "sample_size": None,
            "profile": {"type_": "constant", "rate": [rate]},
            "requests": {},
            "backend": {"type_": "openai_http", "target": "http://127.0.0.1:8000", "model": "tiny"},
            "environment": {},
        },
        "scheduler_state": {},
        "scheduler_metrics": {"measure_start_time": 1000.0, "measure_end_time": 1004.0},
        "metrics": {
            "request_totals": {
                "successful": len(requests.get("successful", [])),
                "errored": len(requests.get("errored", [])),
                "incomplete": len(requests.get("incomplete", [])),
                "total": sum(len(v) for v in requests.values()),
            }
        },
        "requests": {**requests, "total": None},
        "warnings": [],
        "start_time": 1000.0,
        "end_time": 1004.0,
        "duration": 4.0,
        "warmup_duration": 0.0,
        "cooldown_duration": 0.0,
    }


def guidellm_report(*benchmarks: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {
            "version": 2,
            "guidellm_version": "0.8.1",
            "python_version": "3.11.7",
            "platform": "Linux",
        },
        "config": {"kind": "generative"},
        "benchmarks": list(benchmarks),
        "conclusions": [],
    }


def three_guidellm_requests() -> dict[str, list[dict[str, Any]]]:
    return {
        "successful": [
            guidellm_request(
                "late",
                start=1001.0,
                first=1001.5,
                last=1002.25,
                end=1002.3125,
                prompt_tokens=32,
                output_tokens=4,
                cached_tokens=16,
            ),
            guidellm_request(
                "early",
                start=1000.5,
                first=1000.75,
                last=1000.75,
                end=1000.8125,
                prompt_tokens=8,
                output_tokens=1,
            ),
        ],
        "errored": [
            guidellm_request(
                "failed",
                start=1000.0,
                first=None,
                last=None,
                end=1000.125,
                prompt_tokens=16,
                output_tokens=None,
                status="errored",
                error="HTTP 500: Internal Server Error",
            )
        ],
        "incomplete": [
            guidellm_request(
                "cut",
                start=1003.0,
                first=1003.5,
                last=1003.75,
                end=1004.0,
                prompt_tokens=16,
                output_tokens=2,
                status="cancelled",
            )
        ],
    }


def test_guidellm_report_rows_in_arrival_order(tmp_path: Path) -> None:
    report = guidellm_report(guidellm_benchmark(three_guidellm_requests(), rate=2.0))
    run = import_records(write_json(tmp_path / "benchmarks.json", report))

    assert run.format == "guidellm"
    frame = run.records
    assert list(frame.columns) == list(RECORD_COLUMNS)
    assert run.metadata["request_ids"] == ["failed", "early", "late", "cut"]
    assert frame["request_id"].tolist() == [0, 1, 2, 3]
    assert frame["arrival_s"].tolist() == [0.0, 0.5, 1.0, 3.0]
    assert frame["status"].tolist() == ["error", "ok", "ok", "cancelled"]
    assert frame["error"].tolist()[:3] == ["HTTP 500: Internal Server Error", "", ""]
    assert "incomplete" in frame["error"].iloc[3]
    assert frame["prompt_tokens"].tolist() == [16, 8, 32, 16]
    assert frame["output_tokens"].tolist() == [0, 1, 4, 2]
    assert frame["cached_tokens"].tolist() == [0, 0, 16, 0]
    late = frame.iloc[2]
    assert late["ttft_s"] == 0.5
    assert late["tpot_s"] == 0.25  # (last − first) / (4 − 1)
    assert late["e2e_s"] == 1.25  # to the last token
    assert math.isnan(frame["tpot_s"].iloc[1])  # one output token
    assert frame["scheduled_s"].isna().all()
    assert frame["replica_id"].tolist() == [-1] * 4
    assert run.itl_s.size == 0 and run.metadata["itl_known"] is False
    assert run.metadata["model"] == "tiny"
    assert run.metadata["strategy"] == "constant"
    assert run.metadata["request_rate"] == 2.0
    assert run.metadata["duration"] == 4.0
    assert run.metadata["guidellm_version"] == "0.8.1"
    assert run.metadata["time_origin_unix_s"] == 1000.0


def test_guidellm_latencies_agree_with_guidellms_own(tmp_path: Path) -> None:
    requests = three_guidellm_requests()
    report = guidellm_report(guidellm_benchmark(requests, rate=2.0))
    frame = import_records(write_json(tmp_path / "b.json", report), "guidellm").records
    by_id = dict(zip(["failed", "early", "late", "cut"], frame.itertuples(), strict=True))
    for entry in requests["successful"]:
        row = by_id[entry["request_id"]]
        assert 1000 * row.ttft_s == entry["time_to_first_token_ms"]
        if entry["inter_token_latency_ms"] is not None:
            assert 1000 * row.tpot_s == entry["inter_token_latency_ms"]


def test_guidellm_sweep_needs_a_benchmark_index(tmp_path: Path) -> None:
    slow = guidellm_benchmark(three_guidellm_requests(), rate=1.0)
    fast = guidellm_benchmark({"successful": three_guidellm_requests()["successful"]}, rate=8.0)
    path = write_json(tmp_path / "sweep.json", guidellm_report(slow, fast))
    with pytest.raises(BenchmarkImportError, match=r"sweep\.json.*2 benchmarks.*benchmark_index"):
        import_records(path)
    run = import_records(path, benchmark_index=1)
    assert run.metadata["request_rate"] == 8.0
    assert run.records["status"].tolist() == ["ok", "ok"]
    with pytest.raises(BenchmarkImportError, match="benchmark_index=2 is out of range"):
        import_records(path, benchmark_index=2)


def test_guidellm_0_3_flat_requests(tmp_path: Path) -> None:
    """guidellm 0.3.1's ``GenerativeTextResponseStats`` / ``GenerativeTextErrorStats``."""
    successful = {
        "type_": "generative_text_response",
        "request_id": "a",
        "request_type": "text_completions",
        "scheduler_info": {"requested": True, "completed": True, "errored": False},
        "prompt": "p",
        "output": "o o o",
        "prompt_tokens": 20,
        "output_tokens": 3,
        "start_time": 50.0,
        "end_time": 51.125,
        "first_token_time": 50.5,
        "last_token_time": 51.0,
        "request_latency": 1.125,
        "time_to_first_token_ms": 500.0,
        "inter_token_latency_ms": 250.0,
    }
    errored = {
        **successful,
        "type_": "generative_text_error",
        "request_id": "b",
        "start_time": 50.25,
        "end_time": 50.5,
        "first_token_time": None,
        "last_token_time": None,
        "output": None,
        "output_tokens": 0,
        "error": "timeout",
    }
    benchmark = {
        "type_": "generative_benchmark",
        "args": {"strategy": {"type_": "synchronous"}},
        "worker": {"backend_model": "m", "backend_target": "http://x", "backend_type": "openai"},
        "start_time": 49.0,
        "end_time": 52.0,
        "request_totals": {"successful": 1, "errored": 1, "incomplete": 0, "total": 2},
        "requests": {"successful": [successful], "errored": [errored], "incomplete": []},
    }
    run = import_records(write_json(tmp_path / "old.json", {"benchmarks": [benchmark]}))
    frame = run.records
    assert frame["status"].tolist() == ["ok", "error"]
    assert frame["arrival_s"].tolist() == [0.0, 0.25]
    assert frame["ttft_s"].iloc[0] == 0.5 and frame["tpot_s"].iloc[0] == 0.25
    assert frame["error"].iloc[1] == "timeout"
    assert run.metadata["model"] == "m"
    assert run.metadata["strategy"] == "synchronous"
    assert run.metadata["duration"] == 3.0
    assert run.metadata["report_schema_version"] == 1


def test_guidellm_request_without_timings_names_the_field(tmp_path: Path) -> None:
    requests = three_guidellm_requests()
    requests["successful"][1]["info"]["timings"]["first_token_iteration"] = None
    path = write_json(tmp_path / "b.json", guidellm_report(guidellm_benchmark(requests, 1.0)))
    with pytest.raises(
        BenchmarkImportError,
        match=r"b\.json: field 'benchmarks\[0\]\.requests\.successful\[1\]'.*first token",
    ):
        import_records(path)
    requests["successful"][1]["info"]["timings"]["request_start"] = "soon"
    path = write_json(tmp_path / "c.json", guidellm_report(guidellm_benchmark(requests, 1.0)))
    with pytest.raises(BenchmarkImportError, match=r"c\.json.*info\.timings\.request_start"):
        import_records(path)
    report = guidellm_report(guidellm_benchmark(three_guidellm_requests(), 1.0))
    del report["benchmarks"][0]["requests"]
    path = write_json(tmp_path / "d.json", report)
    with pytest.raises(BenchmarkImportError, match=r"d\.json: field 'benchmarks\[0\]\.requests'"):
        import_records(path)


def test_cli_picks_a_run_of_a_sweep_by_index_or_name_or_imports_all(tmp_path: Path) -> None:
    from tests.test_cli import servesim

    slow = guidellm_benchmark(three_guidellm_requests(), rate=1.0)
    fast = guidellm_benchmark({"successful": three_guidellm_requests()["successful"]}, rate=8.0)
    path = write_json(tmp_path / "sweep.json", guidellm_report(slow, fast))
    assert run_labels(path) == ["constant@1", "constant@8"]

    def imported(out: str, *flags: str) -> Any:
        return servesim("live", "import", str(path), "--out", str(tmp_path / out), *flags)

    refused = imported("none")
    assert refused.returncode == 2 and "--benchmark 0…1" in refused.stderr

    by_name = servesim(
        "live", "import", str(path), "--benchmark", "constant@8", "--out", str(tmp_path / "n")
    )
    assert by_name.returncode == 0, by_name.stderr
    meta = json.loads((tmp_path / "n" / "import.json").read_text())
    assert meta["benchmark_index"] == 1 and meta["request_rate"] == 8.0

    every = servesim(
        "live", "import", str(path), "--benchmark", "all", "--out", str(tmp_path / "a")
    )
    assert every.returncode == 0, every.stderr
    for index, rate in ((0, 1.0), (1, 8.0)):
        meta = json.loads((tmp_path / "a" / str(index) / "import.json").read_text())
        assert meta["request_rate"] == rate
        assert (tmp_path / "a" / str(index) / "records.parquet").exists()

    for bad, message in (("5", "out of range"), ("constant", "2 runs named"), ("x", "no run")):
        result = servesim(
            "live", "import", str(path), "--benchmark", bad, "--out", str(tmp_path / "b")
        )
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert "0: constant@1, 1: constant@8" in result.stderr


def test_appended_vllm_results_are_named_by_label_or_rate(tmp_path: Path) -> None:
    path = tmp_path / "appended.json"
    first, second = vllm_result(), vllm_result(label="warm", request_rate=4.0)
    path.write_text(json.dumps(first) + "\n" + json.dumps(second), encoding="utf-8")
    assert run_labels(path) == ["rate=inf", "warm"]
