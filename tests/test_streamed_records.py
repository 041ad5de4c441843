"""A run that streams its records (issue 17: memory flat in the number of requests): the same
records and summary as a run that keeps them, while its percentiles are exact; sketched ones
past the limit; synthetic requests built as the run reaches them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from servesim.cli import app
from sim.build.seeds import scenario_seeds
from sim.build.workload import build_requests, request_source
from sim.engine.request import RequestStatus, shared_first_sources
from sim.report import record_sink, sketch
from sim.run import build
from sim.scenario import parse_scenario
from sim.simulation import RecordsStreamedError, SimResult
from sim.workload.generate import SyntheticRequests
from tests.factories import scenario_dict

WORKLOADS: dict[str, dict[str, Any]] = {
    "shared prefixes": {
        "arrival": {"type": "poisson", "rate": 30},
        "prompt_tokens": {"type": "lognormal", "mean": 400, "p90": 900, "max_tokens": 4000},
        "output_tokens": {"type": "lognormal", "mean": 120, "p90": 250, "max_tokens": 1000},
        "prefix": {"type": "shared", "num_groups": 3, "prefix_tokens": 256, "share": 0.7},
        "num_requests": 400,
    },
    "multi-turn, closed loop": {
        "arrival": {"type": "poisson", "rate": 4},
        "prompt_tokens": {"type": "constant", "value": 200},
        "output_tokens": {"type": "constant", "value": 40},
        "prefix": {
            "type": "multi_turn",
            "turns": {"type": "constant", "value": 3},
            "think_time_s": 2.0,
        },
        "max_concurrency": 8,
        "num_requests": 150,
    },
}


def runs(workload: dict[str, Any], tmp_path: Path, **sections: Any) -> tuple[SimResult, SimResult]:
    """The same scenario run keeping its records and streaming them to ``tmp_path``."""
    data = scenario_dict(workload=workload, **sections)
    kept = build(parse_scenario(data)).run()
    streamed = build(parse_scenario(data)).run(stream=True, out_dir=tmp_path)
    return kept, streamed


def assert_same_summary(streamed: dict[str, Any], kept: dict[str, Any]) -> None:
    """Equal but for the wall time, and means summed in another order (the last bits)."""

    def close(a: Any, b: Any, where: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            assert set(a) == set(b), where
            for key in a:
                if (where, key) != ("sim", "wall_s"):
                    close(a[key], b[key], key)
        elif isinstance(a, float) and isinstance(b, float):
            assert a == pytest.approx(b, rel=1e-12, nan_ok=True), where
        else:
            assert a == b, where

    close(streamed, kept, "")


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_streamed_records_and_summary_equal_kept_ones(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(record_sink, "CHUNK_RECORDS", 37)  # many chunks, one partly full
    kept, streamed = runs(WORKLOADS[name], tmp_path)
    assert_same_summary(streamed.summary, kept.summary)
    assert streamed.records_path == tmp_path / "records.parquet"
    on_disk = pd.read_parquet(tmp_path / "records.parquet")
    assert on_disk["request_id"].is_unique
    on_disk = on_disk.sort_values("request_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(on_disk, kept.records)
    with pytest.raises(RecordsStreamedError, match=r"records\.parquet"):
        _ = streamed.records


def test_a_stopped_streamed_run_still_writes_a_record_for_every_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Overloaded, stopped by the waiting-queue bound: requests in flight, queued at the
    # client, thinking between turns and never reached all end cancelled, each once.
    monkeypatch.setattr(record_sink, "CHUNK_RECORDS", 25)
    workload = {
        **WORKLOADS["multi-turn, closed loop"],
        "arrival": {"type": "poisson", "rate": 200},
        "max_concurrency": 40,
        "num_requests": 300,
    }
    simulator = {"max_simulated_s": 3.0}
    kept, streamed = runs(workload, tmp_path, simulator=simulator)
    records = kept.records
    assert len(records) == 300 and records["request_id"].is_unique
    statuses = set(records["status"])
    assert RequestStatus.CANCELLED.value in statuses and RequestStatus.OK.value in statuses
    assert_same_summary(streamed.summary, kept.summary)
    on_disk = pd.read_parquet(tmp_path / "records.parquet").sort_values("request_id")
    pd.testing.assert_frame_equal(on_disk.reset_index(drop=True), records)


def test_past_the_exact_limit_the_summary_comes_from_t_digests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(record_sink, "CHUNK_RECORDS", 50)
    monkeypatch.setattr(sketch, "EXACT_LIMIT", 120)
    kept, streamed = runs(WORKLOADS["shared prefixes"], tmp_path)
    assert kept.summary["sim"]["percentiles"] == "exact"
    assert streamed.summary["sim"]["percentiles"] == "t-digest"
    for metric in ("ttft_s", "tpot_s", "e2e_s", "itl_s"):
        exact, sketched = kept.summary[metric], streamed.summary[metric]
        assert sketched["mean"] == pytest.approx(exact["mean"], rel=1e-9), metric
        for key in ("p50", "p90"):
            if metric == "itl_s":  # not a column of the records: run-length encoded steps
                assert sketched[key] == pytest.approx(exact[key], rel=0.05)
                continue
            values = np.sort(kept.records[metric].dropna().to_numpy())
            rank = np.searchsorted(values, sketched[key]) / values.size
            assert abs(rank - float(key[1:]) / 100) <= 0.02, (metric, key)
    for section in ("throughput", "goodput", "requests", "prefix_cache", "stability"):
        assert streamed.summary[section] == pytest.approx(kept.summary[section]), section


def test_a_streamed_run_without_a_directory_keeps_only_its_summary() -> None:
    data = scenario_dict()
    result = build(parse_scenario(data)).run(stream=True)
    assert result.records_path is None and result.summary["requests"]["ok"] == 50
    with pytest.raises(RecordsStreamedError, match="not kept"):
        _ = result.records


def test_synthetic_requests_are_built_when_read_and_equal_the_generated_ones() -> None:
    scenario = parse_scenario(scenario_dict(workload=WORKLOADS["shared prefixes"]))
    lazy = request_source(scenario.workload, scenario_seeds(scenario)[0])
    assert isinstance(lazy, SyntheticRequests)
    eager = build_requests(scenario.workload, scenario_seeds(scenario)[0])
    assert list(lazy) == eager
    assert lazy[-1] == eager[-1] and lazy[10:13] == eager[10:13]
    assert lazy.shared_first_sources() == shared_first_sources(eager)
    assert lazy.last_arrival_s == eager[-1].arrival_s
    with pytest.raises(IndexError):
        _ = lazy[len(eager)]
    # Sessions and traces are still built up front.
    sessions = parse_scenario(scenario_dict(workload=WORKLOADS["multi-turn, closed loop"]))
    assert isinstance(request_source(sessions.workload, scenario_seeds(sessions)[0]), list)


def test_the_cli_streams_records_and_says_what_it_leaves_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "model: llama-3.1-8b\ngpu: h100-sxm\nworkload:\n  arrival: {type: poisson, rate: 5}\n"
        "  prompt_tokens: {type: constant, value: 100}\n"
        "  output_tokens: {type: constant, value: 10}\n  num_requests: 30\n"
    )
    out = tmp_path / "out"
    runner = CliRunner()
    result = runner.invoke(app, ["run", str(scenario), "--records", "stream", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert len(pd.read_parquet(out / "records.parquet")) == 30
    assert (out / "summary.json").exists() and not (out / "report.html").exists()
    assert "records streamed" in result.output
    assert "t-digest" not in result.output  # 30 requests: exact percentiles
    monkeypatch.setattr(sketch, "EXACT_LIMIT", 10)
    sketched = runner.invoke(app, ["run", str(scenario), "--records", "stream"])
    assert sketched.exit_code == 0 and "t-digest (rank error" in sketched.output
    bad = runner.invoke(app, ["run", str(scenario), "--records", "sometimes"])
    assert bad.exit_code == 2 and "--records" in bad.output
    refused = runner.invoke(
        app, ["run", str(scenario), "--records", "stream", "--format", "vllm-bench"]
    )
    assert refused.exit_code == 2 and "--records keep" in refused.output
