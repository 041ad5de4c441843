"""The simulated fleet under vLLM's Prometheus names: parseable by the Prometheus client's own
parsers, and each number equal to what the run's records and time series say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sim.report.prometheus import TTFT_BUCKETS, openmetrics_backfill, scrape_text
from sim.run import build
from sim.scenario import parse_scenario
from tests.factories import scenario_dict

parser = pytest.importorskip("prometheus_client.parser")
om_parser = pytest.importorskip("prometheus_client.openmetrics.parser")


@pytest.fixture(scope="module")
def result() -> Any:
    data = scenario_dict(fleet={"replicas": 2}, output={"sample_interval_s": 2.0})
    return build(parse_scenario(data)).run()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_scrape_matches_the_time_series_and_records(result: Any) -> None:
    ts, records = result.timeseries, result.records
    i = len(ts) // 2
    t = ts["time_s"].iloc[i]
    got = samples(scrape_text(ts, records, i, model_name="llama-3.1-8b"))
    base = (("engine", "fleet"), ("model_name", "llama-3.1-8b"))
    assert got[("vllm:num_requests_running", base)] == ts["num_requests_running"].iloc[i]
    assert got[("vllm:num_requests_waiting", base)] == ts["num_requests_waiting"].iloc[i]
    assert got[("vllm:kv_cache_usage_perc", base)] == pytest.approx(ts["kv_cache_usage"].iloc[i])
    assert got[("servesim:num_replicas", base)] == 2
    assert got[("vllm:request_success_total", base)] == ts["num_ok"].iloc[i]
    ok = records[records["status"] == "ok"]
    seen = ok[ok["first_token_s"] <= t]
    assert got[("vllm:time_to_first_token_seconds_count", base)] == len(seen)
    assert got[("vllm:time_to_first_token_seconds_sum", base)] == pytest.approx(
        seen["ttft_s"].sum()
    )
    le = TTFT_BUCKETS[8]  # 0.25 s
    bucket = ("vllm:time_to_first_token_seconds_bucket", tuple(sorted((*base, ("le", "0.25")))))
    assert got[bucket] == (seen["ttft_s"] <= le).sum()


def test_backfill_is_valid_openmetrics_in_time_order(result: Any) -> None:
    text = openmetrics_backfill(result.timeseries, result.records, model_name="m")
    assert text.endswith("# EOF\n")
    lines = text.splitlines()[:-1]
    # Families are contiguous: each TYPE line once, its samples right after it.
    types = [line.split()[2] for line in lines if line.startswith("# TYPE")]
    assert len(types) == len(set(types)) == 11
    # Each timestamp's slice of the file is a valid OpenMetrics exposition on its own (the
    # Python client's parser checks histograms per timestamp but rejects a second timestamp
    # of the same histogram, which the format and promtool allow, so the slices go one by one).
    by_stamp: dict[str, list[str]] = {}
    headers: dict[str, list[str]] = {}
    family = ""
    for line in lines:
        if line.startswith("#"):
            family = line.split()[2]
            headers.setdefault(family, []).append(line)
            continue
        by_stamp.setdefault(line.rsplit(" ", 1)[1], []).append(f"{family}\t{line}")
    stamps = list(by_stamp)
    assert [float(t) for t in stamps] == sorted(float(t) for t in stamps)
    assert len(stamps) == len(result.timeseries)
    for stamp in (stamps[0], stamps[len(stamps) // 2], stamps[-1]):
        chunk: list[str] = []
        current = ""
        for entry in by_stamp[stamp]:
            name, line = entry.split("\t", 1)
            if name != current:
                chunk += headers[name]
                current = name
            chunk.append(line)
        families = {
            f.name: f
            for f in om_parser.text_string_to_metric_families("\n".join(chunk) + "\n# EOF\n")
        }
        assert "vllm:e2e_request_latency_seconds" in families
    # Counters never decrease, and by the last sample every output token is counted.
    tokens = [
        float(line.split()[1]) for line in lines if line.startswith("vllm:generation_tokens_total")
    ]
    assert tokens == sorted(tokens)
    assert tokens[-1] == pytest.approx(result.records["output_tokens"].sum())


def test_run_writes_metrics_om_when_asked(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from servesim.cli import app

    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(scenario_dict(output={"prometheus": True})))
    result = CliRunner().invoke(app, ["run", str(scenario), "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "run" / "metrics.om").read_text()
    assert "vllm:time_to_first_token_seconds_bucket" in text
