"""``servesim run --format vllm-bench``: vLLM's result keys, computed from the run's records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from sim.report.vllm_bench import vllm_bench_result
from sim.run import build
from sim.scenario import parse_scenario
from tests.factories import scenario_dict
from tests.test_cli import servesim

#: The summary keys ``vllm bench serve`` writes with its defaults (vllm/benchmarks/serve.py:
#: ``benchmark()``'s result, then ``process_one_metric`` for ttft, tpot and itl at p99).
VLLM_KEYS = {
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "model_id",
    "num_prompts",
    *(f"{s}_{m}_ms" for s in ("mean", "median", "std", "p99") for m in ("ttft", "tpot", "itl")),
}


def test_the_document_has_vllms_keys_and_the_runs_numbers() -> None:
    result = build(parse_scenario(scenario_dict())).run()
    summary = result.summary
    document = vllm_bench_result(
        result.records,
        itl=summary["itl_s"],
        goodput_requests_per_s=summary["goodput"]["requests_per_s"],
        model_id="llama-3.1-8b",
        request_rate=5.0,
    )
    assert set(document) >= VLLM_KEYS
    assert document["mean_ttft_ms"] == pytest.approx(summary["ttft_s"]["mean"] * 1e3)
    assert document["p99_tpot_ms"] == pytest.approx(summary["tpot_s"]["p99"] * 1e3)
    assert document["median_e2el_ms"] == pytest.approx(summary["e2e_s"]["p50"] * 1e3)
    assert document["completed"] == summary["requests"]["ok"] == 50
    ok = result.records
    assert document["std_ttft_ms"] == pytest.approx(np.std(ok["ttft_s"]) * 1e3)
    assert document["request_throughput"] == pytest.approx(summary["throughput"]["requests_per_s"])


def test_cli_writes_and_prints_it_with_the_chosen_percentiles(tmp_path: Path) -> None:
    data = scenario_dict()
    data["workload"]["arrival"] = {"type": "poisson", "rate": "inf"}
    data["workload"]["max_concurrency"] = 4
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    args = ["run", str(scenario), "--format", "vllm-bench", "--percentiles", "90,99.9"]
    result = servesim(*args, "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed == json.loads((out / "vllm_bench.json").read_text()) | {"date": printed["date"]}
    assert {"p90_ttft_ms", "p99.9_ttft_ms", "p99.9_itl_ms"} <= set(printed)
    assert printed["request_rate"] == "inf" and printed["max_concurrency"] == 4
    assert (out / "records.parquet").exists()


@pytest.mark.parametrize(
    ("value", "message"),
    [("50,abc", "is not a number"), ("100", "between 0 and 100"), ("0", "between 0 and 100")],
)
def test_bad_percentiles_exit_2(value: str, message: str) -> None:
    result = servesim("run", "--percentiles", value)
    assert result.returncode == 2 and "--percentiles" in result.stderr
    assert message in result.stderr


def test_chosen_percentiles_join_the_summary() -> None:
    data = scenario_dict()
    data["output"] = {"percentiles": [99.9, 75]}
    summary = build(parse_scenario(data)).run().summary
    assert list(summary["ttft_s"]) == ["mean", "p50", "p75", "p90", "p95", "p99", "p99.9"]
    assert summary["throughput"]["output_tokens_per_s_per_gpu"] > 0
    assert summary["throughput"]["output_tokens_per_s_per_user"] == pytest.approx(
        float(np.mean(1 / build(parse_scenario(data)).run().records["tpot_s"]))
    )
