"""Sweeps: grids of overrides × seeds, in processes or in one, into one table with intervals."""

from __future__ import annotations

import json
import math
import operator
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from sim.planning.parallel import collect, run_all
from sim.planning.sweep import confidence_intervals, load_sweep, parse_sweep, run_sweep, write_table
from tests.factories import scenario_dict


def base() -> dict[str, Any]:
    data = scenario_dict()
    data["workload"]["num_requests"] = 120
    return data


def test_a_grid_is_every_combination_times_every_seed() -> None:
    sweep = parse_sweep(
        {
            "base": base(),
            "grid": {"fleet.replicas": [1, 2, 3], "workload.arrival.rate": [5, 10]},
            "seeds": [0, 1],
        }
    )
    assert len(sweep.runs) == 12
    assert sweep.parameters == ("fleet.replicas", "workload.arrival.rate")
    assert {run.seed for run in sweep.runs} == {0, 1}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"base": {}, "grid": {"a": [1]}, "extra": 1}, "unknown keys"),
        ({"base": {}, "grid": {"a": [1]}, "runs": [{"a": 1}]}, "exactly one of grid"),
        ({"base": {}, "grid": {"a": []}}, "sweep.grid"),
        ({"base": {}, "runs": [{"a": 1}], "seeds": []}, "sweep.seeds"),
        ({"base": 3, "runs": [{"a": 1}]}, "sweep.base"),
    ],
)
def test_bad_sweeps_name_the_field(document: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_sweep(document)


def test_a_sweep_file_that_cannot_be_read_is_named_with_its_problem(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(ValueError, match=r"nowhere\.yaml: cannot read the sweep: file not found"):
        load_sweep(missing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("grid: [1, 2\nseeds: [0]\n")
    with pytest.raises(ValueError, match=r"broken\.yaml: cannot read the sweep: not valid YAML at"):
        load_sweep(broken)
    no_base = tmp_path / "no_base.yaml"
    no_base.write_text("base: absent.yaml\nruns: [{dtype: fp8}]\n")
    with pytest.raises(ValueError, match=r"sweep\.base: cannot read .*absent\.yaml: file not"):
        load_sweep(no_base)


@pytest.mark.parametrize("workers", [1, 3])
def test_run_all_keeps_the_items_order_and_counts_progress(workers: int) -> None:
    seen: list[tuple[int, int]] = []
    items = list(range(10))
    results = run_all(
        operator.sub, 100, items, workers=workers, progress=lambda d, t: seen.append((d, t))
    )
    assert results == [100 - i for i in items]
    assert seen == [(done, 10) for done in range(1, 11)]
    assert run_all(operator.sub, 1, [], workers=workers) == []


def test_collect_waits_in_order_and_lets_an_error_through() -> None:
    seen: list[int] = []
    assert collect(["a", "bb"], len, lambda done, total: seen.append(done)) == [1, 2]
    assert seen == [1, 2]
    with pytest.raises(ZeroDivisionError):
        run_all(operator.truediv, 1, [1, 0, 2], workers=2)


def test_run_sweep_reports_each_run() -> None:
    sweep = parse_sweep({"base": base(), "runs": [{"fleet.replicas": 1}], "seeds": [0, 1]})
    seen: list[tuple[int, int]] = []
    run_sweep(sweep, workers=1, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 2), (2, 2)]


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    sweep = parse_sweep({"base": base(), "grid": {"fleet.replicas": [1, 2]}, "seeds": [0, 1, 2]})
    return run_sweep(sweep, workers=2)


def test_processes_and_one_process_give_the_same_table(table: pd.DataFrame) -> None:
    sweep = parse_sweep({"base": base(), "grid": {"fleet.replicas": [1, 2]}, "seeds": [0, 1, 2]})
    pd.testing.assert_frame_equal(table, run_sweep(sweep, workers=1))
    assert list(table.columns[:3]) == ["fleet.replicas", "seed", "error"]
    assert (table["error"] == "").all() and len(table) == 6


def test_confidence_intervals_over_seeds(table: pd.DataFrame) -> None:
    intervals = confidence_intervals(table)
    assert list(intervals["fleet.replicas"]) == [1, 2]
    assert (intervals["replications"] == 3).all()
    for _, row in intervals.iterrows():
        values = table[table["fleet.replicas"] == row["fleet.replicas"]]
        assert row["ttft_p90_s"] == pytest.approx(values["ttft_p90_s"].mean())
        # Seeds move the arrivals, so throughput varies; with two idle replicas and fixed
        # lengths TTFT p90 may not (then its interval is 0, not NaN).
        assert 0 < row["output_tokens_per_s_ci"] < math.inf
        assert 0 <= row["ttft_p90_s_ci"] < math.inf
    single = confidence_intervals(table[table["seed"] == 0])
    assert single["ttft_p90_s_ci"].isna().all()


def test_a_run_that_cannot_run_is_a_row_with_its_error() -> None:
    sweep = parse_sweep({"base": base(), "runs": [{"fleet.replicas": 0}, {"fleet.replicas": 1}]})
    result = run_sweep(sweep, workers=1)
    assert "fleet.replicas" in result.loc[0, "error"]
    assert result.loc[1, "error"] == "" and result.loc[1, "ttft_p90_s"] > 0


def test_the_sweep_command(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(base()))
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(
        yaml.safe_dump({"base": "s.yaml", "grid": {"dtype": ["bf16", "fp8"]}, "seeds": [1, 2]})
    )
    assert len(load_sweep(sweep_file).runs) == 4
    out = tmp_path / "out.parquet"
    result = subprocess.run(
        [sys.executable, "-m", "servesim.cli", "sweep", str(sweep_file), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    written = pd.read_parquet(out)
    assert list(written["dtype"]) == ["bf16", "bf16", "fp8", "fp8"]
    assert "TTFT p90" in result.stdout and "±" in result.stdout
    assert 'class="plotly-graph-div"' in out.with_suffix(".html").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: s.yaml\n")
    refused = subprocess.run(
        [sys.executable, "-m", "servesim.cli", "sweep", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2 and "exactly one of grid" in refused.stderr


def test_write_table_keeps_mixed_override_types(tmp_path: Path) -> None:
    frame = pd.DataFrame({"x": [1, "a"], "seed": [0, 0], "error": ["", ""]})
    path = write_table(frame, tmp_path / "t.parquet")
    assert list(pd.read_parquet(path)["x"]) == ["1", "a"]


def test_the_plan_command(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(base()))
    args = ["plan", str(scenario), "--gpus", "h100-sxm,l40s", "--tp", "1", "--dtypes", "bf16"]
    result = subprocess.run(
        [sys.executable, "-m", "servesim.cli", *args, "--max-replicas", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "cheapest meeting the SLOs: 1× h100-sxm TP1 bf16" in result.stdout
    assert "cannot run 1× l40s TP1 bf16: no price for L40S" in result.stdout


def assert_each_run_streamed_its_records(with_records: pd.DataFrame, table: pd.DataFrame) -> None:
    """The same table plus a ``records`` column naming each run's own file of 120 records."""
    pd.testing.assert_frame_equal(with_records.drop(columns="records"), table)
    paths = list(with_records["records"])
    assert len(set(paths)) == len(paths)
    for path in paths:
        records = pd.read_parquet(path)
        assert len(records) == 120 and records["request_id"].is_unique


def test_each_worker_streams_its_runs_records(table: pd.DataFrame, tmp_path: Path) -> None:
    sweep = parse_sweep({"base": base(), "grid": {"fleet.replicas": [1, 2]}, "seeds": [0, 1, 2]})
    with_records = run_sweep(sweep, workers=2, records_dir=tmp_path)
    assert_each_run_streamed_its_records(with_records, table)
    assert with_records.loc[5, "records"] == str(tmp_path / "run-0005" / "records.parquet")
    intervals = confidence_intervals(with_records)  # the paths are not a parameter
    assert list(intervals["replications"]) == [3, 3]


def test_local_ray_gives_the_same_table(table: pd.DataFrame, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    sweep = parse_sweep({"base": base(), "grid": {"fleet.replicas": [1, 2]}, "seeds": [0, 1, 2]})
    on_ray = run_sweep(sweep, executor="ray", ray_address="local", records_dir=tmp_path)
    assert_each_run_streamed_its_records(on_ray, table)


def plan_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servesim.cli", "plan", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_plan_takes_slos_and_rate_on_the_command_line_and_writes_json(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(base()))
    grid_args = ["--gpus", "h100-sxm", "--tp", "1", "--dtypes", "bf16", "--max-replicas", "2"]
    flags = ["--ttft-ms", "250", "--e2e-ms", "5000", "--percentile", "95", "--rate", "7"]
    out = tmp_path / "plan"
    result = plan_cli(str(scenario), *grid_args, *flags, "--json", "--out", str(out))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["slo"] == {"ttft_s": 0.25, "tpot_s": 0.05, "percentile": 95.0, "e2e_s": 5.0}
    assert document["rate_rps"] == 7.0
    assert document["cheapest"]["label"] == "1× h100-sxm TP1 bf16"
    assert [c["label"] for c in document["candidates"]] == [
        "1× h100-sxm TP1 bf16",
        "2× h100-sxm TP1 bf16",
    ]
    assert json.loads((out / "plan.json").read_text()) == document
    assert len(pd.read_csv(out / "candidates.csv")) == 2
    assert "1× h100-sxm TP1 bf16" in (out / "report.html").read_text()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ttft-ms", "0"], "--ttft-ms: must be > 0"),
        (["--percentile", "120"], "--percentile: must be in (0, 100]"),
        (["--rate", "-1"], "--rate: must be > 0"),
    ],
)
def test_bad_plan_flags_exit_2_naming_the_flag(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(base()))
    result = plan_cli(str(scenario), "--gpus", "h100-sxm", "--tp", "1", *flags)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_replications_report_each_seed() -> None:
    from sim.planning.sweep import replications

    data = scenario_dict(
        workload={
            "arrival": {"type": "poisson", "rate": 5},
            "prompt_tokens": {"type": "constant", "value": 100},
            "output_tokens": {"type": "constant", "value": 10},
            "num_requests": 20,
        }
    )
    calls: list[tuple[int, int]] = []
    result = replications(data, 3, workers=1, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(1, 3), (2, 3), (3, 3)]
    assert result["seeds"] == [data["seed"] + i for i in range(3)]
