"""The servesim command line, run as a user runs it (a subprocess) where exit codes matter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from servesim.cli import app
from tests.factories import scenario_dict

runner = CliRunner()


def servesim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servesim.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_run_default_scenario_prints_the_report() -> None:
    result = runner.invoke(app, ["run"])
    assert result.exit_code == 0, result.output
    for label in ("TTFT", "TPOT", "E2E", "prefix-cache hit rate", "SLO attainment"):
        assert label in result.output


def test_run_json_and_out(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(scenario_dict()))
    out = tmp_path / "run"
    result = servesim("run", str(scenario), "--json", "--out", str(out), "--format", "csv")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["requests"]["total"] == 50
    assert json.loads((out / "summary.json").read_text()) == summary
    assert (out / "records.csv").exists() and (out / "timeseries.csv").exists()
    report = (out / "report.html").read_text()
    assert report.count('class="plotly-graph-div"') == 2  # latency CDFs, fleet over time


def test_bad_scenario_exits_2_with_one_line_per_problem_and_no_traceback(tmp_path: Path) -> None:
    data = scenario_dict(engine={"max_num_seq": 4})
    data["workload"]["arrival"]["rate"] = -3
    scenario = tmp_path / "bad.yaml"
    scenario.write_text(yaml.safe_dump(data))
    result = servesim("run", str(scenario))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "workload.arrival.rate: must be > 0, got -3" in result.stderr
    assert "engine.max_num_seq: unknown key; did you mean 'max_num_seqs'?" in result.stderr


def test_model_that_does_not_fit_is_a_clean_error(tmp_path: Path) -> None:
    scenario = tmp_path / "big.yaml"
    scenario.write_text(yaml.safe_dump(scenario_dict(model="llama-3.1-405b")))
    result = servesim("run", str(scenario))
    assert result.returncode == 2
    assert "does not fit" in result.stderr and "Traceback" not in result.stderr


def test_missing_file_and_bad_format_flag() -> None:
    result = servesim("run", "/nonexistent/scenario.yaml")
    assert result.returncode == 2 and "file not found" in result.stderr
    result = servesim("run", "--format", "xml")
    assert result.returncode == 2 and "--format" in result.stderr


def test_inspect_prints_memory_and_step_times() -> None:
    result = runner.invoke(app, ["inspect", "--model", "llama-3.1-8b", "--gpu", "h100-sxm"])
    assert result.exit_code == 0, result.output
    assert "131,072" in result.output  # KV bytes per token
    assert "decode batch 128" in result.output and "prefill 2048" in result.output
    assert "where it goes" in result.output and "GEMM fix" in result.output
    spelled = ["inspect", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--dtype", "bfloat16"]
    assert runner.invoke(app, spelled).output == result.output  # vLLM's spelling, same numbers
    assert runner.invoke(app, [*spelled[:-1], "auto"]).output == result.output
    bad = runner.invoke(app, ["inspect", "--model", "llama-9", "--gpu", "h100-sxm"])
    assert bad.exit_code == 2


def test_default_scenario_command_round_trips(tmp_path: Path) -> None:
    result = runner.invoke(app, ["default-scenario"])
    assert result.exit_code == 0
    path = tmp_path / "default.yaml"
    path.write_text(result.output)
    assert runner.invoke(app, ["check", str(path)]).exit_code == 0


def test_catalog_lists_gpus_and_models() -> None:
    result = runner.invoke(app, ["catalog"])
    assert result.exit_code == 0
    assert "h100-sxm" in result.output and "qwen2.5-72b" in result.output
    assert "a100-40gb-pcie" in result.output  # keys whole, however narrow the terminal
    assert "NVLink" in result.output and "P2P" in result.output  # H100; RTX 4090
    assert "SHARP" in result.output  # the HGX switches that reduce in the switch


def test_run_with_replications_reports_intervals_over_seeds(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    data = scenario_dict()
    data["workload"]["num_requests"] = 60
    data["workload"]["arrival"]["rate"] = 40  # queueing, so the seeds' TTFTs differ
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["run", str(path), "--json", "--replications", "3"])
    assert result.exit_code == 0, result.output
    replicated = json.loads(result.output)["replications"]
    assert replicated["seeds"] == [data.get("seed", 0) + i for i in range(3)]
    # The mean is the mean of the three seeds' own runs.
    ttft = []
    for seed in replicated["seeds"]:
        single = runner.invoke(app, ["run", str(path), "--json", "--seed", str(seed)])
        ttft.append(json.loads(single.output)["ttft_s"]["p90"])
    metric = replicated["metrics"]["ttft_p90_s"]
    assert metric["mean"] == pytest.approx(sum(ttft) / 3)
    assert metric["half_width"] > 0
    bad = runner.invoke(app, ["run", str(path), "--replications", "0"])
    assert bad.exit_code == 2 and "--replications" in bad.output


def test_a_negative_seed_is_refused_naming_the_flag(tmp_path: Path) -> None:
    # Found by benchmarks/fuzz.py: it passed check, then run said only "expected non-negative
    # integer" (numpy's words), naming neither the flag nor the fix.
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario_dict()))
    result = runner.invoke(app, ["run", str(path), "--seed", "-1"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--seed: must be >= 0, got -1" in result.output


def test_a_run_that_ends_at_time_zero_prints_its_report(tmp_path: Path) -> None:
    # Found by benchmarks/fuzz.py: every request rejected on arrival at t = 0 (too long for
    # max_model_len, no front-end delay), so no time passed and the cost per hour is None; the
    # table's format of it was a TypeError traceback.
    data = scenario_dict(latency={"type": "constant", "step_s": 0.01})
    data["workload"].update(
        {"arrival": {"type": "constant", "rate": "inf"}, "num_requests": 3},
        prompt_tokens={"type": "constant", "value": 9000},  # above max_model_len=8192
    )
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["run", str(path)])
    assert result.exit_code == 0, result.output
    assert "3 (rejected 3)" in result.output
    row = next(line for line in result.output.splitlines() if "cost (USD/hour)" in line)
    assert "—" in row
    # No request completed: its rates and latencies are undefined, null in strict JSON (NaN is
    # not JSON; a parser other than Python's refuses the whole document).
    as_json = runner.invoke(app, ["run", str(path), "--json", "--out", str(tmp_path / "o")])
    assert as_json.exit_code == 0, as_json.output

    def no_nan(constant: str) -> None:
        raise AssertionError(f"{constant} in the JSON")

    for text in (as_json.stdout, (tmp_path / "o" / "summary.json").read_text()):
        summary = json.loads(text, parse_constant=no_nan)
        assert summary["throughput"]["requests_per_s"] is None


def test_calibrate_url_takes_the_vocabulary_from_the_scenarios_model(tmp_path: Path) -> None:
    # Nothing listens on port 9: the command gets as far as the server (it no longer refuses
    # for want of --vocab-size, which it did not have), and says the server is unreachable.
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "model: llama-3.1-8b\ngpu: h100-sxm\nworkload:\n  arrival: {type: poisson, rate: 1}\n"
        "  prompt_tokens: {type: constant, value: 64}\n"
        "  output_tokens: {type: constant, value: 8}\n  num_requests: 4\n",
        encoding="utf-8",
    )
    args = ["calibrate", str(scenario), "--out", str(tmp_path / "p.json")]
    result = runner.invoke(app, [*args, "--url", "http://127.0.0.1:9", "--budget", "10s"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert "--vocab-size" not in result.output
    assert "cannot reach http://127.0.0.1:9" in result.output
    refused = runner.invoke(app, [*args, "--url", "http://127.0.0.1:9", "--vocab-size", "0"])
    assert refused.exit_code == 2 and "--vocab-size" in refused.output


def test_vocab_size_of_prefers_the_flag_then_the_scenarios_model() -> None:
    from live.cli import vocab_size_of
    from sim.scenario import parse_scenario
    from tests.factories import scenario_dict

    scenario = parse_scenario(scenario_dict())
    assert vocab_size_of(None, None, scenario) == 128256  # Llama-3.1-8B's config.json
    assert vocab_size_of(None, 1000, scenario) == 1000
